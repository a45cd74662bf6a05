"""Dropout whose masks come from a cheap counter hash that XLA fuses into the mask's consumer.

Each mask element hashes its row-major index under the two words of the layer's `jax.random`
key (from flax's `dropout` rng stream, split and folded as usual): lowbias32(lowbias32(index ^
word0) ^ word1), with lowbias32 the 32-bit integer finaliser of C. Wellons' hash-prospector
(two xor-shift-multiply rounds and a final xor-shift). For a fixed key the map from index to
bits is a bijection of the 32-bit integers; masks of different keys are independent to every
test in tests/test_dropout.py (rates, uniformity of the bits, correlation between neighbours
and between keys).

Why not `jax.random.bernoulli`: its threefry2x32 hash is 20 rounds of add-rotate-xor per
element, several times the cost of this one even when XLA fuses it (measurements in
docs/notes/benchmarks-lab-notebook.md). The masks are therefore not jax.random's draws: the same key gives
other (equally distributed) masks than flax.linen.Dropout. Keys of other PRNG implementations and masks of 2**32
elements or more use `jax.random.bits`.

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

from multiformer_common.errors import InvalidValue

# lowbias32 (hash-prospector, public domain): bias 0.17 by its author's avalanche measure.
_LOWBIAS32_SHIFTS = (16, 15, 16)
_LOWBIAS32_MULTIPLIERS = (np.uint32(0x7FEB352D), np.uint32(0x846CA68B))


def lowbias32(x):
  """The lowbias32 integer hash of a uint32 array (a bijection of the 32-bit integers)."""
  for shift, multiplier in zip(_LOWBIAS32_SHIFTS, _LOWBIAS32_MULTIPLIERS):
    x = (x ^ lax.shift_right_logical(x, np.uint32(shift))) * multiplier
  return x ^ lax.shift_right_logical(x, np.uint32(_LOWBIAS32_SHIFTS[-1]))


def threefry_key_words(key):
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
  """uint32[shape]: lowbias32(lowbias32(index ^ key word 0) ^ key word 1) of each element's
  row-major index, one fusable elementwise expression (`jax.random.bits` for keys that are not
  threefry keys and for 2**32 elements or more)."""
  shape = tuple(shape)
  words = threefry_key_words(key)
  size = math.prod(shape)
  if words is None or size >= 2 ** 32:
    return jax.random.bits(key, shape, jnp.uint32)
  index = lax.iota(jnp.uint32, size).reshape(shape)
  return lowbias32(lowbias32(index ^ words[0]) ^ words[1])


def bernoulli(key, p: float, shape) -> jax.Array:
  """bool[shape], True with probability p: a float32 uniform in [0, 1) from the top 23 bits of
  `random_bits`, compared with p (jax.random.bernoulli's arithmetic on other bits)."""
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
  return _materialised_cotangent(out) if jax.default_backend() in MATERIALISE_ON else out


# The backends on which add_residual materialises the cotangent (benchmarks/train_step.py
# --materialise_residual_on_gpu measures the GPU with it).
MATERIALISE_ON = ("cpu",)


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
  the `dropout` rng collection and the same arithmetic, other draws."""
  rate: float

  @nn.compact
  def __call__(self, inputs, deterministic: bool = True):
    if not 0.0 <= self.rate <= 1.0:
      raise InvalidValue(f"dropout rate must be in [0, 1], got {self.rate}")
    if self.rate == 0.0 or deterministic:
      return inputs
    return dropout(inputs, self.rate, self.make_rng("dropout"))

  def key(self):
    """The key a call would draw its mask from (for kernels that draw the same mask)."""
    return self.make_rng("dropout")
