"""Memory-saving computations: blockwise (online-softmax) attention and the chunked
feed-forward give the dense results in O(n x block) memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import ModelConfig
from multiformer_jax.model.attention import softmax_attention
from multiformer_jax.model.attention.blockwise import blockwise_attention, dropout_keep_mask
from multiformer_jax.model.attention.masks import lengths_to_mask
from multiformer_jax.model.dropout import bernoulli
from multiformer_jax.model.encoder import EncoderLayer
from multiformer_jax.model.feedforward import FeedForward
from multiformer_jax.model.model_config import ConfigError
from tests.test_attention import mhma, np_attention, qkv
from tests.test_model import TINY, jitted_apply, tiny_model

LENGTHS = [45, 20, 1]


@pytest.mark.parametrize("key_block", [1, 4, 7, 16, 64])
def test_blockwise_equals_numpy_softmax(key_block):
  q, _, _ = qkv(3, 37, 2, 8)
  _, k, v = qkv(3, 45, 2, 8)
  mask = lengths_to_mask(LENGTHS, 45)
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


@pytest.mark.parametrize("key_block", [16, 45, 64])
@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_blockwise_gradients_equal_dense(rate, key_block):
  """The hand-written backwards (recomputed blocks and regenerated dropout masks; with one
  block, 45 or 64 keys, the kept weights and masks) == autodiff of the dense computation with
  the same masks."""
  q, _, _ = qkv(3, 13, 2, 8)
  _, k, v = qkv(3, 45, 2, 8)
  mask = lengths_to_mask(LENGTHS, 45)
  rng = jax.random.PRNGKey(7)
  keep = block_masks(rng, rate, (3, 2, 13), min(key_block, 45), 45) if rate else None
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  dense = lambda q, k, v: jnp.sum(dense_with_keep(q, k, v, mask, keep) * cotangent)
  block = lambda q, k, v: jnp.sum(
      blockwise_attention(q, k, v, mask, key_block, rate, rng if rate else None) * cotangent)
  np.testing.assert_allclose(block(q, k, v), dense(q, k, v), rtol=1e-5)
  for got, want in zip(jax.grad(block, (0, 1, 2))(q, k, v), jax.grad(dense, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=2e-5)
  # Padded keys get no gradient.
  d_k = jax.grad(block, 1)(q, k, v)
  assert float(jnp.max(jnp.abs(d_k[1, 20:]))) == 0.0


def test_blockwise_dropout_is_random_per_key_and_unbiased():
  q, k, v = qkv(2, 64, 2, 8)
  mask = jnp.ones((2, 64), bool)
  run = jax.jit(lambda seed: blockwise_attention(q, k, v, mask, 16, 0.5,
                                                 jax.random.PRNGKey(seed)))
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
  mask = lengths_to_mask(lengths, 21)
  params = dense.init(jax.random.PRNGKey(0), x, mask)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      blocked.init(jax.random.PRNGKey(0), x, mask))
  apply = jax.jit(blocked.apply)
  out = apply(params, x, mask)
  ref = jax.jit(dense.apply)(params, x, mask)
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(out[b, :n], ref[b, :n], atol=1e-5)
    alone = apply(params, x[b:b + 1, :n], jnp.ones((1, n), bool))
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


@pytest.mark.parametrize("key, value", [("key_block_size", -2), ("ffn_token_chunk", -3),
                                        ("local_block_size", -1)])
def test_negative_block_sizes_are_rejected(key, value):
  with pytest.raises(ConfigError, match=f"model.{key}={value}"):
    ModelConfig(**{key: value})


@pytest.mark.parametrize("backend, expected", [("cpu", (512, 0)), ("gpu", (0, 0)),
                                               ("tpu", (0, 0))])
def test_automatic_memory_options_follow_the_backend(monkeypatch, backend, expected):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  auto = ModelConfig()                                  # the defaults are AUTO (-1)
  assert (auto.resolved_key_block_size, auto.resolved_ffn_token_chunk) == expected
  explicit = ModelConfig(key_block_size=64, ffn_token_chunk=0)
  assert (explicit.resolved_key_block_size, explicit.resolved_ffn_token_chunk) == (64, 0)


def test_encoder_layers_are_built_with_the_resolved_memory_options(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  cfg = ModelConfig(**{**TINY, "ffn_token_chunk": 7})   # key_block_size stays AUTO
  layer = EncoderLayer(cfg, cfg.layout[0]).bind({})     # setup runs on attribute access
  assert (layer.self_attn.key_block_size, layer.ffn.token_chunk) == (0, 7)


def test_chunked_feedforward_equals_dense_with_same_parameters():
  x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 13, 8)), jnp.float32)
  dense, chunked = FeedForward(8, 24), FeedForward(8, 24, token_chunk=5)   # 26 tokens: padded
  params = dense.init(jax.random.PRNGKey(0), x)
  assert jax.tree_util.tree_map(jnp.shape, params) == jax.tree_util.tree_map(
      jnp.shape, chunked.init(jax.random.PRNGKey(0), x))
  np.testing.assert_array_equal(params["params"]["fc1"]["kernel"],
                                chunked.init(jax.random.PRNGKey(0), x)["params"]["fc1"]["kernel"])
  loss = lambda module: lambda p, x: jnp.sum(jnp.sin(module.apply(p, x)))
  np.testing.assert_allclose(chunked.apply(params, x), dense.apply(params, x), atol=1e-6)
  for got, want in zip(jax.tree_util.tree_leaves(jax.grad(loss(chunked), (0, 1))(params, x)),
                       jax.tree_util.tree_leaves(jax.grad(loss(dense), (0, 1))(params, x))):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_chunked_feedforward_dropout_gradients_match_an_unchunked_reference():
  """Training mode: each chunk's masks come from fold_in(rng, chunk); the recomputed backward
  equals autodiff of the same computation written chunk by chunk without checkpointing."""
  x = jnp.asarray(np.random.default_rng(5).normal(size=(2, 9, 8)), jnp.float32)
  module = FeedForward(8, 16, dropout=0.2, activation_dropout=0.3, token_chunk=4)
  params = module.init(jax.random.PRNGKey(0), x)
  rng = jax.random.PRNGKey(11)

  def reference(p, x):
    (w1, b1), (w2, b2) = ((p["params"][n]["kernel"], p["params"][n]["bias"])
                          for n in ("fc1", "fc2"))
    flat = jnp.pad(x.reshape(18, 8), [(0, 2), (0, 0)]).reshape(5, 4, 8)
    out = []
    for i, chunk in enumerate(flat):
      key = jax.random.fold_in(rng, i)
      h = jax.nn.relu(chunk @ w1 + b1)
      h = jnp.where(bernoulli(jax.random.fold_in(key, 0), 0.7, h.shape), h / 0.7, 0)
      y = h @ w2 + b2
      out.append(jnp.where(bernoulli(jax.random.fold_in(key, 1), 0.8, y.shape),
                           y / 0.8, 0))
    return jnp.concatenate(out)[:18].reshape(2, 9, 8)

  # The module draws its rng from the "dropout" stream: recover it the same way.
  chunked = lambda p, x: module.apply(p, x, False, rngs={"dropout": jax.random.PRNGKey(3)})
  rng = module.apply(params, x, False, rngs={"dropout": jax.random.PRNGKey(3)},
                     method=lambda m, x, d: m.make_rng("dropout"))
  np.testing.assert_allclose(chunked(params, x), reference(params, x), atol=1e-6)
  loss = lambda f: lambda p, x: jnp.sum(jnp.cos(f(p, x)))
  for got, want in zip(jax.tree_util.tree_leaves(jax.grad(loss(chunked), (0, 1))(params, x)),
                       jax.tree_util.tree_leaves(jax.grad(loss(reference), (0, 1))(params, x))):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_chunked_feedforward_saves_activation_memory():
  x = jax.ShapeDtypeStruct((8, 1000, 64), jnp.float32)
  def temp_bytes(module):
    params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 64)))
    loss = lambda p, x: jnp.sum(module.apply(p, x, False, rngs={"dropout": jax.random.PRNGKey(0)}))
    return jax.jit(jax.grad(loss, (0, 1))).lower(params, x).compile().memory_analysis(
        ).temp_size_in_bytes
  dense = temp_bytes(FeedForward(64, 512, 0.1, 0.1))
  chunked = temp_bytes(FeedForward(64, 512, 0.1, 0.1, token_chunk=500))
  assert chunked < 0.3 * dense, (chunked, dense)


def test_ffn_token_chunk_keeps_whole_model_logits():
  model, params = tiny_model(ffn_token_chunk=0)
  chunked, _ = tiny_model(ffn_token_chunk=7)
  features = jnp.asarray(np.random.default_rng(6).normal(size=(2, 40, 12)), jnp.float32)
  lengths, tokens = jnp.array([40, 27]), jnp.array([[2, 5, 6, 7], [2, 8, 9, 1]])
  np.testing.assert_allclose(
      jitted_apply(chunked)({"params": params}, features, lengths, tokens),
      jitted_apply(model)({"params": params}, features, lengths, tokens), atol=2e-5)
