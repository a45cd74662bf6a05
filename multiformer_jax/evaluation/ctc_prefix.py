"""CTC prefix scores for joint CTC/attention decoding (ESPnet's `CTCPrefixScoreTH`).

The prefix score psi(g) of a label prefix g is the log-probability, under the CTC head, of every
frame alignment whose collapsed labelling starts with g; for a complete hypothesis (g followed
by EOS) it is the CTC log-likelihood of g itself. Decoding adds w * (psi(h + c) - psi(h)) to
(1 - w) * the attention decoder's log p(c | h) for each candidate token c, so a finished
hypothesis scores (1 - w) log p_att(y) + w log p_ctc(y) (Watanabe et al., 2017; ESPnet's
`BeamSearch` with weights {decoder: 1 - ctc_weight, ctc: ctc_weight}).

Forward variables per prefix h: r[t, 0] (r[t, 1]) = log-probability that frames 0..t emit h
and frame t emits h's last label (a blank). For c extending h, with phi[t] = logaddexp(r[t, 0],
r[t, 1]) of h, or r[t, 1] alone when c repeats h's last label (a repeat needs a blank between):
  r'[t, 0] = logaddexp(r'[t-1, 0], phi[t-1]) + x[t, c]
  r'[t, 1] = logaddexp(r'[t-1, 0], r'[t-1, 1]) + x[t, blank]
  psi(h + c) = logsumexp over t >= start of (phi[t-1] + x[t, c])   (start = max(len(h), 1))
Frames past an utterance's end emit blank with probability 1, so r carries over unchanged and
psi(h + EOS) reads phi at the last frame.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def initial_state(log_probs, lengths, blank_id: int):
  """log_probs [batch, T, V] (log-softmax of the CTC head), lengths [batch] valid frames ->
  (x [batch, T, V]: log_probs with frames past the end emitting only blank, r [batch, T, 2]:
  the forward variables of the empty prefix, all blanks)."""
  frames, vocab = log_probs.shape[1:]
  valid = (jnp.arange(frames)[None, :] < lengths[:, None])[:, :, None]
  only_blank = jnp.where(jnp.arange(vocab) == blank_id, 0.0, NEG_INF)
  x = jnp.where(valid, log_probs.astype(jnp.float32), only_blank)
  r_blank = jnp.cumsum(x[:, :, blank_id], axis=1)                       # [batch, T]
  return x, jnp.stack([jnp.full_like(r_blank, NEG_INF), r_blank], axis=-1)


def extend(x, r_prev, last, length, ids, blank_id: int, eos_id: int):
  """Prefix scores of hypotheses h extended by candidate tokens.

  x: [batch, T, V] from `initial_state`; r_prev: [batch, k, T, 2] the forward variables of k
  hypotheses per utterance; last: [batch, k] their last token (ignored when length = 0);
  length: scalar, tokens in every h (without the start token); ids: [batch, k, K] candidates.
  Returns (psi [batch, k, K]: psi(h + c), for c = EOS the CTC log-likelihood of h, -inf for
  the blank; r [batch, k, K, T, 2]: the forward variables of each h + c).
  """
  frames = x.shape[1]
  x_cand = jax.vmap(lambda xb, ib: xb[:, ib])(x, ids)                  # [batch, T, k, K]
  x_cand = jnp.moveaxis(x_cand, 1, 3)                                  # [batch, k, K, T]
  x_blank = x[:, :, blank_id]                                          # [batch, T]
  r_sum = jnp.logaddexp(r_prev[..., 0], r_prev[..., 1])                # [batch, k, T]
  repeat = (ids == last[:, :, None]) & (length > 0)                    # [batch, k, K]
  phi = jnp.where(repeat[..., None], r_prev[:, :, None, :, 1], r_sum[:, :, None, :])
  start = jnp.maximum(length, 1)
  # Frame 0 can emit c only when h is empty.
  r0 = jnp.stack([jnp.where(length == 0, x_cand[..., 0], NEG_INF),
                  jnp.full(x_cand.shape[:-1], NEG_INF)], axis=-1)      # [batch, k, K, 2]

  def frame(r, t):
    nonblank = jnp.logaddexp(r[..., 0], phi[..., t - 1]) + x_cand[..., t]
    blank = jnp.logaddexp(r[..., 0], r[..., 1]) + x_blank[:, t][:, None, None]
    r = jnp.where(t >= start, jnp.stack([nonblank, blank], axis=-1), NEG_INF)
    return r, r

  _, rs = jax.lax.scan(frame, r0, jnp.arange(1, frames))               # [T-1, batch, k, K, 2]
  r = jnp.concatenate([r0[None], rs], axis=0)
  r = jnp.moveaxis(r, 0, 3)                                             # [batch, k, K, T, 2]
  t = jnp.arange(1, frames)
  entering = jnp.where(t >= start, phi[..., :-1] + x_cand[..., 1:], NEG_INF)   # [.., T-1]
  psi = jnp.logaddexp(jax.nn.logsumexp(entering, axis=-1), r0[..., 0])
  psi = jnp.where(ids == eos_id, r_sum[:, :, None, -1], psi)
  return jnp.where(ids == blank_id, NEG_INF, psi), r
