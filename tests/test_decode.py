"""Beam search: scripted cases (EOS, length penalty, maximum length), and n-best lists against a\ntranscription of fairseq 0.12.2's SequenceGenerator on random decoders."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.evaluation.decode import beam_search

V, EOS, PAD, BOS = 6, 2, 1, 0


def scripted(table):
  """step_fn whose log-probs depend on (step, previous token) via `table` [steps, V, V]; the
  cache records the tokens seen, so cache reordering is exercised too."""
  with np.errstate(divide="ignore"):
    table = jnp.asarray(np.log(np.asarray(table, np.float32)))   # impossible tokens: -inf

  def step_fn(tokens, i, cache):
    logits = table[i][tokens[:, 0]]                     # [n, V]
    cache = cache.at[:, i].set(tokens[:, 0])
    return logits, cache
  return step_fn


def probs(rows):
  """rows: {previous token: {next token: p}} -> [V, V] table (unlisted mass on token 5)."""
  t = np.zeros((V, V))
  for prev in range(V):
    dist = rows.get(prev, {5: 1.0})
    for tok, p in dist.items():
      t[prev, tok] = p
  return t


def run(table, beam=2, max_len=5, lenpen=1.0, batch=1):
  steps = len(table)
  cache = jnp.zeros((batch * beam, steps), jnp.int32)
  tokens, scores = jax.jit(lambda c: beam_search(
      scripted(table), c, batch, beam, steps, jnp.full((batch,), max_len), V, EOS, PAD, BOS,
      lenpen))(cache)
  return np.asarray(tokens), np.asarray(scores)


def test_prefers_the_likelier_finished_hypothesis_and_strips_eos():
  # step 0 (after start token EOS): 3 (0.6) or 4 (0.4); then 3 -> EOS (0.5) / 5, 4 -> EOS (0.9)
  table = [probs({EOS: {3: 0.6, 4: 0.4}}),
           probs({3: {EOS: 0.5, 5: 0.5}, 4: {EOS: 0.9, 5: 0.1}}),
           probs({5: {EOS: 1.0}})] + [probs({})] * 3
  tokens, scores = run(table, lenpen=0.0)
  # [4, EOS]: 0.4 * 0.9 = 0.36 > [3, EOS]: 0.3 > [3, 5, EOS]: 0.3
  assert tokens[0].tolist()[:3] == [4, PAD, PAD]
  np.testing.assert_allclose(scores[0], np.log(0.36), atol=1e-5)


def test_length_penalty_trades_length_for_probability():
  # Short: [3, EOS] p = 0.5 * 0.8 = 0.4 (len 2); long: [4, 5, EOS] p = 0.5 * 1 * 0.6 (len 3).
  # Each EOS is among the top `beam` candidates of its step, so both are finalised.
  table = [probs({EOS: {3: 0.5, 4: 0.5}}),
           probs({3: {EOS: 0.8, 5: 0.2}, 4: {5: 1.0}}),
           probs({5: {EOS: 0.6, 3: 0.4}})] + [probs({})] * 3
  short, _ = run(table, beam=2, lenpen=0.0)
  long, _ = run(table, beam=2, lenpen=1.0)
  assert short[0].tolist()[:2] == [3, PAD]       # log 0.4 = -0.92 > log 0.3 = -1.20
  assert long[0].tolist()[:3] == [4, 5, PAD]     # -1.20 / 3 = -0.40 > -0.92 / 2 = -0.46


def test_eos_is_forced_after_max_len_and_never_first():
  keep_going = {3: {3: 0.98, 4: 0.015, EOS: 0.005}, 4: {4: 0.98, 3: 0.015, EOS: 0.005}}
  table = [probs({EOS: {EOS: 0.9, 3: 0.1}})] + [probs(keep_going)] * 9
  tokens, _ = run(table, beam=1, max_len=4)
  n = int((tokens[0] != PAD).sum())
  assert n == 4 and tokens[0][0] != EOS           # max_len tokens, then the forced EOS


def test_batched_utterances_are_independent():
  table = [probs({EOS: {3: 0.6, 4: 0.4}}),
           probs({3: {EOS: 0.5, 5: 0.5}, 4: {EOS: 0.9, 5: 0.1}}),
           probs({5: {EOS: 1.0}})] + [probs({})] * 3
  single, _ = run(table, lenpen=0.0)
  batched, _ = run(table, lenpen=0.0, batch=3)
  for row in batched:
    np.testing.assert_array_equal(row, single[0])


# --- against a transcription of fairseq 0.12.2's SequenceGenerator (tests/fairseq_beam_reference)

from tests import fairseq_beam_reference as fairseq  # noqa: E402

HASH_ROWS = 4093


class HashedPrefixDecoder:
  """A random 'decoder' whose log-probabilities are a fixed random table row chosen by a hash of
  the utterance and the whole token prefix, plus an EOS bonus growing with the step, so that
  hypotheses end at different steps. The JAX step function carries the hash in its cache (so
  the search's cache reordering is exercised); the numpy side recomputes it from the prefix."""

  def __init__(self, seed: int, batch: int, vocab: int, eos_slope: float = 0.5):
    rng = np.random.default_rng(seed)
    self.table = (rng.normal(size=(HASH_ROWS, vocab)) * 2.0).astype(np.float32)
    self.start = rng.integers(0, HASH_ROWS, size=batch)
    self.eos_slope, self.eos_offset = eos_slope, float(rng.uniform(2, 5))

  def eos_bonus(self, step):
    return self.eos_slope * (step - self.eos_offset)

  def numpy_lprobs(self, tokens, sentences):            # tokens [n, step + 1]
    h = self.start[sentences]
    for t in range(tokens.shape[1]):
      h = (h * 31 + tokens[:, t] + 1) % HASH_ROWS
    logits = self.table[h].astype(np.float64)
    logits[:, EOS] += self.eos_bonus(tokens.shape[1] - 1)
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

  def jax_step(self, beam):
    table = jnp.asarray(self.table)

    def step_fn(tokens, i, cache):
      h = (cache * 31 + tokens[:, 0] + 1) % HASH_ROWS
      logits = table[h].at[:, EOS].add(self.eos_bonus(i))
      return logits, h
    return step_fn, jnp.asarray(np.repeat(self.start, beam), jnp.int32)


def search_both(seed, beam, max_len, lenpen=1.0, batch=4, vocab=16, min_len=1, unk_penalty=0.0,
                prefix=None, eos_slope=0.5, no_repeat=0, model=None):
  """(ours, fairseq's): n-best lists per utterance as (tokens without EOS, score)."""
  model = model or HashedPrefixDecoder(seed, batch, vocab, eos_slope)
  step_fn, cache = model.jax_step(beam)
  max_lens = np.asarray(max_len if np.ndim(max_len) else [max_len] * batch)
  max_steps = int(max_lens.max()) + 1
  tokens, scores = jax.jit(lambda c: beam_search(
      step_fn, c, batch, beam, max_steps, jnp.asarray(max_lens), vocab, EOS, PAD, BOS, lenpen,
      None if prefix is None else jnp.asarray(prefix), min_len=min_len, unk_penalty=unk_penalty,
      nbest=True, no_repeat_ngram_size=no_repeat))(cache)
  ours = []
  for row_tokens, row_scores in zip(np.asarray(tokens), np.asarray(scores)):
    ours.append([(row_tokens[k][row_tokens[k] != PAD].tolist(), float(row_scores[k]))
                 for k in range(beam) if np.isfinite(row_scores[k])])
  finalized = fairseq.generate(
      model.numpy_lprobs, batch, beam, vocab, max_len, eos=EOS, pad=PAD, unk=3,
      min_len=min_len, len_penalty=lenpen, unk_penalty=unk_penalty, prefix_tokens=prefix,
      never_select=(BOS,), no_repeat_ngram_size=no_repeat)
  theirs = [[(h["tokens"][:-1].tolist(), h["score"]) for h in hypos] for hypos in finalized]
  return ours, theirs


def assert_same_nbest(ours, theirs):
  for utterance, (mine, ref) in enumerate(zip(ours, theirs)):
    assert [t for t, _ in mine] == [t for t, _ in ref], f"utterance {utterance}"
    np.testing.assert_allclose([s for _, s in mine], [s for _, s in ref], atol=1e-5,
                               err_msg=f"utterance {utterance}")


@pytest.mark.parametrize("beam,lenpen,max_len", [
    (1, 1.0, 12), (1, 0.0, 5), (2, 1.0, 12), (2, 0.5, 3), (5, 1.0, 12), (5, 0.0, 12),
    (5, 2.0, 7), (3, 1.0, 1)])
def test_matches_fairseq_sequence_generator(beam, lenpen, max_len):
  for seed in range(3):
    ours, theirs = search_both(seed, beam, max_len, lenpen)
    assert_same_nbest(ours, theirs)


def test_matches_fairseq_with_min_len_unk_penalty_and_per_utterance_max_len():
  for seed in range(3):
    assert_same_nbest(*search_both(seed, 3, 10, min_len=4, eos_slope=1.0))
    assert_same_nbest(*search_both(seed, 2, 10, unk_penalty=1.5))
    assert_same_nbest(*search_both(seed, 2, [4, 9, 2, 12]))


def test_matches_fairseq_with_prefix_tokens():
  prefix = np.array([[5, 7], [9, PAD], [4, 4], [6, 8]])       # pad: this step is free
  for seed in range(3):
    ours, theirs = search_both(seed, 2, 10, prefix=prefix)
    assert_same_nbest(ours, theirs)
    assert all(h[0][:2] == [5, 7] for h in theirs[0])
  single, theirs = search_both(0, 2, 10, prefix=prefix[:, 0])
  assert_same_nbest(single, theirs)


class LoopingDecoder(HashedPrefixDecoder):
  """A first-order decoder that prefers the cycle 4 -> 5 -> 6 -> 4 (plus noise per utterance):
  unblocked, its hypotheses repeat the cycle's n-grams until EOS wins."""

  def __init__(self, seed: int, batch: int, vocab: int):
    super().__init__(seed, batch, vocab, eos_slope=0.3)
    rng = np.random.default_rng(seed)
    self.bigram = rng.normal(size=(batch, vocab, vocab)).astype(np.float32)
    for a, b in ((4, 5), (5, 6), (6, 4), (EOS, 4)):
      self.bigram[:, a, b] += 4.0

  def numpy_lprobs(self, tokens, sentences):
    logits = self.bigram[sentences, tokens[:, -1]].astype(np.float64)
    logits[:, EOS] += self.eos_bonus(tokens.shape[1] - 1)
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

  def jax_step(self, beam):
    bigram = jnp.asarray(np.repeat(self.bigram, beam, axis=0))        # [batch * beam, V, V]

    def step_fn(tokens, i, cache):
      logits = bigram[cache, tokens[:, 0]].at[:, EOS].add(self.eos_bonus(i))
      return logits, cache
    return step_fn, jnp.arange(bigram.shape[0])


def _ngrams(tokens, n):
  """The n-grams of a hypothesis after the start token EOS, as fairseq's block sees them."""
  row = [EOS] + tokens
  return [tuple(row[j:j + n]) for j in range(len(row) - n + 1)]


@pytest.mark.parametrize("no_repeat", [2, 3])
def test_matches_fairseq_with_repeated_ngrams_blocked(no_repeat):
  for seed in range(3):
    for model in (None, LoopingDecoder(seed, 4, 10)):
      ours, theirs = search_both(seed, 3, 14, vocab=10, no_repeat=no_repeat, model=model)
      assert_same_nbest(ours, theirs)
      for hypos in ours:
        for tokens, _ in hypos:
          assert len(_ngrams(tokens, no_repeat)) == len(set(_ngrams(tokens, no_repeat))), tokens
  unblocked, _ = search_both(0, 3, 14, vocab=10, model=LoopingDecoder(0, 4, 10))
  best = [hypos[0][0] for hypos in unblocked]
  assert all(len(set(_ngrams(t, 3))) < len(_ngrams(t, 3)) for t in best), best  # loops


def test_a_repeat_block_of_one_token_is_refused():
  with pytest.raises(ValueError, match=r"no_repeat_ngram_size 1: valid values are 0 \(off\) "
                                       r"or an n-gram length >= 2"):
    beam_search(None, None, 1, 2, 4, jnp.array([3]), V, no_repeat_ngram_size=1)


def test_eos_outside_the_top_beam_is_not_finalised():
  # beam 1: token 3 (p 0.6) beats EOS (p 0.4) after 4; then 3 -> EOS. Finalising the runner-up
  # EOS would end the search at [4] with score log(0.5 * 0.4).
  table = [probs({EOS: {4: 0.5, 5: 0.5}}),
           probs({4: {3: 0.6, EOS: 0.4}, 5: {3: 0.6, EOS: 0.4}}),
           probs({3: {EOS: 1.0}})] + [probs({})] * 3
  tokens, scores = run(table, beam=1, lenpen=0.0)
  assert tokens[0].tolist()[:3] == [4, 3, PAD]
  np.testing.assert_allclose(scores[0], np.log(0.5 * 0.6), atol=1e-5)


def test_beam_larger_than_the_vocabulary_allows_is_refused():
  with pytest.raises(ValueError, match=r"beam 3 needs a vocabulary of at least 7"):
    run([probs({})] * 3, beam=3)
