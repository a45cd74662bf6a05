"""`local(w,thesis)` heads: the thesis's blocked window (lucidrains' local-attention 1.4.3, as
mt-upc/fairseq's multiformer branch configures it: buckets of w//3, one bucket back and one
forward, autopad, no rotary embedding).

The sequence is cut into buckets of b = w//3 positions (zero-padded to a whole number); a query
sees the 3b keys of its own bucket and its two neighbours, so where it sits in its bucket decides
how far it sees on each side (between b and 2b - 1 positions), not a centred window. Logits are
scaled by head_dim^-1/2; a masked entry gets float32's most negative number (not -inf), so a
query with no valid key (a padded one) spreads uniform weights over all 3b entries, the missing
buckets at the sequence's edges counting as keys and values of -1: what the reference outputs
at padded positions, which later thesis heads (unmasked Performer, compressed keys) read.
"""

import flax.linen as nn
import jax.numpy as jnp

from multiformer_jax.model.attention.masks import masked_softmax
from multiformer_jax.model.dropout import Dropout

# local-attention's masked logit: -finfo(float32).max, finite.
REFERENCE_MASK_VALUE = float(jnp.finfo(jnp.float32).min)
EDGE_VALUE = -1.0        # local-attention's `look_around` pad value for keys and values


def thesis_bucket(window: int) -> int:
  """The reference's bucket size for the thesis's Local(w): w // 3."""
  return window // 3


def _look_around(x, pad_value):
  """[batch, buckets, bucket, ...] -> [batch, buckets, 3 * bucket, ...]: each bucket with the
  one before and the one after it (pad_value beyond the edges)."""
  widths = [(0, 0)] * x.ndim
  widths[1] = (1, 1)
  padded = jnp.pad(x, widths, constant_values=pad_value)
  buckets = x.shape[1]
  return jnp.concatenate([padded[:, i:i + buckets] for i in range(3)], axis=2)


def blocked_local_attention(q, k, v, key_mask, bucket: int, dropout=None,
                            deterministic: bool = True):
  """q, k, v: [batch, time, heads, head_dim], key_mask [batch, time] bool (prefix) ->
  [batch, time, heads, head_dim]."""
  batch, length, heads, head_dim = q.shape
  buckets = -(-length // bucket)
  pad = buckets * bucket - length

  def bucketed(x, value=0.0):
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    x = jnp.pad(x, widths, constant_values=value)
    return x.reshape(batch, buckets, bucket, *x.shape[2:])

  qb = bucketed(q)                                           # [batch, n, b, heads, dim]
  kb = _look_around(bucketed(k), EDGE_VALUE)                 # [batch, n, 3b, heads, dim]
  vb = _look_around(bucketed(v), EDGE_VALUE)
  valid = bucketed(key_mask, False)                          # [batch, n, b]
  allowed = valid[:, :, :, None] & _look_around(valid, False)[:, :, None, :]   # [b, n, b, 3b]
  logits = jnp.einsum("bnihd,bnjhd->bnhij", qb, kb,
                      preferred_element_type=jnp.float32) * head_dim ** -0.5
  logits = jnp.where(allowed[:, :, None], logits, REFERENCE_MASK_VALUE)
  weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  weights = weights / jnp.sum(weights, axis=-1, keepdims=True)     # [batch, n, heads, b, 3b]
  if dropout is not None:
    weights = dropout(weights, deterministic=deterministic)
  out = jnp.einsum("bnhij,bnjhd->bnihd", weights.astype(v.dtype), vb)
  return out.reshape(batch, buckets * bucket, heads, head_dim)[:, :length]


def blocked_band_mask(length: int, bucket: int):
  """[length, length] bool: key j is in query i's three buckets."""
  position_bucket = jnp.arange(length) // bucket
  return jnp.abs(position_bucket[:, None] - position_bucket[None, :]) <= 1


class ThesisLocalAttention(nn.Module):
  window: int                 # the thesis's W; buckets of W // 3
  attention_dropout: float = 0.0

  @nn.compact
  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    return blocked_local_attention(q, k, v, key_mask, thesis_bucket(self.window),
                                   Dropout(self.attention_dropout), deterministic)

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, k_len], dense (for the analyses): a valid query's weights."""
    scale = q.shape[-1] ** -0.5
    logits = jnp.einsum("bqhd,bkhd->bhqk", q * scale, k, preferred_element_type=jnp.float32)
    mask = (blocked_band_mask(q.shape[1], thesis_bucket(self.window))[None, None]
            & key_mask[:, None, None, :])
    return masked_softmax(logits, mask)
