"""Blockwise (online-softmax) attention: the same softmax as the dense path, in O(n x block)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import ModelConfig
from multiformer_jax.attention import softmax_attention
from multiformer_jax.attention.blockwise import blockwise_attention, dropout_keep_mask
from multiformer_jax.model_config import ConfigError
from tests.test_attention import mhma, np_attention, qkv
from tests.test_model import jitted_apply, tiny_model

LENGTHS = [45, 20, 1]


def key_mask(lengths, length):
  return jnp.asarray(np.arange(length)[None] < np.asarray(lengths)[:, None])


@pytest.mark.parametrize("key_block", [1, 4, 7, 16, 64])
def test_blockwise_equals_numpy_softmax(key_block):
  q, _, _ = qkv(3, 37, 2, 8)
  _, k, v = qkv(3, 45, 2, 8)
  mask = key_mask(LENGTHS, 45)
  out = blockwise_attention(q, k, v, mask, key_block)
  ref = np_attention(q, k, v, np.asarray(mask)[:, None, None, :])
  np.testing.assert_allclose(out, ref, atol=2e-6)


def dense_with_keep(q, k, v, mask, keep=None):
  """The dense path, optionally with a given dropout keep-scale [b, h, q, k] on the weights."""
  _, weights = softmax_attention(q, k, v, mask[:, None, None, :])
  if keep is not None:
    weights = weights * keep
  return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def block_masks(rng, rate, shape, key_block, length):
  """The keep-scales blockwise attention draws, laid out as one [b, h, q, k] array."""
  blocks = -(-length // key_block)
  masks = [dropout_keep_mask(rng, i, rate, shape[:3] + (key_block,)) for i in range(blocks)]
  return jnp.concatenate(masks, axis=-1)[..., :length] / (1.0 - rate)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_blockwise_gradients_equal_dense(rate):
  """The hand-written backward (recomputed blocks, regenerated dropout masks) == autodiff of
  the dense computation with the same masks."""
  q, _, _ = qkv(3, 13, 2, 8)
  _, k, v = qkv(3, 45, 2, 8)
  mask = key_mask(LENGTHS, 45)
  rng = jax.random.PRNGKey(7)
  keep = block_masks(rng, rate, (3, 2, 13), 16, 45) if rate else None
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  dense = lambda q, k, v: jnp.sum(dense_with_keep(q, k, v, mask, keep) * cotangent)
  block = lambda q, k, v: jnp.sum(
      blockwise_attention(q, k, v, mask, 16, rate, rng if rate else None) * cotangent)
  np.testing.assert_allclose(block(q, k, v), dense(q, k, v), rtol=1e-5)
  for got, want in zip(jax.grad(block, (0, 1, 2))(q, k, v), jax.grad(dense, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=2e-5)
  # Padded keys get no gradient.
  d_k = jax.grad(block, 1)(q, k, v)
  assert float(jnp.max(jnp.abs(d_k[1, 20:]))) == 0.0


def test_blockwise_dropout_is_random_per_key_and_unbiased():
  q, k, v = qkv(2, 64, 2, 8)
  mask = jnp.ones((2, 64), bool)
  run = lambda seed: blockwise_attention(q, k, v, mask, 16, 0.5, jax.random.PRNGKey(seed))
  assert not np.allclose(run(0), run(1))
  np.testing.assert_array_equal(run(2), run(2))
  mean = np.mean([np.asarray(run(s)) for s in range(200)], axis=0)
  exact = blockwise_attention(q, k, v, mask, 16)
  assert float(jnp.mean(jnp.abs(mean - exact))) < 0.1 * float(jnp.mean(jnp.abs(exact)))
  with pytest.raises(ValueError, match="dropout_rng"):
    blockwise_attention(q, k, v, mask, 16, 0.1)


@pytest.mark.parametrize("layout_text", ["1x(4*full)", "1x(2*full+2*conv(5,2))",
                                         "1x(1*conv(7,3,standard)+1*local(5)+2*full)"])
def test_key_block_size_keeps_layer_outputs_and_padding_invariance(layout_text):
  dense, blocked = mhma(layout_text), mhma(layout_text, key_block_size=4)
  lengths = [21, 14, 5]
  x = jnp.asarray(np.random.default_rng(2).normal(size=(3, 21, 32)), jnp.float32)
  mask = key_mask(lengths, 21)
  params = dense.init(jax.random.PRNGKey(0), x, mask)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      blocked.init(jax.random.PRNGKey(0), x, mask))
  out = blocked.apply(params, x, mask)
  ref = dense.apply(params, x, mask)
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(out[b, :n], ref[b, :n], atol=1e-5)
    alone = blocked.apply(params, x[b:b + 1, :n], jnp.ones((1, n), bool))
    np.testing.assert_allclose(alone[0], out[b, :n], atol=1e-5)
  # Training mode draws attention dropout from the module's dropout rng.
  train = lambda key: mhma(layout_text, key_block_size=4, attention_dropout=0.5).apply(
      params, x, mask, False, rngs={"dropout": jax.random.PRNGKey(key)})
  assert not np.allclose(train(0), train(1))


def test_key_block_size_keeps_whole_model_logits():
  model, params = tiny_model(key_block_size=0)      # one dense softmax per head group
  blocked, _ = tiny_model(key_block_size=3)
  features = jnp.asarray(np.random.default_rng(3).normal(size=(2, 40, 12)), jnp.float32)
  lengths = jnp.array([40, 27])
  tokens = jnp.array([[2, 5, 6, 7], [2, 8, 9, 1]])
  want = jitted_apply(model)({"params": params}, features, lengths, tokens)
  got = jitted_apply(blocked)({"params": params}, features, lengths, tokens)
  np.testing.assert_allclose(got, want, atol=2e-5)


def test_blockwise_memory_is_linear_in_keys():
  """fwd+bwd compiled temporaries: no [q, k] matrix, so ~linear in n and far below dense."""
  def temp_bytes(n, fn):
    args = [jax.ShapeDtypeStruct((1, n, 2, 16), jnp.float32) for _ in range(3)]
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, jnp.ones((1, n), bool)))
    compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes
  blocked = lambda q, k, v, m: blockwise_attention(q, k, v, m, 128)
  dense = lambda q, k, v, m: softmax_attention(q, k, v, m[:, None, None, :])[0]
  small, large = temp_bytes(1024, blocked), temp_bytes(8192, blocked)
  assert large <= 9.5 * small, (small, large)
  assert temp_bytes(4096, blocked) < 0.1 * temp_bytes(4096, dense)


def test_negative_key_block_size_is_rejected():
  with pytest.raises(ConfigError, match="model.key_block_size=-2"):
    ModelConfig(key_block_size=-2)
