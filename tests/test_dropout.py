"""The fusable dropout masks: the hash against a pure-Python reference, the statistics of the
masks (rates, uniform bits, no correlation between neighbours or keys), flax's arithmetic, and
the residual add that materialises the stream's cotangent."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.model import dropout as fusable

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4, 5), (8, 4, 25, 33)]
KEYS = {"raw": jax.random.PRNGKey(0), "raw_large_seed": jax.random.PRNGKey(2 ** 40 + 17),
        "typed": jax.random.key(5), "folded": jax.random.fold_in(jax.random.PRNGKey(3), 11)}
MASK = 0xFFFFFFFF


def _lowbias32_reference(x: int) -> int:
  """lowbias32 as published (hash-prospector), on Python ints."""
  x ^= x >> 16
  x = (x * 0x7FEB352D) & MASK
  x ^= x >> 15
  x = (x * 0x846CA68B) & MASK
  return x ^ (x >> 16)


def test_lowbias32_matches_the_reference_and_is_a_bijection():
  values = np.array([0, 1, 2, 3, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, MASK], np.uint32)
  got = np.asarray(fusable.lowbias32(jnp.asarray(values)))
  assert [int(v) for v in got] == [_lowbias32_reference(int(v)) for v in values]
  block = np.asarray(fusable.lowbias32(jnp.arange(2 ** 20, dtype=jnp.uint32) * 4099))
  assert len(np.unique(block)) == 2 ** 20            # distinct inputs, distinct outputs


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("key_name", sorted(KEYS))
def test_random_bits_hash_the_row_major_index_under_the_key_words(shape, key_name):
  key = KEYS[key_name]
  data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
  word0, word1 = (int(w) for w in np.asarray(data))
  expected = np.array([_lowbias32_reference(_lowbias32_reference(i ^ word0) ^ word1)
                       for i in range(int(np.prod(shape)))], np.uint32).reshape(shape)
  got = jax.jit(fusable.random_bits, static_argnums=1)(key, shape)
  assert got.dtype == jnp.uint32 and got.shape == shape
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_rate(p):
  shape = (4, 3, 50, 61)
  n = int(np.prod(shape))
  for seed in range(3):
    mask = np.asarray(fusable.bernoulli(jax.random.PRNGKey(seed), p, shape))
    assert abs(mask.mean() - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_bits_are_uniform():
  """Each of the 32 bits is set half the time, and the top byte (the part the Bernoulli
  comparison reads first) is uniform over its 256 values (chi-square, df 255)."""
  n = 1 << 18
  bits = np.asarray(fusable.random_bits(jax.random.PRNGKey(7), (n,)))
  ones = np.unpackbits(bits.view(np.uint8)).reshape(n, 32).mean(axis=0)
  assert np.all(np.abs(ones - 0.5) < 5 * 0.5 / np.sqrt(n)), ones
  counts = np.bincount(bits >> 24, minlength=256)
  chi2 = np.sum((counts - n / 256) ** 2 / (n / 256))
  assert chi2 < 400, chi2                            # P(chi2_255 > 400) ~ 1e-8


def _correlation(a, b):
  return float(np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1])


def test_masks_are_uncorrelated_between_neighbours_and_keys():
  """Within a mask: elements next to each other along every axis; between masks: keys of
  successive layers (split), of chunks (fold_in 0, 1, 2) and of successive steps."""
  shape = (8, 4, 64, 128)
  n = int(np.prod(shape))
  bound = 5 / np.sqrt(n)
  key = jax.random.PRNGKey(1)
  mask = np.asarray(fusable.bernoulli(key, 0.9, shape))
  for axis in range(len(shape)):
    lead = np.take(mask, np.arange(shape[axis] - 1), axis=axis)
    follow = np.take(mask, np.arange(1, shape[axis]), axis=axis)
    assert abs(_correlation(lead, follow)) < 5 / np.sqrt(lead.size)
  others = [*jax.random.split(key, 3), *(jax.random.fold_in(key, i) for i in range(3)),
            jax.random.split(jax.random.split(key)[0])[1]]
  for other in others:
    assert abs(_correlation(mask, np.asarray(fusable.bernoulli(other, 0.9, shape)))) < bound


def test_same_key_same_mask_other_key_other_mask():
  key = jax.random.PRNGKey(4)
  shape = (16, 33)
  np.testing.assert_array_equal(fusable.bernoulli(key, 0.5, shape),
                                jax.jit(fusable.bernoulli, static_argnums=(1, 2))(key, 0.5, shape))
  assert not np.array_equal(fusable.bernoulli(key, 0.5, shape),
                            fusable.bernoulli(jax.random.fold_in(key, 1), 0.5, shape))


def test_other_key_kinds_fall_back_to_jax_random():
  key = jax.random.key(9, impl="rbg")
  np.testing.assert_array_equal(fusable.random_bits(key, (5, 6)),
                                jax.random.bits(key, (5, 6), jnp.uint32))


class _Net(nn.Module):
  dropout_class: type

  @nn.compact
  def __call__(self, x, deterministic):
    x = self.dropout_class(0.3)(x, deterministic=deterministic)
    x = nn.Dense(16)(x)
    return self.dropout_class(0.1)(x, deterministic=deterministic)


def test_module_uses_flax_dropouts_key_and_arithmetic():
  """The same rng stream and scaling as flax.linen.Dropout; evaluation is the identity."""
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 9, 16))
  ours, flax_net = _Net(fusable.Dropout), _Net(nn.Dropout)
  params = flax_net.init(jax.random.PRNGKey(1), x, True)
  np.testing.assert_array_equal(ours.apply(params, x, True), flax_net.apply(params, x, True))
  rngs = {"dropout": jax.random.PRNGKey(2)}
  got = ours.apply(params, x, False, rngs=rngs)
  np.testing.assert_array_equal(got, ours.apply(params, x, False, rngs=rngs))
  assert not np.array_equal(got, ours.apply(params, x, False,
                                            rngs={"dropout": jax.random.PRNGKey(3)}))
  # The first layer's key is flax's: fold the module path into the stream like flax does.
  layer = fusable.Dropout(0.3)
  key = layer.apply({}, x, False, rngs=rngs, method=lambda m, x, d: m.make_rng("dropout"))
  flax_key = nn.Dropout(0.3).apply({}, x, False, rngs=rngs,
                                   method=lambda m, x, d: m.make_rng("dropout"))
  np.testing.assert_array_equal(key, flax_key)
  keep = np.asarray(fusable.bernoulli(key, 0.7, x.shape))
  np.testing.assert_allclose(layer.apply({}, x, False, rngs=rngs), np.where(keep, x / 0.7, 0),
                             rtol=1e-6)


def test_dropout_scales_kept_values_and_rejects_bad_rates():
  x = jnp.ones((1000,))
  y = fusable.dropout(x, 0.25, jax.random.PRNGKey(0))
  kept = np.asarray(y) != 0
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / 0.75)
  assert fusable.dropout(x, 0.0, None) is x
  np.testing.assert_array_equal(fusable.dropout(x, 1.0, jax.random.PRNGKey(0)), 0.0)
  with pytest.raises(ValueError, match="dropout rate must be in"):
    fusable.Dropout(1.5).apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(0)})


def _stack(add, x, weights, key):
  """A pre-LN-like residual stack with dropout on each branch."""
  for i, w in enumerate(weights):
    branch = fusable.dropout(jnp.tanh(x @ w), 0.1, jax.random.fold_in(key, i))
    x = add(x, branch)
  return jnp.sum(x * x)


def test_add_residual_keeps_values_and_gradients_and_materialises_the_cotangent():
  key = jax.random.PRNGKey(0)
  x = jax.random.normal(key, (2, 7, 8))
  weights = [jax.random.normal(jax.random.fold_in(key, i), (8, 8)) * 0.3 for i in range(4)]
  plain = jax.jit(jax.value_and_grad(functools.partial(_stack, jnp.add), argnums=(0, 1)))
  ours = jax.jit(jax.value_and_grad(functools.partial(_stack, fusable.add_residual),
                                    argnums=(0, 1)))
  (value, grads), (expected_value, expected_grads) = ours(x, weights, key), plain(x, weights, key)
  np.testing.assert_array_equal(value, expected_value)
  jax.tree_util.tree_map(np.testing.assert_array_equal, grads, expected_grads)
  # On the CPU each residual's cotangent goes through a conditional that XLA keeps; a NaN in
  # the cotangent makes it NaN everywhere (the update is discarded anyway), never finite.
  # Elsewhere add_residual is the plain add, checked equal above.
  materialised = jax.default_backend() in fusable.MATERIALISE_ON
  hlo = ours.lower(x, weights, key).compile().as_text()
  assert hlo.count(" conditional(") == (len(weights) if materialised else 0)
  if materialised:
    nan_x = x.at[0, 0, 0].set(jnp.nan)
    assert not np.isfinite(np.asarray(ours(nan_x, weights, key)[1][0])).any()
  empty = jnp.zeros((0, 8))
  np.testing.assert_array_equal(jax.grad(lambda a: jnp.sum(fusable.add_residual(a, a)))(empty),
                                empty)
