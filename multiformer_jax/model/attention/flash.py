"""Softmax attention with fairseq's attention dropout in one Pallas (Triton) kernel for GPUs.

cuDNN's flash attention (fused.py) has no dropout in JAX's public API, so while attention
dropout is active our `full` and `conv` heads form the [q_len, k_len] weights, their softmax
and their dropout mask in memory (15% of an s2t_transformer_s update on an H200,
docs/notes/benchmarks-lab-notebook.md). This kernel never forms them: FlashAttention-2's online softmax
(Dao, 2023), forward and backward, after the structure of JAX's Pallas reference kernel
(jax.experimental.pallas.ops.gpu.attention), with the dropout mask regenerated inside each tile.

With a threefry key the mask is the one `multiformer_jax.model.dropout` draws for the weights
[batch, heads, q_len, k_len] with the same key: element (b, h, i, j) is kept where the top 23
bits of lowbias32(lowbias32(index ^ key word 0) ^ key word 1), index = ((b * heads + h) *
q_len + i) * k_len + j, fall below the keep probability. So the kernel computes exactly the
function of the dense path with `dropout.dropout(weights, rate, key)`
(tests/test_flash_attention.py runs it in Pallas' interpreter on a CPU and compares values
and gradients).

Sequences are padded to whole tiles here; key masks are prefix masks (masks.py) and reach the
kernel as an int32 validity row per batch element. A row with no valid key gets zero weights,
as `masks.masked_softmax` gives it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.dropout import lowbias32, threefry_key_words

LOG2_E = math.log2(math.e)
MASKED_SCORE = -0.7 * float(np.finfo(np.float32).max)
HEAD_DIMS = (16, 32, 64, 128)     # powers of two: Triton's tiles
DEFAULT_BLOCK = 64
MIN_TILE = 16                     # tl.dot's smallest operand dimension


def keep_threshold(rate: float) -> int:
  """The integer t with: top 23 bits of the hash < t  <=>  dropout.bernoulli keeps the element.

  bernoulli compares the float32 uniform m / 2**23 (m the top 23 bits) with float32(1 - rate);
  m / 2**23 < p exactly when m < ceil(p * 2**23), p * 2**23 being exact in float64."""
  keep = float(np.float32(1.0 - rate))
  return int(math.ceil(keep * 2 ** 23))


def kernel_unsupported(q, k) -> str | None:
  """Why the kernel cannot compute these heads (None: it can), on any backend and in any
  dtype (Pallas' interpreter runs it anywhere; fused.flash_unsupported adds the GPU's terms).
  q: [batch, q_len, heads, head_dim]; k: [batch, k_len, heads, head_dim]."""
  if q.shape[-1] not in HEAD_DIMS:
    return f"head_dim {q.shape[-1]} is not one of {HEAD_DIMS}"
  batch, q_len, heads, _ = q.shape
  if batch * heads * q_len * k.shape[1] >= 2 ** 32:
    return "the weights have 2**32 elements or more (the mask's index is 32-bit)"
  return None


def key_words(dropout_rng):
  """uint32[2]: the words the mask hashes: a threefry key's own (dropout.random_bits' mask),
  two bits drawn from any other key."""
  words = threefry_key_words(dropout_rng)
  if words is None:
    return jax.random.bits(dropout_rng, (2,), jnp.uint32)
  return jnp.stack(words).astype(jnp.uint32)


def _dropout_keep(words_ref, b, h, rows, cols, sizes, rate):
  """bool[len(rows), len(cols)]: the dropout mask's tile at query rows x key cols of head h
  of batch element b; sizes = (heads, q_len, k_len), the unpadded sizes."""
  heads, q_len, k_len = (np.uint32(n) for n in sizes)
  row_base = (b.astype(jnp.uint32) * heads + h.astype(jnp.uint32)) * q_len
  index = ((row_base + rows.astype(jnp.uint32))[:, None] * k_len
           + cols.astype(jnp.uint32)[None, :])
  bits = lowbias32(lowbias32(index ^ words_ref[0]) ^ words_ref[1])
  return lax.shift_right_logical(bits, np.uint32(9)) < np.uint32(keep_threshold(rate))


def _forward_kernel(q_ref, k_ref, v_ref, valid_ref, words_ref, o_ref, lse_ref, *, scale,
                    rate, block_q, block_k, sizes):
  """One tile of block_q queries of one (batch element, head) against all key tiles."""
  q_block, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  k_padded, head_dim = k_ref.shape
  rows = q_block * block_q + jnp.arange(block_q)
  q = q_ref[...]                                          # [block_q, head_dim]

  def body(k_block, carry):
    out, row_max, row_sum = carry
    keys = pl.dslice(k_block * block_k, block_k)
    k, v = k_ref[keys, :], v_ref[keys, :]                 # [block_k, head_dim]
    valid = (valid_ref[keys] > 0)[None, :]                # [1, block_k]
    scores = plgpu.dot(q, k.T) * (scale * LOG2_E)         # [block_q, block_k], log2 units
    scores = jnp.where(valid, scores, MASKED_SCORE)
    new_max = jnp.maximum(row_max, jnp.max(scores, axis=1))
    correction = jnp.exp2(row_max - new_max)
    probs = jnp.where(valid, jnp.exp2(scores - new_max[:, None]), 0.0)
    row_sum = row_sum * correction + jnp.sum(probs, axis=1)
    if rate > 0.0:
      cols = k_block * block_k + jnp.arange(block_k)
      probs = jnp.where(_dropout_keep(words_ref, b, h, rows, cols, sizes, rate), probs, 0.0)
    out = out * correction[:, None] + plgpu.dot(probs.astype(v.dtype), v)
    return out, new_max, row_sum

  init = (jnp.zeros((block_q, head_dim), jnp.float32),
          jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32))
  out, row_max, row_sum = lax.fori_loop(0, k_padded // block_k, body, init)
  has_keys = row_sum > 0.0
  safe_sum = jnp.where(has_keys, row_sum, 1.0)
  out = out / (safe_sum * (1.0 - rate))[:, None]
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = jnp.where(has_keys, row_max + jnp.log2(safe_sum), 0.0)


def _probs_tile(q, k, valid, lse, scale):
  """[rows, cols] softmax weights of a tile, from the forward's log2-sum-exp per row."""
  scores = plgpu.dot(q, k.T) * (scale * LOG2_E)
  return jnp.where(valid, jnp.exp2(scores - lse[:, None]), 0.0)


def _dropped_grad(probs, d_weights, delta, keep, rate):
  """dS = P * (dP - delta), dP the cotangent of the undropped weights: dropout's select `keep`
  (None: no dropout) and 1 / (1 - rate) applied to d_weights (the cotangent of the dropped
  ones)."""
  if keep is not None:
    d_weights = jnp.where(keep, d_weights, 0.0) / (1.0 - rate)
  return probs * (d_weights - delta[:, None])


def _backward_kv_kernel(q_ref, k_ref, v_ref, valid_ref, words_ref, do_ref, lse_ref, delta_ref,
                        dk_ref, dv_ref, *, scale, rate, block_q, block_k, sizes):
  """dK and dV of one tile of block_k keys, summed over all query tiles."""
  k_block, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q_padded, head_dim = q_ref.shape
  cols = k_block * block_k + jnp.arange(block_k)
  k, v = k_ref[...], v_ref[...]                           # [block_k, head_dim]
  valid = (valid_ref[...] > 0)[None, :]

  def body(q_block, carry):
    dk, dv = carry
    queries = pl.dslice(q_block * block_q, block_q)
    q, do = q_ref[queries, :], do_ref[queries, :]         # [block_q, head_dim]
    probs = _probs_tile(q, k, valid, lse_ref[queries], scale)
    keep, dropped = None, probs
    if rate > 0.0:
      rows = q_block * block_q + jnp.arange(block_q)
      keep = _dropout_keep(words_ref, b, h, rows, cols, sizes, rate)
      dropped = jnp.where(keep, probs, 0.0) / (1.0 - rate)
    dv = dv + plgpu.dot(dropped.astype(do.dtype).T, do)
    d_scores = _dropped_grad(probs, plgpu.dot(do, v.T), delta_ref[queries], keep, rate)
    dk = dk + plgpu.dot(d_scores.astype(q.dtype).T, q)
    return dk, dv

  zeros = jnp.zeros((block_k, head_dim), jnp.float32)
  dk, dv = lax.fori_loop(0, q_padded // block_q, body, (zeros, zeros))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward_q_kernel(q_ref, k_ref, v_ref, valid_ref, words_ref, do_ref, lse_ref, delta_ref,
                       dq_ref, *, scale, rate, block_q, block_k, sizes):
  """dQ of one tile of block_q queries, summed over all key tiles."""
  q_block, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  k_padded, head_dim = k_ref.shape
  rows = q_block * block_q + jnp.arange(block_q)
  q, do = q_ref[...], do_ref[...]                         # [block_q, head_dim]
  lse, delta = lse_ref[...], delta_ref[...]

  def body(k_block, dq):
    keys = pl.dslice(k_block * block_k, block_k)
    k, v = k_ref[keys, :], v_ref[keys, :]
    valid = (valid_ref[keys] > 0)[None, :]
    probs = _probs_tile(q, k, valid, lse, scale)
    keep = None
    if rate > 0.0:
      cols = k_block * block_k + jnp.arange(block_k)
      keep = _dropout_keep(words_ref, b, h, rows, cols, sizes, rate)
    d_scores = _dropped_grad(probs, plgpu.dot(do, v.T), delta, keep, rate)
    return dq + plgpu.dot(d_scores.astype(k.dtype), k)

  dq = lax.fori_loop(0, k_padded // block_k, body, jnp.zeros((block_q, head_dim), jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _pad_time(x, length: int):
  return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


class _Plan:
  """Tile sizes, padded lengths and the three pallas_calls for one attention shape."""

  def __init__(self, q, k, rate: float, block: int, interpret: bool):
    self.batch, self.q_len, self.heads, self.head_dim = q.shape
    self.k_len = k.shape[1]
    # Tiles of `block` rows, fewer for short sequences, but not below Triton's 16 for a dot.
    self.block_q = min(block, max(MIN_TILE, pl.next_power_of_2(self.q_len)))
    self.block_k = min(block, max(MIN_TILE, pl.next_power_of_2(self.k_len)))
    self.q_padded = pl.cdiv(self.q_len, self.block_q) * self.block_q
    self.k_padded = pl.cdiv(self.k_len, self.block_k) * self.block_k
    self.interpret = interpret
    self.kernel_args = dict(scale=self.head_dim ** -0.5, rate=rate, block_q=self.block_q,
                            block_k=self.block_k, sizes=(self.heads, self.q_len, self.k_len))

  def specs(self):
    """BlockSpecs over the grid (tile, batch, head): a tile of rows, all rows, the per-row
    values of a tile and of all rows, key validity of a tile and of all keys, the key words."""
    d = self.head_dim
    specs = dict(
        rows=lambda n: pl.BlockSpec((None, n, None, d), lambda t, b, h: (b, t, h, 0)),
        whole=lambda n: pl.BlockSpec((None, n, None, d), lambda t, b, h: (b, 0, h, 0)),
        tile_values=lambda n: pl.BlockSpec((None, None, n), lambda t, b, h: (b, h, t)),
        all_values=lambda n: pl.BlockSpec((None, None, n), lambda t, b, h: (b, h, 0)),
        valid_tile=pl.BlockSpec((None, self.block_k), lambda t, b, h: (b, t)),
        valid_all=pl.BlockSpec((None, self.k_padded), lambda t, b, h: (b, 0)),
        words=pl.BlockSpec((2,), lambda t, b, h: (0,)))
    return specs

  def call(self, kernel, grid_tiles, in_specs, out_specs, out_shape, name):
    return pl.pallas_call(
        functools.partial(kernel, **self.kernel_args),
        grid=(grid_tiles, self.batch, self.heads), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, interpret=self.interpret, name=name,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2))

  def forward_specs(self):
    """(grid tiles, in_specs, out_specs) of the forward kernel."""
    s = self.specs()
    return (self.q_padded // self.block_q,
            [s["rows"](self.block_q), s["whole"](self.k_padded), s["whole"](self.k_padded),
             s["valid_all"], s["words"]],
            [s["rows"](self.block_q), s["tile_values"](self.block_q)])

  def backward_kv_specs(self):
    """(grid tiles, in_specs, out_specs) of the dK, dV kernel."""
    s = self.specs()
    return (self.k_padded // self.block_k,
            [s["whole"](self.q_padded), s["rows"](self.block_k), s["rows"](self.block_k),
             s["valid_tile"], s["words"], s["whole"](self.q_padded),
             s["all_values"](self.q_padded), s["all_values"](self.q_padded)],
            [s["rows"](self.block_k), s["rows"](self.block_k)])

  def backward_q_specs(self):
    """(grid tiles, in_specs, out_specs) of the dQ kernel."""
    s = self.specs()
    return (self.q_padded // self.block_q,
            [s["rows"](self.block_q), s["whole"](self.k_padded), s["whole"](self.k_padded),
             s["valid_all"], s["words"], s["rows"](self.block_q),
             s["tile_values"](self.block_q), s["tile_values"](self.block_q)],
            [s["rows"](self.block_q)])

  def forward(self, q, k, v, valid, words):
    return self.call(
        _forward_kernel, *self.forward_specs(),
        [jax.ShapeDtypeStruct(q.shape, q.dtype),
         jax.ShapeDtypeStruct((self.batch, self.heads, self.q_padded), jnp.float32)],
        "flash_dropout_forward")(q, k, v, valid, words)

  def backward(self, q, k, v, valid, words, d_out, lse, delta):
    dk, dv = self.call(
        _backward_kv_kernel, *self.backward_kv_specs(),
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        "flash_dropout_backward_kv")(q, k, v, valid, words, d_out, lse, delta)
    (dq,) = self.call(
        _backward_q_kernel, *self.backward_q_specs(), [jax.ShapeDtypeStruct(q.shape, q.dtype)],
        "flash_dropout_backward_q")(q, k, v, valid, words, d_out, lse, delta)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, valid, words, rate, block, interpret):
  return _flash_fwd(q, k, v, valid, words, rate, block, interpret)[0]


def _flash_fwd(q, k, v, valid, words, rate, block, interpret):
  plan = _Plan(q, k, rate, block, interpret)
  out, lse = plan.forward(_pad_time(q, plan.q_padded), _pad_time(k, plan.k_padded),
                          _pad_time(v, plan.k_padded), _pad_time(valid, plan.k_padded), words)
  out = out[:, :plan.q_len]
  return out, (q, k, v, valid, words, out, lse)


def _flash_bwd(rate, block, interpret, residuals, d_out):
  q, k, v, valid, words, out, lse = residuals
  plan = _Plan(q, k, rate, block, interpret)
  # delta_i = dO_i . O_i = sum_j P_ij dP_ij, with or without dropout.
  delta = jnp.einsum("bqhd,bqhd->bhq", d_out.astype(jnp.float32), out.astype(jnp.float32))
  delta = jnp.pad(delta, [(0, 0), (0, 0), (0, plan.q_padded - plan.q_len)])
  dq, dk, dv = plan.backward(
      _pad_time(q, plan.q_padded), _pad_time(k, plan.k_padded), _pad_time(v, plan.k_padded),
      _pad_time(valid, plan.k_padded), words, _pad_time(d_out.astype(q.dtype), plan.q_padded),
      lse, delta)
  return dq[:, :plan.q_len], dk[:, :plan.k_len], dv[:, :plan.k_len], None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, key_mask, dropout_rate: float = 0.0, dropout_rng=None, *,
                    block: int = DEFAULT_BLOCK, interpret: bool = False):
  """Softmax attention over the valid keys of a prefix key_mask, attention dropout inside.

  q: [batch, q_len, heads, head_dim]; k, v: [batch, k_len, heads, head_dim] (cast to q's
  dtype); key_mask: [batch, k_len] bool. dropout_rate > 0 needs dropout_rng (with a
  threefry key, the mask is dropout.bernoulli's for the weights [batch, heads, q_len, k_len]).
  Returns [batch, q_len, heads, head_dim] in q's dtype. interpret: run the kernels in Pallas'
  interpreter (any backend; for tests).
  """
  if not 0.0 <= dropout_rate < 1.0:
    raise InvalidValue(f"attention dropout must be in [0, 1), got {dropout_rate}")
  if dropout_rate > 0.0 and dropout_rng is None:
    raise InvalidValue("flash attention with dropout needs a dropout_rng")
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  reason = kernel_unsupported(q, k)
  if reason:
    raise InvalidValue(f"flash attention cannot compute these heads: {reason}")
  words = key_words(dropout_rng) if dropout_rate > 0.0 else jnp.zeros((2,), jnp.uint32)
  valid = key_mask.astype(jnp.int32)
  return _flash(q, k, v, valid, words, float(dropout_rate), int(block), bool(interpret))
