"""`local(w[,d])` heads: an exact centred sliding window, computed blockwise.

Query i attends to keys j = i + d*m with |m| <= w//2 (w odd, d the dilation). Queries are cut
into blocks of `block` positions; each block attends to its own keys plus `radius` keys on each
side, so memory and time grow as O(n * (block + 2*radius)) and no n x n matrix is ever formed.
A dilated window is the undilated window on each of the d interleaved subsequences
(positions with the same residue mod d), which keeps it O(n * w) as well.
"""

import math

import flax.linen as nn
import jax.numpy as jnp

from multiformer_jax.attention.full import attention_weights
from multiformer_jax.attention.masks import masked_softmax

MIN_BLOCK = 16


def default_block_size(radius: int, length: int) -> int:
  """Blocks as wide as the radius (at least MIN_BLOCK), never longer than the sequence."""
  return max(1, min(max(radius, MIN_BLOCK), length))


def _neighbour_windows(x, num_side: int, start: int, width: int):
  """x: [batch, blocks, block, ...] -> [batch, blocks, width, ...].

  Row b of the result is the concatenation of blocks b-num_side .. b+num_side (zeros beyond
  the ends), cut to [start, start + width).
  """
  pad = [(0, 0)] * x.ndim
  pad[1] = (num_side, num_side)
  padded = jnp.pad(x, pad)
  blocks = x.shape[1]
  shifted = [padded[:, s:s + blocks] for s in range(2 * num_side + 1)]
  return jnp.concatenate(shifted, axis=2)[:, :, start:start + width]


def local_attention(q, k, v, key_mask, window: int, dilation: int = 1, block_size: int = 0,
                    dropout=None, deterministic: bool = True):
  """Exact centred sliding-window attention.

  q, k, v: [batch, time, heads, head_dim]; key_mask: [batch, time] bool.
  Returns [batch, time, heads, head_dim].
  """
  if window < 1 or window % 2 == 0:
    raise ValueError(f"local window must be odd and >= 1, got {window}")
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
                          dropout, deterministic)
    out = out.reshape(batch, dilation, padded_len // dilation, heads, head_dim)
    out = jnp.swapaxes(out, 1, 2).reshape(batch, padded_len, heads, head_dim)
    return out[:, :length]

  radius = window // 2
  block = block_size or default_block_size(radius, length)
  num_blocks = math.ceil(length / block)
  padded_len = num_blocks * block
  pad_time = [(0, 0), (0, padded_len - length)]
  q = jnp.pad(q, pad_time + [(0, 0), (0, 0)]).reshape(batch, num_blocks, block, heads, head_dim)
  k = jnp.pad(k, pad_time + [(0, 0), (0, 0)]).reshape(batch, num_blocks, block, heads, head_dim)
  v = jnp.pad(v, pad_time + [(0, 0), (0, 0)]).reshape(batch, num_blocks, block, heads, head_dim)
  key_mask = jnp.pad(key_mask, pad_time).reshape(batch, num_blocks, block)

  num_side = math.ceil(radius / block)
  width = block + 2 * radius
  start = num_side * block - radius
  k_win = _neighbour_windows(k, num_side, start, width)          # [batch, blocks, width, h, d]
  v_win = _neighbour_windows(v, num_side, start, width)          # [batch, blocks, width, h, d]
  m_win = _neighbour_windows(key_mask, num_side, start, width)   # [batch, blocks, width]

  # Key slot j of a block's window holds position (block start - radius + j); query slot i holds
  # (block start + i); the band keeps |j - radius - i| <= radius.
  offset = jnp.arange(width)[None, :] - radius - jnp.arange(block)[:, None]  # [block, width]
  band = jnp.abs(offset) <= radius
  mask = band[None, None, None] & m_win[:, :, None, None, :]  # [batch, blocks, 1, block, width]

  scale = head_dim ** -0.5
  logits = jnp.einsum("bnqhd,bnkhd->bnhqk", q * scale, k_win,
                      preferred_element_type=jnp.float32)      # [batch, blocks, h, block, width]
  weights = masked_softmax(logits, mask)
  if dropout is not None:
    weights = dropout(weights, deterministic=deterministic)
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", weights.astype(v.dtype), v_win)
  return out.reshape(batch, padded_len, heads, head_dim)[:, :length]


class LocalAttention(nn.Module):
  window: int
  dilation: int = 1
  block_size: int = 0  # 0: default_block_size
  attention_dropout: float = 0.0

  @nn.compact
  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    return local_attention(q, k, v, key_mask, self.window, self.dilation, self.block_size,
                           nn.Dropout(self.attention_dropout), deterministic)

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, k_len], dense (O(n^2): for the analyses, not for training)."""
    return attention_weights(q, k, band_mask(q.shape[1], self.window, self.dilation)[None, None]
                             & key_mask[:, None, None, :])


def band_mask(length: int, window: int, dilation: int = 1):
  """[length, length] bool: key j is in query i's window (j = i + d*m, |m| <= w//2)."""
  offset = jnp.arange(length)[None, :] - jnp.arange(length)[:, None]
  return (jnp.abs(offset) <= dilation * (window // 2)) & (offset % dilation == 0)
