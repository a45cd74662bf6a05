"""`local(w[,d])` heads: an exact centred sliding window, computed blockwise.

Query i attends to keys j = i + d*m with |m| <= w//2 (w odd, d the dilation). Queries are cut
into blocks of `block` positions; each block attends to its own keys plus `radius` keys on each
side, so time grows as O(n * (block + 2*radius)) and no n x n matrix is ever formed.
A dilated window is the undilated window on each of the d interleaved subsequences
(positions with the same residue mod d), which keeps it O(n * w) as well.

Memory: the blocks run in a `lax.scan` over chunks of about QUERY_CHUNK queries, and a custom
VJP saves only the output and the log-sum-exp per query (as multiformer_jax/model/attention/
blockwise.py does for full attention); the backward recomputes each chunk's weights. So the
temporaries are O(n * head_dim) plus one chunk's [chunk, block + 2*radius] weights, not the
whole band's weights, windows and dropout masks. Attention dropout is applied to the normalised
weights of each chunk with a mask from `fold_in(rng, chunk index)`, regenerated in the backward.

On the CPU, in float32, the band runs through a C++ kernel instead (local_cpu.py: the same
function, attention dropout with the same masks included, only the band's entries, ~2x faster
at n = 4096); `implementation="xla"` keeps the XLA band everywhere.

A window that reaches every key from every query (w//2 >= n - 1, dilation 1: e.g. local(65) on
the quickstart's 26-position encoder) is softmax attention over the valid keys, and is
computed as that, in one key block (blockwise.py), instead of against block + 2*radius keys.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.attention.blockwise import (blockwise_attention, checked_dropout_rng,
                                                      dropout_keep_mask)
from multiformer_jax.model.attention.cpu_kernels import check_implementation, kernel_chosen
from multiformer_jax.model.attention.full import attention_weights
from multiformer_jax.model.attention.local_cpu import band_attention, kernel_unsupported
from multiformer_jax.model.attention.masks import MASKED_LOGIT

MIN_BLOCK = 16
QUERY_CHUNK = 256   # queries per scan step (rounded to whole blocks)


def default_block_size(radius: int, length: int) -> int:
  """Blocks as wide as the radius (at least MIN_BLOCK), never longer than the sequence."""
  return max(1, min(max(radius, MIN_BLOCK), length))


class _Band:
  """The static geometry of one banded computation (all sizes in positions or blocks)."""

  def __init__(self, length: int, window: int, block: int):
    self.radius = window // 2
    self.block = block
    self.chunk_blocks = max(1, min(QUERY_CHUNK // block, math.ceil(length / block)))
    self.num_chunks = math.ceil(length / (block * self.chunk_blocks))
    self.num_blocks = self.num_chunks * self.chunk_blocks    # query blocks, padded
    self.side = math.ceil(self.radius / block)              # key blocks on each side
    self.width = block + 2 * self.radius                    # keys a query block sees
    self.start = self.side * block - self.radius            # first of them, in its windows

  @functools.cached_property
  def band(self):
    """[block, width]: whether each query of a block sees each key of its window."""
    offset = jnp.arange(self.width)[None, :] - self.radius - jnp.arange(self.block)[:, None]
    return jnp.abs(offset) <= self.radius

  def queries(self, x):
    """[batch, time, heads, dim] -> [chunks, batch, heads, chunk_blocks, block, dim]."""
    batch, length, heads, dim = x.shape
    x = jnp.pad(x, [(0, 0), (0, self.num_blocks * self.block - length), (0, 0), (0, 0)])
    x = x.reshape(batch, self.num_chunks, self.chunk_blocks, self.block, heads, dim)
    return jnp.transpose(x, (1, 0, 4, 2, 3, 5))

  def _key_blocks(self, x):
    """[batch, time, ...] -> [batch, side + blocks + side, block, ...]: zero (False) padded by
    `side` blocks at each end, so every chunk's neighbours exist, and up to whole blocks."""
    after = self.num_blocks * self.block - x.shape[1] + self.side * self.block
    x = jnp.pad(x, [(0, 0), (self.side * self.block, after)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((x.shape[0], -1, self.block) + x.shape[2:])

  def keys(self, x):
    """[batch, time, heads, dim] -> [batch, heads, side + blocks + side, block, dim]."""
    return jnp.transpose(self._key_blocks(x), (0, 3, 1, 2, 4))

  def unqueries(self, x, length: int):
    """The inverse of `queries`: [chunks, batch, heads, C, block, dim] -> [batch, time, heads,
    dim]."""
    x = jnp.transpose(x, (1, 0, 3, 4, 2, 5))                  # [batch, chunks, C, block, h, d]
    return x.reshape(x.shape[0], -1, x.shape[4], x.shape[5])[:, :length]

  def unkeys(self, x, length: int):
    """The inverse of `keys`: [batch, heads, side + blocks + side, block, dim] -> [batch, time,
    heads, dim]."""
    x = x[:, :, self.side:self.side + self.num_blocks]
    x = jnp.transpose(x, (0, 2, 3, 1, 4))
    return x.reshape(x.shape[0], -1, x.shape[3], x.shape[4])[:, :length]

  def key_mask(self, mask):
    """[batch, time] -> [batch, side + blocks + side, block] (False in the padding)."""
    return self._key_blocks(mask)

  def chunk_keys(self, x, chunk, axis: int):
    """The key blocks chunk `chunk` needs: chunk_blocks + 2*side blocks along `axis`."""
    return lax.dynamic_slice_in_dim(x, chunk * self.chunk_blocks,
                                    self.chunk_blocks + 2 * self.side, axis=axis)

  def windows(self, x, axis: int):
    """Key blocks [..., C + 2*side (axis), block, ...] -> [..., C (axis), width, ...]: row c
    holds the keys of query block c, from (its start - radius) to (its end + radius)."""
    shifted = [lax.slice_in_dim(x, s, s + self.chunk_blocks, axis=axis)
               for s in range(2 * self.side + 1)]
    return lax.slice_in_dim(jnp.concatenate(shifted, axis=axis + 1), self.start,
                            self.start + self.width, axis=axis + 1)

  def valid(self, mask_chunk):
    """Key-mask blocks of a chunk -> [batch, 1, C, block, width] bool: in the band and valid."""
    return self.band[None, None, None] & self.windows(mask_chunk, 1)[:, None, :, None, :]


def _chunk_probs(band, q_scaled, k, key_mask, chunk):
  """One chunk's masked logits, their valid mask and the chunk's key windows."""
  k_win = band.windows(band.chunk_keys(k, chunk, 2), 2)        # [batch, heads, C, width, dim]
  valid = band.valid(band.chunk_keys(key_mask, chunk, 1))      # [batch, 1, C, block, width]
  logits = jnp.einsum("bhcqd,bhckd->bhcqk", q_scaled, k_win,
                      preferred_element_type=jnp.float32)      # [batch, heads, C, block, width]
  return jnp.where(valid, logits, MASKED_LOGIT), valid, k_win


def _forward(band, q, k, v, key_mask, rng, rate):
  scale = q.shape[-1] ** -0.5
  k_blocks, v_blocks, mask_blocks = band.keys(k), band.keys(v), band.key_mask(key_mask)

  def step(_, xs):
    chunk, q_chunk = xs                                        # [batch, heads, C, block, dim]
    logits, valid, _ = _chunk_probs(band, q_chunk * scale, k_blocks, mask_blocks, chunk)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - peak) * valid                   # unnormalised
    normaliser = jnp.maximum(jnp.sum(weights, axis=-1, keepdims=True), 1e-30)
    if rate > 0.0:
      weights = weights * dropout_keep_mask(rng, chunk, rate, weights.shape) / (1.0 - rate)
    v_win = band.windows(band.chunk_keys(v_blocks, chunk, 2), 2)
    # Normalised after the weighted sum (block x dim values, not block x width weights): a
    # forward without the backward ran 1.75x faster at n = 4096 on the CPU this way, where
    # the normalised weights were otherwise fused into YNNPACK's matmul and computed slowly.
    out = jnp.einsum("bhcqk,bhckd->bhcqd", weights.astype(v.dtype), v_win)
    out = (out / normaliser).astype(v.dtype)
    return None, (out, (peak + jnp.log(normaliser))[..., 0])

  chunks = jnp.arange(band.num_chunks)
  _, (out, log_sum_exp) = lax.scan(step, None, (chunks, band.queries(q)))
  return out, log_sum_exp     # [chunks, batch, heads, C, block, dim], [chunks, ..., block]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _banded(q, k, v, key_mask, rng, window, block, rate):
  band = _Band(q.shape[1], window, block)
  return band.unqueries(_forward(band, q, k, v, key_mask, rng, rate)[0], q.shape[1])


def _banded_fwd(q, k, v, key_mask, rng, window, block, rate):
  band = _Band(q.shape[1], window, block)
  out_chunks, log_sum_exp = _forward(band, q, k, v, key_mask, rng, rate)
  out = band.unqueries(out_chunks, q.shape[1])
  return out, (q, k, v, key_mask, rng, out_chunks, log_sum_exp)


def _banded_bwd(window, block, rate, residuals, d_out):
  q, k, v, key_mask, rng, out_chunks, log_sum_exp = residuals
  length = q.shape[1]
  band = _Band(length, window, block)
  scale = q.shape[-1] ** -0.5
  k_blocks = band.keys(k).astype(jnp.float32)
  v_blocks = band.keys(v).astype(jnp.float32)
  mask_blocks = band.key_mask(key_mask)
  d_out = band.queries(d_out.astype(jnp.float32))              # [chunks, b, h, C, block, d]
  # sum_j dP_ij P_ij = dO_i . O_i (also with dropout: the kept weights give O).
  delta = jnp.sum(d_out * out_chunks.astype(jnp.float32), axis=-1)   # [chunks, b, h, C, block]

  def step(carry, xs):
    d_k_blocks, d_v_blocks = carry
    chunk, q_chunk, d_out_chunk, lse_chunk, delta_chunk = xs
    q_scaled = q_chunk.astype(jnp.float32) * scale
    logits, valid, k_win = _chunk_probs(band, q_scaled, k_blocks, mask_blocks, chunk)
    probs = jnp.exp(logits - lse_chunk[..., None]) * valid      # [b, h, C, block, width]
    v_keys = band.chunk_keys(v_blocks, chunk, 2)
    v_win, windows_vjp = jax.vjp(lambda x: band.windows(x, 2), v_keys)
    d_kept = jnp.einsum("bhcqd,bhckd->bhcqk", d_out_chunk, v_win)
    kept = probs
    if rate > 0.0:
      keep = dropout_keep_mask(rng, chunk, rate, probs.shape) / (1.0 - rate)
      kept, d_kept = probs * keep, d_kept * keep
    d_logits = probs * (d_kept - delta_chunk[..., None])
    d_q = jnp.einsum("bhcqk,bhckd->bhcqd", d_logits, k_win) * scale
    d_k_win = jnp.einsum("bhcqk,bhcqd->bhckd", d_logits, q_scaled)
    d_v_win = jnp.einsum("bhcqk,bhcqd->bhckd", kept, d_out_chunk)
    # The windows overlap: scatter each back onto its key blocks and add.
    (d_k_keys,), (d_v_keys,) = windows_vjp(d_k_win), windows_vjp(d_v_win)
    first = chunk * band.chunk_blocks
    add = lambda total, part: lax.dynamic_update_slice_in_dim(
        total, band.chunk_keys(total, chunk, 2) + part, first, axis=2)
    return (add(d_k_blocks, d_k_keys), add(d_v_blocks, d_v_keys)), d_q

  xs = (jnp.arange(band.num_chunks), band.queries(q), d_out, log_sum_exp, delta)
  (d_k, d_v), d_q = lax.scan(step, (jnp.zeros_like(k_blocks), jnp.zeros_like(v_blocks)), xs)
  return (band.unqueries(d_q, length).astype(q.dtype), band.unkeys(d_k, length).astype(k.dtype),
          band.unkeys(d_v, length).astype(v.dtype), None, None)


_banded.defvjp(_banded_fwd, _banded_bwd)




def local_attention(q, k, v, key_mask, window: int, dilation: int = 1, block_size: int = 0,
                    dropout_rate: float = 0.0, dropout_rng=None, implementation: str = "auto"):
  """Exact centred sliding-window attention.

  q, k, v: [batch, time, heads, head_dim] (q unscaled); key_mask: [batch, time] bool.
  dropout_rng: a PRNG key, needed when dropout_rate > 0.
  implementation: "auto" (the CPU kernel where it applies, else the XLA band), "xla" (the
  XLA band), "cpu" (the CPU kernel, or a ValueError naming why it cannot apply).
  Returns [batch, time, heads, head_dim] in v's dtype.
  """
  check_implementation("local", implementation)
  if window < 1 or window % 2 == 0:
    raise InvalidValue(f"local window must be odd and >= 1, got {window}")
  if dilation < 1:
    raise InvalidValue(f"local dilation must be >= 1, got {dilation}")
  dropout_rng = checked_dropout_rng("local attention", dropout_rate, dropout_rng)
  batch, length, heads, head_dim = q.shape
  if dilation > 1:
    # Fold the d residues mod d into the batch: [batch*d, ceil(time/d), heads, head_dim].
    padded_len = math.ceil(length / dilation) * dilation
    def fold(x):
      x = jnp.pad(x, [(0, 0), (0, padded_len - length)] + [(0, 0)] * (x.ndim - 2))
      x = x.reshape((batch, padded_len // dilation, dilation) + x.shape[2:])
      x = jnp.swapaxes(x, 1, 2)
      return x.reshape((batch * dilation, padded_len // dilation) + x.shape[3:])
    out = local_attention(fold(q), fold(k), fold(v), fold(key_mask), window, 1, block_size,
                          dropout_rate, dropout_rng, implementation)
    out = out.reshape(batch, dilation, padded_len // dilation, heads, head_dim)
    out = jnp.swapaxes(out, 1, 2).reshape(batch, padded_len, heads, head_dim)
    return out[:, :length]
  if window // 2 >= length - 1 and implementation != "cpu":
    # Every key is in every query's window: softmax attention over the valid keys, in one key
    # block (blockwise.py), without the band's padding to block + 2 * radius keys.
    return blockwise_attention(q, k, v, key_mask, length, dropout_rate, dropout_rng)
  block = block_size or default_block_size(window // 2, length)
  band = _Band(length, window, block)
  mask_elements = batch * heads * band.chunk_blocks * block * band.width  # a chunk's dropout mask
  if kernel_chosen("local", implementation, lambda: kernel_unsupported(
      q, window // 2, dropout_rate, dropout_rng, mask_elements)):
    return band_attention(q, k, v, key_mask.astype(bool), window // 2, dropout_rate,
                          dropout_rng, block, band.chunk_blocks, band.num_chunks).astype(v.dtype)
  return _banded(q, k, v, key_mask.astype(bool), dropout_rng, window, block,
                 float(dropout_rate))


class LocalAttention(nn.Module):
  window: int
  dilation: int = 1
  block_size: int = 0  # 0: default_block_size
  attention_dropout: float = 0.0
  implementation: str = "auto"   # one of cpu_kernels.IMPLEMENTATIONS

  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    rate = 0.0 if deterministic else self.attention_dropout
    rng = self.make_rng("dropout") if rate > 0.0 else None
    return local_attention(q, k, v, key_mask, self.window, self.dilation, self.block_size,
                           rate, rng, self.implementation)

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, k_len], dense (O(n^2): for the analyses, not for training)."""
    return attention_weights(q, k, band_mask(q.shape[1], self.window, self.dilation)[None, None]
                             & key_mask[:, None, None, :])


def band_mask(length: int, window: int, dilation: int = 1):
  """[length, length] bool: key j is in query i's window (j = i + d*m, |m| <= w//2)."""
  offset = jnp.arange(length)[None, :] - jnp.arange(length)[:, None]
  return (jnp.abs(offset) <= dilation * (window // 2)) & (offset % dilation == 0)
