"""Beam search (fairseq's semantics) over a cached `step_fn`, model-independent.

step_fn(tokens [n, 1], index, cache) -> (logits [n, vocab], cache) for n = batch * beam
hypotheses. Scores are sums of log-probabilities; a finished hypothesis of L tokens (EOS
included) is ranked by score / L ** length_penalty. As in fairseq: EOS is not allowed at the
first step, pad and BOS are never produced, an utterance stops once `beam` hypotheses are
finished, and after its maximum length max_len = a * source_frames + b tokens EOS is forced
(so a hypothesis has at most max_len + 1 tokens with its EOS).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1.0e9


def _gather_beams(x, beam_indices):
  """x: [batch, beam, ...], beam_indices: [batch, new_beam] -> [batch, new_beam, ...]."""
  return jax.vmap(lambda row, idx: row[idx])(x, beam_indices)


def beam_search(step_fn, cache, batch: int, beam: int, max_steps: int, max_lengths, vocab: int,
                eos_id: int = 2, pad_id: int = 1, bos_id: int = 0,
                length_penalty: float = 1.0, prefix_tokens=None):
  """Returns (tokens [batch, max_steps] padded with pad_id after EOS, scores [batch]).

  prefix_tokens: optional [batch] token forced as each hypothesis's first token (fairseq's
  --prefix-size 1, e.g. a target-language tag); its log-probability still counts.

  cache: the decoder cache for batch * beam rows (row b * beam + k is beam k of utterance b),
  at least max_steps long. max_lengths: [batch] int, fairseq's max_len per utterance (tokens
  before EOS); clipped to max_steps - 1, max_steps being the static number of decoder steps.
  """
  length = max_steps + 1                    # position 0 holds the start token (EOS)
  alive_seq = jnp.full((batch, beam, length), pad_id, jnp.int32).at[:, :, 0].set(eos_id)
  alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1)), (batch, 1))  # [b, k]
  finished_seq = alive_seq
  finished_score = jnp.full((batch, beam), NEG_INF)
  max_lengths = jnp.minimum(jnp.asarray(max_lengths, jnp.int32), max_steps - 1)

  def done(finished_score, i):
    full = jnp.all(finished_score > NEG_INF / 2, axis=1)      # `beam` hypotheses finished
    return full | (i > max_lengths)

  def cond(state):
    i, _, _, _, finished_score, _ = state
    return (i < max_steps) & ~jnp.all(done(finished_score, i))

  def body(state):
    i, alive_seq, alive_logp, finished_seq, finished_score, cache = state
    tokens = alive_seq[:, :, i].reshape(batch * beam, 1)
    logits, cache = step_fn(tokens, i, cache)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, beam, vocab)
    logp = logp.at[:, :, pad_id].set(NEG_INF).at[:, :, bos_id].set(NEG_INF)
    last = (i >= max_lengths)[:, None, None]                          # must end now
    is_eos = (jnp.arange(vocab) == eos_id)[None, None, :]
    logp = jnp.where(last & ~is_eos, NEG_INF, logp)
    logp = jnp.where((i == 0) & is_eos, NEG_INF, logp)               # min length 1
    if prefix_tokens is not None:
      forced = jnp.arange(vocab)[None, None, :] == prefix_tokens[:, None, None]
      logp = jnp.where((i == 0) & ~forced, NEG_INF, logp)
    candidates = (alive_logp[:, :, None] + logp).reshape(batch, beam * vocab)
    cand_score, cand_index = jax.lax.top_k(candidates, 2 * beam)      # [b, 2k]
    parent, token = cand_index // vocab, cand_index % vocab
    cand_seq = _gather_beams(alive_seq, parent).at[:, :, i + 1].set(token)  # [b, 2k, L]
    cand_eos = token == eos_id

    # Finished: EOS candidates, ranked by the length-normalised score.
    normalised = cand_score / ((i + 1).astype(jnp.float32) ** length_penalty)
    pool_score = jnp.concatenate([finished_score,
                                  jnp.where(cand_eos, normalised, NEG_INF)], axis=1)
    pool_seq = jnp.concatenate([finished_seq, cand_seq], axis=1)
    new_score, keep = jax.lax.top_k(pool_score, beam)
    new_seq = _gather_beams(pool_seq, keep)
    stop = done(finished_score, i)[:, None]              # finished utterances stay as they are
    finished_score = jnp.where(stop, finished_score, new_score)
    finished_seq = jnp.where(stop[..., None], finished_seq, new_seq)

    # Alive: the best non-EOS candidates; the cache follows their parents.
    alive_score, keep = jax.lax.top_k(jnp.where(cand_eos, NEG_INF, cand_score), beam)
    alive_seq = _gather_beams(cand_seq, keep)
    rows = (jnp.arange(batch)[:, None] * beam + _gather_beams(parent, keep)).reshape(-1)
    cache = jax.tree_util.tree_map(lambda x: x[rows], cache)
    return i + 1, alive_seq, alive_score, finished_seq, finished_score, cache

  state = (jnp.array(0), alive_seq, alive_logp, finished_seq, finished_score, cache)
  _, _, _, finished_seq, finished_score, _ = jax.lax.while_loop(cond, body, state)
  best = jnp.argmax(finished_score, axis=1)                                  # [b]
  tokens = jnp.take_along_axis(finished_seq, best[:, None, None], axis=1)[:, 0, 1:]
  after_eos = jnp.cumsum(tokens == eos_id, axis=1) - (tokens == eos_id) > 0
  tokens = jnp.where(after_eos | (tokens == eos_id), pad_id, tokens)         # strip EOS
  return tokens, jnp.max(finished_score, axis=1)


def max_target_lengths(source_frames, a: float, b: int, limit: int):
  """fairseq's max_len = min(a * source_frames + b, limit) tokens before EOS."""
  return jnp.minimum((a * source_frames).astype(jnp.int32) + b, limit)
