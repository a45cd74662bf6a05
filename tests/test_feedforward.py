"""The unchunked FFN's custom VJP: the same outputs, masks and gradients as the flax.linen
composition it replaced (with the fusable Dropout), and a backward that does not hash the
hidden dropout mask again."""

import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.model.dropout import Dropout
from multiformer_jax.model.feedforward import FeedForward
from multiformer_jax.model.initializers import torch_default_bias, torch_default_kernel


class FlaxFeedForward(nn.Module):
  """The reference: flax.linen's Dense and the Dropout module, named as FeedForward names its
  parts."""
  d_model: int
  ffn_dim: int
  dropout: float
  activation_dropout: float
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic=True):
    h = nn.Dense(self.ffn_dim, kernel_init=torch_default_kernel, dtype=self.dtype,
                 bias_init=torch_default_bias(self.d_model), name="fc1")(x)
    h = Dropout(self.activation_dropout)(nn.relu(h), deterministic=deterministic)
    h = nn.Dense(self.d_model, kernel_init=torch_default_kernel, dtype=self.dtype,
                 bias_init=torch_default_bias(self.ffn_dim), name="fc2")(h)
    return Dropout(self.dropout)(h, deterministic=deterministic)


def _loss(module, deterministic):
  rngs = {"dropout": jax.random.PRNGKey(5)}
  return lambda p, x: jnp.sum(jnp.sin(module.apply(p, x, deterministic, rngs=rngs)))


@pytest.mark.parametrize("dropout, activation_dropout", [(0.2, 0.3), (0.0, 0.3), (0.2, 0.0),
                                                         (0.0, 0.0)])
@pytest.mark.parametrize("deterministic", [True, False])
def test_equals_flax_composition_draw_for_draw(dropout, activation_dropout, deterministic):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 7, 8)), jnp.float32)
  ours = FeedForward(8, 32, dropout, activation_dropout)
  reference = FlaxFeedForward(8, 32, dropout, activation_dropout)
  params = ours.init(jax.random.PRNGKey(1), x)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params,
                         reference.init(jax.random.PRNGKey(1), x))
  rngs = {"dropout": jax.random.PRNGKey(5)}
  np.testing.assert_array_equal(ours.apply(params, x, deterministic, rngs=rngs),
                                reference.apply(params, x, deterministic, rngs=rngs))
  got = jax.grad(_loss(ours, deterministic), (0, 1))(params, x)
  want = jax.grad(_loss(reference, deterministic), (0, 1))(params, x)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(g, w, atol=2e-6, rtol=1e-6)


def test_bfloat16_compute_matches_flax_and_keeps_float32_gradients():
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 9, 8)), jnp.float32)
  ours = FeedForward(8, 32, 0.1, 0.1, dtype=jnp.bfloat16)
  reference = FlaxFeedForward(8, 32, 0.1, 0.1, dtype=jnp.bfloat16)
  params = ours.init(jax.random.PRNGKey(2), x)
  rngs = {"dropout": jax.random.PRNGKey(5)}
  out = ours.apply(params, x, False, rngs=rngs)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(out),
                             np.float32(reference.apply(params, x, False, rngs=rngs)), atol=0.05)
  got = jax.grad(_loss(ours, False))(params, x)
  want = jax.grad(_loss(reference, False))(params, x)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, w, atol=0.1, rtol=0.05)


def test_rate_one_drops_everything_and_bad_rates_are_named():
  x = jnp.ones((1, 3, 4))
  module = FeedForward(4, 8, 1.0, 1.0)
  params = module.init(jax.random.PRNGKey(0), x)
  rngs = {"dropout": jax.random.PRNGKey(1)}
  np.testing.assert_array_equal(module.apply(params, x, False, rngs=rngs), 0.0)
  grads = jax.grad(lambda p: jnp.sum(module.apply(p, x, False, rngs=rngs)))(params)
  assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree_util.tree_leaves(grads))
  with pytest.raises(ValueError, match="activation_dropout must be in"):
    FeedForward(4, 8, 0.1, 1.5).init(jax.random.PRNGKey(0), x)


def _hidden_sized_hash_multiplies(module, with_gradient: bool) -> int:
  """uint32 multiplications over [64, 128] (the hidden layer) in the compiled program: the
  hash of the hidden dropout mask (the same count in a program that draws it once)."""
  params = module.init(jax.random.PRNGKey(1), jnp.zeros((1, 4, 16)))
  rngs = {"dropout": jax.random.PRNGKey(5)}
  fn = lambda p, x: jnp.sum(module.apply(p, x, False, rngs=rngs))
  fn = jax.grad(fn, (0, 1)) if with_gradient else fn
  hlo = jax.jit(fn).lower(params, jnp.zeros((4, 16, 16))).compile().as_text()
  shapes = re.findall(r"= u32\[([0-9,]+)\]\S* multiply", hlo)
  return sum(1 for s in shapes if math.prod(map(int, s.split(","))) == 64 * 128)


def test_backward_does_not_hash_the_hidden_mask_again():
  module = FeedForward(16, 128, 0.1, 0.1)
  forward = _hidden_sized_hash_multiplies(module, with_gradient=False)
  assert forward > 0
  assert _hidden_sized_hash_multiplies(module, with_gradient=True) == forward
