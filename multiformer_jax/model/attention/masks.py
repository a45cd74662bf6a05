"""Masks and length arithmetic shared by every attention kind (the one place they live).

Masks are boolean, True where a position is valid. Sequences are right-padded, so a key mask
is a prefix mask and its sum is the length.
"""

import jax.numpy as jnp

# Added to masked logits instead of -inf: finite, so a row with no valid key gives a uniform
# (finite) distribution rather than NaN. Such rows only occur at padded query positions.
MASKED_LOGIT = -1e30


def lengths_to_mask(lengths, max_len: int):
  """[batch] int lengths -> [batch, max_len] bool, True at valid positions."""
  return jnp.arange(max_len)[None, :] < jnp.asarray(lengths)[:, None]


def conv_output_lengths(lengths, kernel: int, stride: int, padding: int):
  """Length after a Conv1d with symmetric zero padding (PyTorch/XLA arithmetic)."""
  return (lengths + 2 * padding - kernel) // stride + 1


def masked_softmax(logits, mask):
  """Softmax over the last axis in float32, masked positions get zero weight."""
  logits = jnp.where(mask, logits.astype(jnp.float32), MASKED_LOGIT)
  logits = logits - jnp.max(logits, axis=-1, keepdims=True)
  weights = jnp.exp(logits) * mask
  return weights / jnp.maximum(jnp.sum(weights, axis=-1, keepdims=True), 1e-30)


def causal_mask(length: int):
  """[length, length] bool, True where key j <= query i."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))
