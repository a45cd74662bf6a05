"""Dropout with the masks of `jax.random.bernoulli`, drawn by a hash that XLA can fuse.

JAX lowers its threefry2x32 hash on the CPU as a rolled while loop of five iterations (it
saves compile time). Every iteration reads and writes both counter arrays at the mask's full
size, and the loop keeps XLA from fusing the hash into the mask's consumer. In an
s2t_transformer_s update on a 2-core CPU that made dropout about a quarter of the step
(docs/benchmarks_notes.md, "Dropout masks"). Here the same hash is written out with jnp
operations, which XLA fuses into one elementwise kernel together with the select.

The bits are exactly those of `jax.random.bits(key, shape)` (and the masks those of
`jax.random.bernoulli`, and `Dropout` is `flax.linen.Dropout` draw for draw) for threefry keys
with `jax_threefry_partitionable` on, the default since jax 0.5. Other keys, the older counter
layout and masks of 2**32 elements or more fall back to `jax.random`.

`add_residual` is the residual add of the encoder and decoder layers: on the CPU it keeps XLA
from recomputing these masks, and the stream's cotangent, once per later layer.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Threefry-2x32 with 20 rounds (Salmon et al., 2011), as in jax/_src/random/threefry2x32.py.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x, bits: int):
  return lax.shift_left(x, np.uint32(bits)) | lax.shift_right_logical(x, np.uint32(32 - bits))


def threefry2x32(key0, key1, x0, x1):
  """The threefry2x32 hash of the counter pairs (x0, x1) (uint32 arrays) under the key words
  (key0, key1), unrolled: five groups of four rounds, each followed by a key injection."""
  keys = (key0, key1, key0 ^ key1 ^ _KEY_PARITY)
  x0, x1 = x0 + keys[0], x1 + keys[1]
  for group in range(5):
    for rotation in _ROTATIONS[group % 2]:
      x0 = x0 + x1
      x1 = x0 ^ _rotate_left(x1, rotation)
    x0 = x0 + keys[(group + 1) % 3]
    x1 = x1 + keys[(group + 2) % 3] + np.uint32(group + 1)
  return x0, x1


def _threefry_key_words(key):
  """The two uint32 words of a threefry key (typed or raw), or None for any other key."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if str(jax.random.key_impl(key)) != "threefry2x32":
      return None
    key = jax.random.key_data(key)
  elif jax.config.jax_default_prng_impl != "threefry2x32":
    return None
  if key.shape != (2,) or key.dtype != jnp.uint32:
    return None
  return key[0], key[1]


def random_bits(key, shape) -> jax.Array:
  """uint32[shape], equal to `jax.random.bits(key, shape)`.

  For a threefry key the counters are the elements' row-major indices (the partitionable
  layout), hashed and folded as x0 ^ x1, all in one fusable expression."""
  shape = tuple(shape)
  words = _threefry_key_words(key)
  size = math.prod(shape)
  if words is None or not jax.config.jax_threefry_partitionable or size >= 2 ** 32:
    return jax.random.bits(key, shape, jnp.uint32)
  counter = lax.iota(jnp.uint32, size).reshape(shape)     # row-major index; high word 0
  x0, x1 = threefry2x32(words[0], words[1], jnp.zeros(shape, jnp.uint32), counter)
  return x0 ^ x1


def bernoulli(key, p: float, shape) -> jax.Array:
  """bool[shape], True with probability p: equal to `jax.random.bernoulli(key, p, shape)`
  (a float32 uniform in [0, 1) from the top 23 bits, compared with p)."""
  mantissa = lax.shift_right_logical(random_bits(key, shape), np.uint32(9))
  one = np.array(1.0, np.float32).view(np.uint32)
  uniform = lax.bitcast_convert_type(mantissa | one, jnp.float32) - np.float32(1.0)
  return uniform < jnp.float32(p)


def dropout(x, rate: float, key):
  """Zero each element with probability `rate`, scale the rest by 1 / (1 - rate)
  (flax.linen.Dropout's arithmetic). rate 0 returns x."""
  if rate == 0.0:
    return x
  if rate == 1.0:
    return jnp.zeros_like(x)
  keep = 1.0 - rate
  return lax.select(bernoulli(key, keep, x.shape), x / keep, jnp.zeros_like(x))


def add_residual(x, branch):
  """x + branch on a residual stream; on the CPU its cotangent is materialised once.

  The backward of a pre-LN stack sums the stream's cotangent over the layers in a chain of adds
  whose terms carry dropout masks (the hash above: cheap elementwise work to XLA). XLA:CPU fuses
  that whole chain into each consumer that reads the cotangent in another layout (the
  transposed operand of the out-projection's weight-gradient dot), so layer l recomputes the
  cotangents and masks of every later layer: O(layers^2) work, 13% of an s2t_transformer_s
  update on a 2-core CPU. `lax.optimization_barrier` does not stop it (XLA:CPU expands barriers
  before fusing); a conditional does, its operand and result being buffers. Values and finite
  gradients are unchanged; see `_materialised_bwd` for the one non-finite difference.
  """
  out = x + branch
  return _materialised_cotangent(out) if jax.default_backend() == "cpu" else out


@jax.custom_vjp
def _materialised_cotangent(x):
  return x


def _materialised_fwd(x):
  return x, None


def _materialised_bwd(_, cotangent):
  """The cotangent, through a conditional that XLA keeps: an identity branch, and one (taken
  only when the first element is NaN, i.e. in a non-finite update, which the train step
  discards) that makes the whole cotangent NaN. A branch that is the identity as well would be
  folded away with the conditional."""
  if cotangent.size == 0:
    return (cotangent,)
  first = cotangent.reshape(-1)[0]
  return (lax.cond(jnp.isnan(first), lambda c: c + first, lambda c: c, cotangent),)


_materialised_cotangent.defvjp(_materialised_fwd, _materialised_bwd)


class Dropout(nn.Module):
  """`flax.linen.Dropout` (without broadcast_dims) with the fusable mask: the same key from
  the `dropout` rng collection, the same mask, the same output."""
  rate: float

  @nn.compact
  def __call__(self, inputs, deterministic: bool = True):
    if not 0.0 <= self.rate <= 1.0:
      raise ValueError(f"dropout rate must be in [0, 1], got {self.rate}")
    if self.rate == 0.0 or deterministic:
      return inputs
    return dropout(inputs, self.rate, self.make_rng("dropout"))
