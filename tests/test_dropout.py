"""The fusable dropout masks draw exactly what jax.random and flax.linen.Dropout draw."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import dropout as fusable

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4, 5), (8, 4, 25, 33)]
KEYS = {"raw": jax.random.PRNGKey(0), "raw_large_seed": jax.random.PRNGKey(2 ** 40 + 17),
        "typed": jax.random.key(5), "folded": jax.random.fold_in(jax.random.PRNGKey(3), 11)}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("key_name", sorted(KEYS))
def test_random_bits_equal_jax_random_bits(shape, key_name):
  key = KEYS[key_name]
  expected = jax.random.bits(key, shape, jnp.uint32)
  np.testing.assert_array_equal(jax.jit(fusable.random_bits, static_argnums=1)(key, shape),
                                expected)


def test_threefry2x32_known_answer():
  """The Random123 known-answer vector for threefry2x32 with 20 rounds (key and counters all
  0xffffffff), as in jax's own tests."""
  word = np.uint32(0xFFFFFFFF)
  x0, x1 = fusable.threefry2x32(word, word, jnp.array([word]), jnp.array([word]))
  assert (int(x0[0]), int(x1[0])) == (0x1CB996FC, 0xBB002BE7)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_equals_jax_random_bernoulli(p):
  key = jax.random.PRNGKey(42)
  shape = (4, 3, 50, 61)
  mask = fusable.bernoulli(key, p, shape)
  np.testing.assert_array_equal(mask, jax.random.bernoulli(key, p, shape))
  assert abs(float(mask.mean()) - p) < 0.01


def test_other_key_kinds_fall_back_to_jax_random():
  key = jax.random.key(9, impl="rbg")
  np.testing.assert_array_equal(fusable.random_bits(key, (5, 6)),
                                jax.random.bits(key, (5, 6), jnp.uint32))
  np.testing.assert_array_equal(fusable.bernoulli(key, 0.3, (5, 6)),
                                jax.random.bernoulli(key, 0.3, (5, 6)))


class _Net(nn.Module):
  dropout_class: type

  @nn.compact
  def __call__(self, x, deterministic):
    x = self.dropout_class(0.3)(x, deterministic=deterministic)
    x = nn.Dense(16)(x)
    return self.dropout_class(0.1)(x, deterministic=deterministic)


def test_module_equals_flax_dropout_draw_for_draw():
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 9, 16))
  ours, flax_net = _Net(fusable.Dropout), _Net(nn.Dropout)
  params = flax_net.init(jax.random.PRNGKey(1), x, True)
  rngs = {"dropout": jax.random.PRNGKey(2)}
  expected = flax_net.apply(params, x, False, rngs=rngs)
  np.testing.assert_array_equal(ours.apply(params, x, False, rngs=rngs), expected)
  np.testing.assert_array_equal(ours.apply(params, x, True), flax_net.apply(params, x, True))
  assert not np.array_equal(expected, flax_net.apply(params, x, True))


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
  hlo = ours.lower(x, weights, key).compile().as_text()
  assert hlo.count(" conditional(") == (len(weights) if jax.default_backend() == "cpu" else 0)
  nan_x = x.at[0, 0, 0].set(jnp.nan)
  assert not np.isfinite(np.asarray(ours(nan_x, weights, key)[1][0])).any()
  empty = jnp.zeros((0, 8))
  np.testing.assert_array_equal(jax.grad(lambda a: jnp.sum(fusable.add_residual(a, a)))(empty),
                                empty)
