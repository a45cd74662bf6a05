"""Beam search on scripted logits: EOS, length penalty, maximum length, cache reordering."""

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax.decode import beam_search

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
  # Short: [3, EOS] p = 0.5 * 0.3 = 0.15 (len 2); long: [4, 5, EOS] p = 0.5 * 1 * 0.25 (len 3)
  table = [probs({EOS: {3: 0.5, 4: 0.5}}),
           probs({3: {EOS: 0.3, 5: 0.7}, 4: {5: 1.0}}),
           probs({5: {EOS: 0.25, 3: 0.75}}),
           probs({3: {EOS: 1e-6, 3: 1.0}})] + [probs({3: {EOS: 1e-6, 3: 1.0}})] * 2
  short, _ = run(table, beam=2, lenpen=0.0)
  long, _ = run(table, beam=2, lenpen=1.0)
  assert short[0].tolist()[:2] == [3, PAD]       # log 0.15 = -1.90 > log 0.125 = -2.08
  assert long[0].tolist()[:3] == [4, 5, PAD]     # -2.08 / 3 = -0.69 > -1.90 / 2 = -0.95


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
