"""fairseq's sinusoidal positional embedding, computed on the fly for any length.

half = d/2, freq_i = exp(-i * ln(10000) / (half - 1)), embedding = concat(sin, cos) (not
interleaved). Valid position t (0-based) uses index t + pad_id + 1 (fairseq's offset, so 2);
padded positions get zeros.
"""

import math

import jax.numpy as jnp

from multiformer_common.token_ids import PAD_ID as FAIRSEQ_PAD_ID


def sinusoidal_embedding(positions, dim: int):
  """positions: [...] numbers -> [..., dim] float32."""
  half = dim // 2
  freqs = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -(math.log(10000.0) / (half - 1)))
  angles = jnp.asarray(positions, jnp.float32)[..., None] * freqs
  emb = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  if dim % 2:
    emb = jnp.pad(emb, [(0, 0)] * (emb.ndim - 1) + [(0, 1)])
  return emb


def padded_positions(mask, dim: int, offset: int = 0):
  """mask: [batch, time] bool (right-padded) -> [batch, time, dim] embeddings, zeros at pads.

  `offset` shifts the 0-based time index (incremental decoding at step `offset`).
  """
  index = jnp.arange(mask.shape[1])[None, :] + offset + FAIRSEQ_PAD_ID + 1
  return sinusoidal_embedding(index, dim) * mask[..., None]
