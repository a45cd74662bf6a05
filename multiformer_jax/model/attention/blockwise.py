"""Exact softmax attention over blocks of keys (online softmax, as in FlashAttention).

`full` and `conv` heads normally form the whole [q_len, k_len] weight matrix, and the backward
pass keeps it (and its dropout mask) per layer: without downsampling that is what runs a
20 000-frame batch out of memory. Here the keys are cut into blocks of `key_block`; the forward
keeps a running max, normaliser and weighted sum per query, and saves only the output and the
log-sum-exp; the backward recomputes each block's weights from them. Memory is
O(q_len x key_block) per head instead of O(q_len x k_len); the result is the same softmax
(up to float rounding, ~1e-6).

The loops are `lax.scan`s, so XLA cannot merge the backward's recomputation back into the
forward (it does that to `jax.checkpoint` on the CPU, which then saves nothing).

Attention dropout is applied to the normalised weights, block by block, with the block's mask
drawn from `fold_in(rng, block index)`: the backward regenerates the forward's masks exactly.
The masks differ from the dense path's `Dropout` masks (same distribution, other draws).

When all keys fit in one block (k_len <= key_block: every downsampled encoder on the CPU, whose
AUTO key block is 512) there is no loop: the weights and the dropout keep-mask, within the
same O(q_len x key_block) bound, are kept for the backward instead of recomputed and redrawn,
and the matmuls run heads-major ([batch, heads, len, head_dim]), the layout in which XLA:CPU ran
them fastest here. Same masks, same results (to float rounding); the measurements are in
docs/notes/benchmarks-lab-notebook.md.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.attention.masks import MASKED_LOGIT
from multiformer_jax.model.dropout import bernoulli


def _blocks(x, num_blocks: int, key_block: int):
  """[batch, k_len, ...] -> [blocks, batch, key_block, ...] (zero padded at the end)."""
  pad = num_blocks * key_block - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape((x.shape[0], num_blocks, key_block) + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _unblock(x, length: int):
  """[blocks, batch, key_block, ...] -> [batch, length, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :length]


def _key_blocks(k, v, key_mask, key_block: int):
  """The scan inputs: (block index, k, v, key mask), each [blocks, batch, key_block, ...]."""
  num_blocks = math.ceil(k.shape[1] / key_block)
  return (jnp.arange(num_blocks), _blocks(k, num_blocks, key_block),
          _blocks(v, num_blocks, key_block), _blocks(key_mask, num_blocks, key_block))


def checked_dropout_rng(what: str, rate: float, rng):
  """The PRNG key of an attention dropout `rate` (validated): `rng`, or a fixed stand-in key
  when there is no dropout."""
  if not 0.0 <= rate < 1.0:
    raise InvalidValue(f"attention dropout must be in [0, 1), got {rate}")
  if rate > 0.0 and rng is None:
    raise InvalidValue(f"{what} with dropout needs a dropout_rng")
  return jax.random.PRNGKey(0) if rng is None else rng


def dropout_keep_mask(rng, block_index, rate: float, shape):
  """The dropout keep-mask [batch, heads, q_len, key_block] of one key block."""
  return bernoulli(jax.random.fold_in(rng, block_index), 1.0 - rate, shape)


def _masked_logits(q_scaled, k_block, valid):
  """[batch, heads, q_len, key_block] float32 logits, MASKED_LOGIT at invalid keys."""
  logits = jnp.einsum("bqhd,bkhd->bhqk", q_scaled, k_block, preferred_element_type=jnp.float32)
  return jnp.where(valid[:, None, None, :], logits, MASKED_LOGIT)


def _forward(q, k, v, key_mask, rng, key_block: int, rate: float):
  batch, q_len, heads, head_dim = q.shape
  q_scaled = q * head_dim ** -0.5

  def step(carry, block):
    running_max, normaliser, acc = carry   # [b, h, q], [b, h, q], [b, q, h, d]
    index, k_block, v_block, valid = block
    logits = _masked_logits(q_scaled, k_block, valid)
    new_max = jnp.maximum(running_max, jnp.max(logits, axis=-1))
    correction = jnp.exp(running_max - new_max)
    probs = jnp.exp(logits - new_max[..., None]) * valid[:, None, None, :]
    normaliser = normaliser * correction + jnp.sum(probs, axis=-1)
    if rate > 0.0:
      probs = probs * dropout_keep_mask(rng, index, rate, probs.shape) / (1.0 - rate)
    acc = acc * jnp.swapaxes(correction, 1, 2)[..., None] + jnp.einsum(
        "bhqk,bkhd->bqhd", probs.astype(v.dtype), v_block, preferred_element_type=jnp.float32)
    return (new_max, normaliser, acc), None

  init = (jnp.full((batch, heads, q_len), MASKED_LOGIT, jnp.float32),
          jnp.zeros((batch, heads, q_len), jnp.float32),
          jnp.zeros((batch, q_len, heads, head_dim), jnp.float32))
  (running_max, normaliser, acc), _ = lax.scan(step, init, _key_blocks(k, v, key_mask, key_block))
  normaliser = jnp.maximum(normaliser, 1e-30)
  out = (acc / jnp.swapaxes(normaliser, 1, 2)[..., None]).astype(v.dtype)
  log_sum_exp = running_max + jnp.log(normaliser)   # [batch, heads, q_len]
  return out, log_sum_exp


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _blockwise(q, k, v, key_mask, rng, key_block, rate):
  return _forward(q, k, v, key_mask, rng, key_block, rate)[0]


def _blockwise_fwd(q, k, v, key_mask, rng, key_block, rate):
  out, log_sum_exp = _forward(q, k, v, key_mask, rng, key_block, rate)
  return out, (q, k, v, key_mask, rng, out, log_sum_exp)


def _blockwise_bwd(key_block, rate, residuals, d_out):
  q, k, v, key_mask, rng, out, log_sum_exp = residuals
  head_dim = q.shape[-1]
  scale = head_dim ** -0.5
  q_scaled = q * scale
  d_out32 = d_out.astype(jnp.float32)
  # sum_j dP_ij P_ij = dO_i . O_i (also with dropout: dropped weights give O).
  delta = jnp.swapaxes(jnp.sum(d_out32 * out.astype(jnp.float32), axis=-1), 1, 2)  # [b, h, q]

  def step(d_q, block):
    index, k_block, v_block, valid = block
    probs = jnp.exp(_masked_logits(q_scaled, k_block, valid) - log_sum_exp[..., None])
    probs = probs * valid[:, None, None, :]                           # [b, h, q, kb]
    d_kept = jnp.einsum("bqhd,bkhd->bhqk", d_out32, v_block.astype(jnp.float32))
    kept = probs
    if rate > 0.0:
      keep = dropout_keep_mask(rng, index, rate, probs.shape) / (1.0 - rate)
      kept, d_kept = probs * keep, d_kept * keep
    d_v = jnp.einsum("bhqk,bqhd->bkhd", kept, d_out32)
    d_logits = probs * (d_kept - delta[..., None])
    d_q = d_q + jnp.einsum("bhqk,bkhd->bqhd", d_logits, k_block.astype(jnp.float32)) * scale
    d_k = jnp.einsum("bhqk,bqhd->bkhd", d_logits, q_scaled.astype(jnp.float32))
    return d_q, (d_k.astype(k.dtype), d_v.astype(v.dtype))

  d_q, (d_k, d_v) = lax.scan(step, jnp.zeros(q.shape, jnp.float32),
                             _key_blocks(k, v, key_mask, key_block))
  return (d_q.astype(q.dtype), _unblock(d_k, k.shape[1]), _unblock(d_v, v.shape[1]), None,
          None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def _heads_major(x):
  """[batch, len, heads, head_dim] <-> [batch, heads, len, head_dim]."""
  return jnp.swapaxes(x, 1, 2)


def _one_block_forward(q, k, v, key_mask, rng, rate: float):
  """Heads-major softmax attention over all keys at once -> (out, backward residuals)."""
  head_dim = q.shape[-1]
  q_scaled, k_h, v_h = _heads_major(q * head_dim ** -0.5), _heads_major(k), _heads_major(v)
  logits = jnp.einsum("bhqd,bhkd->bhqk", q_scaled, k_h, preferred_element_type=jnp.float32)
  valid = key_mask[:, None, None, :]
  logits = jnp.where(valid, logits, MASKED_LOGIT)
  unnormalised = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True)) * valid
  probs = unnormalised / jnp.maximum(jnp.sum(unnormalised, axis=-1, keepdims=True), 1e-30)
  keep = dropout_keep_mask(rng, 0, rate, probs.shape) if rate > 0.0 else None
  kept = probs if keep is None else jnp.where(keep, probs / (1.0 - rate), 0.0)
  out_h = jnp.einsum("bhqk,bhkd->bhqd", kept.astype(v.dtype), v_h,
                     preferred_element_type=jnp.float32)          # [b, h, q, d]
  return _heads_major(out_h).astype(v.dtype), (q_scaled, k_h, v_h, probs, keep, out_h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _one_block(q, k, v, key_mask, rng, rate):
  return _one_block_forward(q, k, v, key_mask, rng, rate)[0]


def _one_block_bwd(rate, residuals, d_out):
  q_scaled, k_h, v_h, probs, keep, out_h = residuals
  scale = q_scaled.shape[-1] ** -0.5
  d_out_h = _heads_major(d_out).astype(jnp.float32)                 # [b, h, q, d]
  kept = probs if keep is None else jnp.where(keep, probs / (1.0 - rate), 0.0)
  d_v = jnp.einsum("bhqk,bhqd->bhkd", kept, d_out_h)
  d_kept = jnp.einsum("bhqd,bhkd->bhqk", d_out_h, v_h.astype(jnp.float32))
  d_probs = d_kept if keep is None else jnp.where(keep, d_kept / (1.0 - rate), 0.0)
  # sum_k dP_qk P_qk = dO_q . O_q (also with dropout), as in the blocked backward.
  delta = jnp.sum(d_out_h * out_h, axis=-1, keepdims=True)        # [b, h, q, 1]
  d_logits = probs * (d_probs - delta)
  d_q = jnp.einsum("bhqk,bhkd->bhqd", d_logits, k_h.astype(jnp.float32)) * scale
  d_k = jnp.einsum("bhqk,bhqd->bhkd", d_logits, q_scaled.astype(jnp.float32))
  return (_heads_major(d_q).astype(q_scaled.dtype), _heads_major(d_k).astype(k_h.dtype),
          _heads_major(d_v).astype(v_h.dtype), None, None)


_one_block.defvjp(_one_block_forward, _one_block_bwd)


def blockwise_attention(q, k, v, key_mask, key_block: int, dropout_rate: float = 0.0,
                        dropout_rng=None):
  """Softmax attention of unscaled q over the valid keys, `key_block` keys at a time.

  q: [batch, q_len, heads, head_dim]; k, v: [batch, k_len, heads, head_dim];
  key_mask: [batch, k_len] bool. dropout_rng: a PRNG key, needed when dropout_rate > 0.
  Returns [batch, q_len, heads, head_dim] in v's dtype.
  """
  if key_block < 1:
    raise InvalidValue(f"key_block must be >= 1, got {key_block}")
  dropout_rng = checked_dropout_rng("blockwise attention", dropout_rate, dropout_rng)
  key_mask = key_mask.astype(bool)
  if k.shape[1] <= key_block:
    return _one_block(q, k, v, key_mask, dropout_rng, float(dropout_rate))
  return _blockwise(q, k, v, key_mask, dropout_rng, key_block, float(dropout_rate))
