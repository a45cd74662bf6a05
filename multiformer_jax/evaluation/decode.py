"""Beam search with fairseq's `SequenceGenerator` semantics over a cached `step_fn`.

step_fn(tokens [n, 1], index, cache) -> (logits [n, vocab], cache) for n = batch * beam
hypotheses (row b * beam + k is beam k of utterance b). The search follows fairseq 0.12.2's
`SequenceGenerator._generate` with `search.BeamSearch`, step for step:

- every step takes the best 2 * beam candidates over beam x vocab (at step 0 only beam 0, all
  beams being equal); candidate scores are sums of natural-log probabilities;
- an EOS candidate is finalised only when it is among the top `beam` candidates (the first
  `beam` columns), in column order, into the utterance's free slots; EOS candidates further
  down are dropped. The next step continues the first `beam` candidates that are not EOS;
- a finished hypothesis of L tokens (EOS included) scores sum(log p) / L ** length_penalty;
- an utterance stops when `beam` hypotheses are finalised or at step max_len, where every token
  but EOS is masked (a hypothesis has at most max_len + 1 tokens with its EOS);
- pad is never produced; EOS is masked at steps < min_len (fairseq's `--min-len`, default 1)
  unless a prefix token is forced at that step; prefix tokens (fairseq's `--prefix-size`) force
  the first tokens, a pad in the prefix leaves that step free; `unk_penalty` is subtracted from
  the unknown token's log-probability;
- `no_repeat_ngram_size` n > 0 (fairseq's `--no-repeat-ngram-size`, `NGramRepeatBlock`): a
  token that would repeat an n-gram already in the hypothesis (the start token included) is
  masked, after the masking above;
- the best hypothesis is the finalised one with the highest normalised score.

Deliberate differences from fairseq (tests/test_decode.py checks the search against a
transcription of fairseq's with these two switched on, and identical otherwise):
- BOS (`<s>`) is masked like pad (`mask_bos`): fairseq can emit it, though no target has it;
- max_len is per utterance, from its own number of frames, so that an utterance's output does
  not depend on what it is batched with (fairseq computes one max_len from the batch's padded
  length). With max_len_a = 0, the speech recipes' setting, the two coincide.
A prefix containing EOS (fairseq's replicate-first-beam case) is not supported.

Joint CTC/attention decoding (`ctc=`, ESPnet's `BeamSearch` with a CTC scorer of weight w): each
hypothesis's 2 * beam best tokens by the attention decoder (ESPnet's pre-beam, here as wide as
fairseq's candidate list) score (1 - w) log p_att(c | h) + w (psi(h + c) - psi(h)) with psi the
CTC prefix score (`ctc_prefix`); the other tokens are dropped. The search is otherwise the one
above, so a finished hypothesis scores ((1 - w) log p_att(y) + w log p_ctc(y)) / L ** lenpen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue
from multiformer_jax.evaluation import ctc_prefix

NEG_INF = -jnp.inf


def _gather_beams(x, beam_indices):
  """x: [batch, beam, ...], beam_indices: [batch, new_beam] -> [batch, new_beam, ...]."""
  return jax.vmap(lambda row, idx: row[idx])(x, beam_indices)


def _first_k(mask, k: int):
  """Column indices of the first k True entries of each row of mask [batch, n], in order
  (rows with fewer than k take False columns after them, in order): [batch, k]."""
  n = mask.shape[1]
  order = jnp.where(mask, 0, n) + jnp.arange(n)[None, :]      # True columns sort first
  return jax.lax.top_k(-order, k)[1]


def _step_log_probs(logits, i, max_lengths, *, vocab, eos_id, pad_id, bos_id, unk_id,
                    unk_penalty, mask_bos, min_len, prefix_tokens):
  """fairseq's per-step masking of lprobs [batch, beam, vocab] at step i."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  logp = jnp.where(jnp.isnan(logp), NEG_INF, logp)
  ids = jnp.arange(vocab)[None, None, :]
  never = ids == pad_id
  if mask_bos:
    never = never | (ids == bos_id)
  logp = jnp.where(never, NEG_INF, logp)
  if unk_penalty:
    logp = jnp.where(ids == unk_id, logp - unk_penalty, logp)
  is_eos = ids == eos_id
  at_max = (i >= max_lengths)[:, None, None]                      # only EOS is left
  logp = jnp.where(at_max & ~is_eos, NEG_INF, logp)
  # fairseq forces a prefix at steps < P (and < max_len) and applies min_len only elsewhere.
  forcing = jnp.zeros_like(max_lengths, bool)
  if prefix_tokens is not None:
    prefix_len = prefix_tokens.shape[1]
    forcing = (i < prefix_len) & (i < max_lengths)                  # [batch]
    forced = prefix_tokens[:, jnp.minimum(i, prefix_len - 1)]       # [batch]
    constrain = (forcing & (forced != pad_id))[:, None, None]
    logp = jnp.where(constrain & (ids != forced[:, None, None]), NEG_INF, logp)
  below_min = ((i < min_len) & ~forcing)[:, None, None]
  return jnp.where(below_min & is_eos, NEG_INF, logp)


def check_no_repeat_ngram_size(n: int, label: str):
  """Refuses a repeat block other than 0 (off) or n >= 2, naming it `label`. fairseq accepts 1,
  which bans every token already produced and the start token EOS with them, so that no
  hypothesis can end."""
  if n < 0 or n == 1:
    raise InvalidValue(f"{label}: valid values are 0 (off) or an n-gram length >= 2 (fairseq's "
                     "--no-repeat-ngram-size)")


def _repeated_ngram_tokens(alive_seq, i, n: int, vocab: int):
  """fairseq's NGramRepeatBlock at step i: [batch, beam, vocab] True for the tokens that would
  complete an n-gram already in alive_seq[:, :, :i + 1] (its last n - 1 tokens followed by the
  token); nothing before step n - 2."""
  length = alive_seq.shape[2]
  starts = length - n + 1                                            # n-grams in the buffer
  keys = jnp.stack([alive_seq[:, :, o:o + starts] for o in range(n - 1)], axis=-1)  # [b,k,S,n-1]
  follows = alive_seq[:, :, n - 1:]                                  # [b, k, S]
  suffix = jax.lax.dynamic_slice_in_dim(alive_seq, jnp.maximum(i - n + 2, 0), n - 1, axis=2)
  within = jnp.arange(starts) + n - 1 <= i                           # the n-gram is generated
  seen = jnp.all(keys == suffix[:, :, None, :], axis=-1) & within[None, None, :]
  return jax.vmap(jax.vmap(lambda t, m: jnp.zeros(vocab, bool).at[t].max(m)))(follows, seen)


def beam_search(step_fn, cache, batch: int, beam: int, max_steps: int, max_lengths, vocab: int,
                eos_id: int = 2, pad_id: int = 1, bos_id: int = 0,
                length_penalty: float = 1.0, prefix_tokens=None, *, min_len: int = 1,
                unk_id: int = 3, unk_penalty: float = 0.0, mask_bos: bool = True,
                normalize_scores: bool = True, nbest: bool = False, ctc=None,
                no_repeat_ngram_size: int = 0):
  """Returns (tokens [batch, max_steps] padded with pad_id, EOS stripped, scores [batch]): the
  best hypothesis of each utterance and its normalised score. With nbest=True, all `beam`
  finalised hypotheses best first: (tokens [batch, beam, max_steps], scores [batch, beam]).

  cache: the decoder cache for batch * beam rows, at least max_steps long. max_lengths: [batch]
  int, fairseq's max_len per utterance (tokens before EOS), clipped to max_steps - 1, max_steps
  being the static number of decoder steps. prefix_tokens: optional [batch] or [batch, P] tokens
  forced as each hypothesis's first tokens (e.g. a target-language tag; pad = not forced); their
  log-probabilities count in the score, as in fairseq. ctc: optional (log_probs [batch, T,
  vocab] of a CTC head, lengths [batch] valid frames, weight in (0, 1], blank id) for joint
  CTC/attention decoding. no_repeat_ngram_size: n > 0 blocks repeated n-grams (0: off).
  """
  check_no_repeat_ngram_size(no_repeat_ngram_size, f"no_repeat_ngram_size {no_repeat_ngram_size}")
  if 2 * beam > vocab - 1:
    raise InvalidValue(f"beam {beam} needs a vocabulary of at least {2 * beam + 1} tokens "
                     f"(2 x beam candidates, pad excluded); this one has {vocab}")
  if prefix_tokens is not None:
    prefix_tokens = jnp.asarray(prefix_tokens, jnp.int32)
    if prefix_tokens.ndim == 1:
      prefix_tokens = prefix_tokens[:, None]                        # [batch, P]
  length = max_steps + 1                    # position 0 holds the start token (EOS)
  max_lengths = jnp.minimum(jnp.asarray(max_lengths, jnp.int32), max_steps - 1)
  mask = dict(vocab=vocab, eos_id=eos_id, pad_id=pad_id, bos_id=bos_id, unk_id=unk_id,
              unk_penalty=unk_penalty, mask_bos=mask_bos, min_len=min_len,
              prefix_tokens=prefix_tokens)

  alive_seq = jnp.full((batch, beam, length), pad_id, jnp.int32).at[:, :, 0].set(eos_id)
  # Step 0 extends beam 0 only (fairseq: lprobs[:, ::beam_size]): the other beams start at -inf.
  alive_score = jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1)), (batch, 1))   # [b, k]
  finished_seq = alive_seq
  finished_score = jnp.full((batch, beam), NEG_INF)
  finished_count = jnp.zeros((batch,), jnp.int32)
  done = jnp.zeros((batch,), bool)
  if ctc is not None:
    ctc_log_probs, ctc_lengths, ctc_weight, blank_id = ctc
    if not 0.0 < ctc_weight <= 1.0:
      raise InvalidValue(f"ctc weight {ctc_weight}: valid values are in (0, 1]")
    ctc_x, ctc_r = ctc_prefix.initial_state(ctc_log_probs, ctc_lengths, blank_id)
    ctc_r = jnp.repeat(ctc_r[:, None], beam, axis=1)                    # [b, k, T, 2]
    ctc_state = (ctc_r, jnp.zeros((batch, beam)))     # forward variables, psi of each alive h
    pre_beam = min(2 * beam, vocab)

  def joint_log_probs(logp, i, alive_seq, ctc_state):
    """Attention log-probs [b, k, V] -> joint scores of the pre-beam tokens (-inf elsewhere),
    and per pre-beam token its CTC state (psi [b, k, K], r [b, k, K, T, 2]) and id [b, k, K]."""
    r_prev, psi_prev = ctc_state
    ids = jax.lax.top_k(logp, pre_beam)[1]                               # [b, k, K]
    psi, r = ctc_prefix.extend(ctc_x, r_prev, alive_seq[:, :, i], i, ids, blank_id, eos_id)
    att = jnp.take_along_axis(logp, ids, axis=2)
    gain = jnp.where(psi > NEG_INF, psi - psi_prev[:, :, None], NEG_INF)
    joint = jnp.where(att > NEG_INF, (1.0 - ctc_weight) * att + ctc_weight * gain, NEG_INF)
    scattered = jnp.full_like(logp, NEG_INF)
    scattered = jax.vmap(jax.vmap(lambda row, idx, val: row.at[idx].set(val)))(
        scattered, ids, joint)
    return scattered, (psi, r, ids)

  def follow_ctc(candidates, parent, token):
    """The CTC state of candidates (parent beam, token) [b, 2k]: (r [b, 2k, T, 2], psi)."""
    psi, r, ids = candidates
    position = jnp.argmax(_gather_beams(ids, parent) == token[:, :, None], axis=2)  # [b, 2k]
    pick = jax.vmap(lambda x, p, q: x[p, q])
    return pick(r, parent, position), pick(psi, parent, position)

  def cond(state):
    i, done = state[0], state[6]
    return (i < max_steps) & ~jnp.all(done)

  def body(state):
    (i, alive_seq, alive_score, finished_seq, finished_score, finished_count, done, cache,
     ctc_state) = state
    tokens = alive_seq[:, :, i].reshape(batch * beam, 1)
    logits, cache = step_fn(tokens, i, cache)
    logp = _step_log_probs(logits.reshape(batch, beam, vocab), i, max_lengths, **mask)
    if no_repeat_ngram_size:
      logp = jnp.where(_repeated_ngram_tokens(alive_seq, i, no_repeat_ngram_size, vocab),
                       NEG_INF, logp)
    if ctc is not None:
      logp, ctc_candidates = joint_log_probs(logp, i, alive_seq, ctc_state)
    candidates = (alive_score[:, :, None] + logp).reshape(batch, beam * vocab)
    cand_score, cand_index = jax.lax.top_k(candidates, 2 * beam)       # [b, 2k], best first
    parent, token = cand_index // vocab, cand_index % vocab
    cand_seq = _gather_beams(alive_seq, parent).at[:, :, i + 1].set(token)   # [b, 2k, L]
    eos = (token == eos_id) & (cand_score > NEG_INF)                      # [b, 2k]

    # Finalise EOS candidates among the top `beam`, in column order, into the free slots.
    final = eos & (jnp.arange(2 * beam) < beam)[None, :] & ~done[:, None]
    slot = finished_count[:, None] + jnp.cumsum(final, axis=1) - 1       # [b, 2k]
    write = final & (slot < beam)
    score = cand_score / ((i + 1).astype(jnp.float32) ** length_penalty) \
        if normalize_scores else cand_score
    hit = write[:, :, None] & (slot[:, :, None] == jnp.arange(beam)[None, None, :])  # [b,2k,k]
    source = jnp.argmax(hit, axis=1)                                     # [b, k]
    filled = jnp.any(hit, axis=1)                                        # [b, k]
    finished_score = jnp.where(filled, _gather_beams(score, source), finished_score)
    finished_seq = jnp.where(filled[..., None], _gather_beams(cand_seq, source), finished_seq)
    finished_count = jnp.minimum(finished_count + jnp.sum(final, axis=1), beam)
    done = done | (finished_count == beam) | (i >= max_lengths)

    # Continue the first `beam` candidates that are not EOS; the cache follows their parents.
    active = _first_k(~eos, beam)                                        # [b, k]
    alive_seq = _gather_beams(cand_seq, active)
    alive_score = _gather_beams(cand_score, active)
    rows = (jnp.arange(batch)[:, None] * beam + _gather_beams(parent, active)).reshape(-1)
    cache = jax.tree_util.tree_map(lambda x: x[rows], cache)
    if ctc is not None:
      ctc_r, ctc_psi = follow_ctc(ctc_candidates, parent, token)
      ctc_state = (_gather_beams(ctc_r, active), _gather_beams(ctc_psi, active))
    return (i + 1, alive_seq, alive_score, finished_seq, finished_score, finished_count, done,
            cache, ctc_state)

  state = (jnp.array(0), alive_seq, alive_score, finished_seq, finished_score, finished_count,
           done, cache, ctc_state if ctc is not None else ())
  finished_seq, finished_score = jax.lax.while_loop(cond, body, state)[3:5]
  order = jnp.argsort(-finished_score, axis=1, stable=True)              # best first
  finished_seq = _gather_beams(finished_seq, order)[:, :, 1:]             # [b, k, max_steps]
  finished_score = _gather_beams(finished_score, order)
  is_eos = finished_seq == eos_id
  after_eos = jnp.cumsum(is_eos, axis=2) > 0
  tokens = jnp.where(after_eos, pad_id, finished_seq)                     # strip EOS
  if nbest:
    return tokens, finished_score
  return tokens[:, 0], finished_score[:, 0]


def max_target_lengths(source_frames, a: float, b: int, limit: int):
  """fairseq's max_len = min(a * source_frames + b, limit) tokens before EOS."""
  return jnp.minimum((a * source_frames).astype(jnp.int32) + b, limit)
