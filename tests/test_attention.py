"""Every attention kind against mathematics, a numpy reference or an invariant."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.model.attention import (MultiHeadMultiAttention, favor_attention,
                                       local_attention, softmax_attention)
from multiformer_jax.model.attention import local as local_lib
from multiformer_jax.model.attention.blockwise import dropout_keep_mask
from multiformer_jax.model.attention.kernel import (KernelAttention, favor_weights,
                                                    fixed_features, query_stabiliser,
                                                    orthogonal_gaussian_features)
from multiformer_jax.model.layout import parse_layout

RNG = np.random.default_rng(0)


def qkv(batch, length, heads, dim, scale=1.0):
  return [jnp.asarray(RNG.normal(size=(batch, length, heads, dim)) * scale, jnp.float32)
          for _ in range(3)]


def np_attention(q, k, v, mask):
  """Dense numpy reference. q,k,v [b, t, h, d]; mask [b, h or 1, tq, tk] bool."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  with np.errstate(invalid="ignore"):  # rows of padded queries have no valid key
    logits = np.where(mask, logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", w, v)


def band_mask(lengths, length, window, dilation=1):
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  offset = j - i
  band = (np.abs(offset) <= (window // 2) * dilation) & (offset % dilation == 0)
  valid = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  return band[None, None] & valid[:, None, None, :]


@pytest.mark.parametrize("window, length, block", [
    (1, 7, 0), (3, 10, 4), (5, 37, 8), (7, 23, 0), (9, 50, 3), (15, 33, 16), (31, 20, 0)])
def test_local_equals_dense_banded_reference(window, length, block):
  q, k, v = qkv(2, length, 3, 8)
  lengths = [length, length - 4]
  mask = jnp.asarray(np.arange(length)[None] < np.asarray(lengths)[:, None])
  out = local_attention(q, k, v, mask, window, block_size=block)
  ref = np_attention(q, k, v, band_mask(lengths, length, window))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(out[b, :n], ref[b, :n], atol=2e-5)


@pytest.mark.parametrize("window, dilation, length", [(3, 2, 17), (5, 3, 40), (7, 4, 29)])
def test_dilated_local_equals_dense_reference(window, dilation, length):
  q, k, v = qkv(2, length, 2, 8)
  lengths = [length, length - 5]
  mask = jnp.asarray(np.arange(length)[None] < np.asarray(lengths)[:, None])
  out = local_attention(q, k, v, mask, window, dilation, block_size=4)
  ref = np_attention(q, k, v, band_mask(lengths, length, window, dilation))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(out[b, :n], ref[b, :n], atol=2e-5)


@pytest.mark.parametrize("window", [2 * 19 + 1, 2 * 19 - 1, 2 * 19 - 3])
def test_local_wider_than_sequence_equals_full(window):
  """From window 2n - 1 on every key is in every window (computed as one softmax, without the
  band); 2n - 3 leaves the first and last key out of each other's window."""
  length = 19
  q, k, v = qkv(2, length, 4, 8)
  mask = jnp.asarray(np.arange(length)[None] < np.array([[19], [11]]))
  local = local_attention(q, k, v, mask, window)
  ref = np_attention(q, k, v, band_mask([19, 11], length, window))
  np.testing.assert_allclose(local[0], ref[0], atol=1e-5)
  np.testing.assert_allclose(local[1, :11], ref[1, :11], atol=1e-5)
  full, _ = softmax_attention(q, k, v, mask[:, None, None, :])
  assert np.allclose(local[0], full[0], atol=1e-5) == (window >= 2 * length - 1)


def test_local_wider_than_sequence_drops_attention_weights():
  """The one-softmax form keeps attention dropout: outputs change with the rng and average
  back to the deterministic output."""
  length = 9
  q, k, v = qkv(1, length, 2, 8)
  mask = jnp.ones((1, length), bool)
  drop = jax.jit(lambda key: local_attention(q, k, v, mask, 17, dropout_rate=0.3,
                                             dropout_rng=key))
  keys = jax.random.split(jax.random.PRNGKey(0), 2000)
  outs = jax.vmap(drop)(keys)
  assert not np.allclose(outs[0], outs[1])
  np.testing.assert_allclose(outs.mean(0), local_attention(q, k, v, mask, 17), atol=0.05)


def local_keep_scales(rng, rate, shape, length, window, block, chunk_blocks):
  """The dropout keep-scales local attention draws per chunk, laid out as one dense
  [b, h, q, k] array (zero outside the band)."""
  radius, width = window // 2, block + 2 * (window // 2)
  chunks = -(-length // (block * chunk_blocks))
  dense = np.zeros(shape[:2] + (length, length), np.float32)
  for chunk in range(chunks):
    keep = np.asarray(dropout_keep_mask(rng, chunk, rate,
                                        shape[:2] + (chunk_blocks, block, width)))
    for c in range(chunk_blocks):
      for i in range(block):
        query = (chunk * chunk_blocks + c) * block + i
        for j in range(width):
          key = (chunk * chunk_blocks + c) * block - radius + j
          if query < length and 0 <= key < length and abs(key - query) <= radius:
            dense[:, :, query, key] = keep[:, :, c, i, j] / (1.0 - rate)
  return jnp.asarray(dense)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_local_gradients_equal_dense_banded(rate, monkeypatch):
  """The hand-written backward (chunks recomputed, dropout masks regenerated) == autodiff of
  the dense banded softmax with the same masks; several chunks, padded keys."""
  monkeypatch.setattr(local_lib, "QUERY_CHUNK", 8)     # 2 blocks of 4 per chunk
  window, length, block = 7, 29, 4
  q, k, v = qkv(2, length, 2, 8)
  lengths = [length, 17]
  mask = jnp.asarray(np.arange(length)[None] < np.asarray(lengths)[:, None])
  rng = jax.random.PRNGKey(5)
  weights_mask = jnp.asarray(band_mask(lengths, length, window))
  keep = (local_keep_scales(rng, rate, (2, 2), length, window, block, 2) if rate
          else jnp.ones((2, 2, length, length)))
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  cotangent = cotangent * mask[:, :, None, None]

  def dense(q, k, v):
    _, weights = softmax_attention(q, k, v, weights_mask)
    return jnp.sum(jnp.einsum("bhqk,bkhd->bqhd", weights * keep, v) * cotangent)

  def banded(q, k, v):
    out = local_attention(q, k, v, mask, window, block_size=block, dropout_rate=rate,
                          dropout_rng=rng if rate else None)
    return jnp.sum(out * cotangent)

  np.testing.assert_allclose(banded(q, k, v), dense(q, k, v), rtol=1e-5)
  for got, want in zip(jax.grad(banded, (0, 1, 2))(q, k, v), jax.grad(dense, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=2e-5)
  assert float(jnp.max(jnp.abs(jax.grad(banded, 1)(q, k, v)[1, 17:]))) == 0.0


def test_local_dropout_draws():
  q, k, v = qkv(1, 40, 2, 8)
  mask = jnp.ones((1, 40), bool)
  run = jax.jit(lambda seed: local_attention(q, k, v, mask, 9, dropout_rate=0.5,
                                             dropout_rng=jax.random.PRNGKey(seed)))
  assert not np.allclose(run(0), run(1))
  np.testing.assert_array_equal(run(2), run(2))
  with pytest.raises(ValueError, match="dropout_rng"):
    local_attention(q, k, v, mask, 9, dropout_rate=0.1)


def test_local_memory_is_linear_in_length():
  """No n x n array: the largest intermediate of the compiled program grows ~linearly."""
  def temp_bytes(n):
    q, k, v = (jax.ShapeDtypeStruct((1, n, 2, 16), jnp.float32) for _ in range(3))
    mask = jax.ShapeDtypeStruct((1, n), jnp.bool_)
    fn = jax.jit(lambda q, k, v, m: local_attention(q, k, v, m, 33))
    return fn.lower(q, k, v, mask).compile().memory_analysis().temp_size_in_bytes
  small, large = temp_bytes(1024), temp_bytes(8192)
  assert large <= 9.5 * small, (small, large)


def test_kernel_error_shrinks_with_features():
  length, dim = 24, 8
  q, k, v = qkv(2, length, 2, dim, scale=0.5)
  mask = jnp.ones((2, length), bool)
  exact, _ = softmax_attention(q, k, v, mask[:, None, None, :])
  errors = []
  for m in (16, 128, 1024):
    trials = [favor_attention(q, k, v, mask,
                              orthogonal_gaussian_features(jax.random.PRNGKey(s), m, dim))
              for s in range(4)]
    errors.append(np.mean([float(jnp.mean((t - exact) ** 2)) for t in trials]))
  assert errors[0] > errors[1] > errors[2], errors
  assert errors[2] < 0.25 * errors[0], errors


def test_orthogonal_features_are_orthogonal_within_blocks():
  w = np.asarray(orthogonal_gaussian_features(jax.random.PRNGKey(0), 20, 8))
  block = w[:8] / np.linalg.norm(w[:8], axis=1, keepdims=True)
  np.testing.assert_allclose(block @ block.T, np.eye(8), atol=1e-5)


def test_fixed_features_are_the_seeds_draw_made_once_per_process():
  """A layer's fixed features are orthogonal_gaussian_features of its seed's key, bit for bit,
  and drawn once: each later trace (train step, dev step, search) takes the same array."""
  drawn = orthogonal_gaussian_features(jax.random.PRNGKey(7), 12, 4)
  assert fixed_features(7, 12, 4) is fixed_features(7, 12, 4)
  np.testing.assert_array_equal(fixed_features(7, 12, 4), drawn)
  assert not np.array_equal(fixed_features(8, 12, 4), drawn)
  q, k, v = qkv(2, 6, 2, 4)
  mask = jnp.asarray([[True] * 6, [True] * 4 + [False] * 2])
  layer = KernelAttention(features=12, seed=7, implementation="xla")
  np.testing.assert_array_equal(layer.apply({}, q, k, v, mask),
                                favor_attention(q, k, v, mask, drawn, "xla"))


def test_kernel_linear_form_equals_its_quadratic_form():
  """favor_attention (phi_q (phi_k^T v), never forming the weights) == favor_weights @ v, the
  same features as an explicit [q, k] matrix: outputs and gradients, with padded keys."""
  q, k, v = qkv(2, 23, 3, 8, scale=0.5)
  mask = jnp.asarray(np.arange(23)[None] < np.array([[23], [15]]))
  proj = orthogonal_gaussian_features(jax.random.PRNGKey(3), 32, 8)
  cotangent = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
  linear = lambda q, k, v: jnp.sum(favor_attention(q, k, v, mask, proj) * cotangent)
  quadratic = lambda q, k, v: jnp.sum(jnp.einsum(
      "bhqk,bkhd->bqhd", favor_weights(q, k, mask, proj), v) * cotangent)
  np.testing.assert_allclose(linear(q, k, v), quadratic(q, k, v), rtol=1e-5)
  for got, want in zip(jax.grad(linear, (0, 1, 2))(q, k, v),
                       jax.grad(quadratic, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_kernel_equals_the_textbook_favor_form():
  """favor_attention (no m^-1/2, the query stabiliser's derivative at its first argmax) equals
  FAVOR+ as written in the module docstring with plain jnp (jnp.max, the m^-1/2 factor):
  outputs and gradients, with padded keys; m = 48 is not a power of four, so the rounding may
  differ in the last place."""
  q, k, v = qkv(2, 19, 2, 8, scale=0.7)
  mask = jnp.asarray(np.arange(19)[None] < np.array([[19], [11]]))
  proj = orthogonal_gaussian_features(jax.random.PRNGKey(5), 48, 8)
  cotangent = jnp.asarray(np.random.default_rng(3).normal(size=q.shape), jnp.float32)

  def textbook(q, k, v):
    def phi(x, stabiliser_axes, valid):
      x = jnp.swapaxes(x, 1, 2) * 8 ** -0.25                       # [batch, heads, time, dim]
      u = jnp.einsum("bhtd,md->bhtm", x, proj)
      if valid is None:
        c = jnp.max(u, axis=-1, keepdims=True)
      else:
        c = jax.lax.stop_gradient(jnp.max(jnp.where(valid[:, None, :, None], u, -jnp.inf),
                                          axis=stabiliser_axes, keepdims=True))
      f = 48 ** -0.5 * (jnp.exp(u - 0.5 * jnp.sum(x * x, -1, keepdims=True) - c) + 1e-4)
      return f if valid is None else jnp.where(valid[:, None, :, None], f, 0.0)
    phi_q, phi_k = phi(q, None, None), phi(k, (2, 3), mask)
    weights = jnp.einsum("bhqm,bhkm->bhqk", phi_q, phi_k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return jnp.sum(jnp.einsum("bhqk,bkhd->bqhd", weights, v) * cotangent)

  linear = lambda q, k, v: jnp.sum(favor_attention(q, k, v, mask, proj) * cotangent)
  np.testing.assert_allclose(linear(q, k, v), textbook(q, k, v), rtol=1e-5)
  for got, want in zip(jax.grad(linear, (0, 1, 2))(q, k, v),
                       jax.grad(textbook, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_query_stabiliser_is_the_row_max_differentiated_at_the_first_argmax():
  """Value: max over features of u = x W^T. Derivative: that of u[first argmax] = x . W[r],
  for x and W; the second row has a tie between features 0 and 1 (W's rows 0 and 1 equal)."""
  x = jnp.asarray([[1.0, 2.0], [0.5, -1.0]])
  projection = jnp.asarray([[1.0, -1.0], [1.0, -1.0], [0.0, 1.0]])
  u = x @ projection.T                                  # [[-1, -1, 2], [1.5, 1.5, -1]]
  weights = jnp.asarray([[2.0], [3.0]])
  np.testing.assert_array_equal(query_stabiliser(x, projection, u), jnp.max(u, -1, keepdims=True))
  d_x, d_projection = jax.grad(lambda x, p: jnp.sum(query_stabiliser(x, p, x @ p.T) * weights),
                               (0, 1))(x, projection)
  # Row 0's maximum is feature 2; row 1's the first of the tied features 0 and 1.
  np.testing.assert_allclose(d_x, [[0.0, 2.0], [3.0, -3.0]])               # weight * W[r]
  np.testing.assert_allclose(d_projection, [[1.5, -3.0], [0.0, 0.0], [2.0, 4.0]])  # weight * x


def test_kernel_masks_padded_keys_exactly():
  q, k, v = qkv(1, 12, 2, 8)
  proj = orthogonal_gaussian_features(jax.random.PRNGKey(1), 64, 8)
  mask = jnp.asarray(np.arange(12)[None] < 7)
  full = favor_attention(q, k, v, mask, proj)
  # Garbage in the padded keys must not matter, nor the padding itself.
  k2 = k.at[:, 7:].set(100.0)
  v2 = v.at[:, 7:].set(-50.0)
  np.testing.assert_allclose(favor_attention(q, k2, v2, mask, proj)[:, :7], full[:, :7],
                             atol=1e-6)
  alone = favor_attention(q[:, :7], k[:, :7], v[:, :7], jnp.ones((1, 7), bool), proj)
  np.testing.assert_allclose(alone, full[:, :7], atol=1e-6)


def mhma(layout_text, d_model=32, **kwargs):
  (layer,) = parse_layout(layout_text)
  return MultiHeadMultiAttention(d_model, layer, **kwargs)


def test_all_full_layer_equals_numpy_multi_head_attention():
  module = mhma("1x(4*full)")
  x = jnp.asarray(RNG.normal(size=(2, 9, 32)), jnp.float32)
  mask = jnp.asarray(np.arange(9)[None] < np.array([[9], [6]]))
  params = module.init(jax.random.PRNGKey(0), x, mask)["params"]
  out = module.apply({"params": params}, x, mask)

  def proj(name, a):
    return np.asarray(a) @ np.asarray(params[name]["kernel"]) + np.asarray(params[name]["bias"])
  split = lambda a: a.reshape(2, 9, 4, 8)
  q, k, v = (split(proj(n, x)) for n in ("q_proj", "k_proj", "v_proj"))
  heads = np_attention(q, k, v, np.asarray(mask)[:, None, None, :])
  ref = proj("out_proj", heads.reshape(2, 9, 32))
  np.testing.assert_allclose(out[0], ref[0], atol=1e-5)
  np.testing.assert_allclose(out[1, :6], ref[1, :6], atol=1e-5)


def test_identity_conv_head_equals_full_head():
  x = jnp.asarray(RNG.normal(size=(2, 11, 16)), jnp.float32)
  mask = jnp.asarray(np.arange(11)[None] < np.array([[11], [8]]))
  full = mhma("1x(2*full)", 16)
  params = full.init(jax.random.PRNGKey(0), x, mask)["params"]
  conv = mhma("1x(1*conv(1,1)+1*conv(1,1,standard))", 16)
  conv_params = conv.init(jax.random.PRNGKey(1), x, mask)["params"]
  conv_params = dict(conv_params, **{n: params[n] for n in ("q_proj", "k_proj", "v_proj",
                                                            "out_proj")})
  identity = {"conv": {"kernel": jnp.ones((1, 1, 8)), "bias": jnp.zeros(8)}}
  standard = {"conv": {"kernel": jnp.eye(8)[None], "bias": jnp.zeros(8)}}
  conv_params["group0_conv"] = {"conv_k": identity, "conv_v": identity}
  conv_params["group1_conv"] = {"conv_k": standard, "conv_v": standard}
  a = full.apply({"params": params}, x, mask)
  b = conv.apply({"params": conv_params}, x, mask)
  np.testing.assert_allclose(a[0], b[0], atol=1e-5)
  np.testing.assert_allclose(a[1, :8], b[1, :8], atol=1e-5)


@pytest.mark.parametrize("kernel, stride, length", [(5, 2, 13), (4, 2, 11), (7, 3, 20), (3, 1, 6),
                                                    (1, 1, 5)])
def test_depthwise_compression_equals_flax_grouped_conv(kernel, stride, length):
  """DepthwiseConv1d: nn.Conv(feature_group_count=channels)'s parameters (names, shapes and
  initial values) and function, values and gradients."""
  import flax.linen as nn
  from multiformer_jax.model.attention.conv import TimeCompression
  from multiformer_jax.model.initializers import torch_default_bias, torch_default_kernel
  x = jnp.asarray(RNG.normal(size=(3, length, 8)), jnp.float32)
  ours = TimeCompression(kernel, stride)
  pad = kernel // 2

  class Grouped(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Conv(8, (kernel,), strides=(stride,), padding=[(pad, pad)],
                     feature_group_count=8, kernel_init=torch_default_kernel,
                     bias_init=torch_default_bias(kernel), name="conv")(x)
  params = ours.init(jax.random.PRNGKey(3), x)
  reference = Grouped().init(jax.random.PRNGKey(3), x)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, reference)
  loss = lambda module: lambda p, x: jnp.sum(jnp.sin(module.apply(p, x)))
  np.testing.assert_allclose(ours.apply(params, x), Grouped().apply(params, x), atol=1e-6)
  got = jax.grad(loss(ours), (0, 1))(params, x)
  want = jax.grad(loss(Grouped()), (0, 1))(params, x)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got, want)


def test_conv_head_equals_numpy_reference():
  """Depthwise conv(5,2): zero padded frames, pad k//2, stride, compressed mask, softmax."""
  from multiformer_jax.model.attention.conv import ConvAttention
  length, lengths = 13, [13, 8]
  q, k, v = qkv(2, length, 2, 4)
  mask = jnp.asarray(np.arange(length)[None] < np.asarray(lengths)[:, None])
  module = ConvAttention(5, 2)
  params = module.init(jax.random.PRNGKey(0), q, k, v, mask)["params"]
  out = module.apply({"params": params}, q, k, v, mask)
  for b, n in enumerate(lengths):
    def conv(x, p):
      w, bias = np.asarray(p["conv"]["kernel"])[:, 0, :], np.asarray(p["conv"]["bias"])
      x = np.pad(np.asarray(x[b, :n], np.float64), [(2, 2), (0, 0), (0, 0)])  # [t+4, h, d]
      n_out = (n + 4 - 5) // 2 + 1
      return np.stack([np.einsum("khd,kd->hd", x[2 * o:2 * o + 5], w) + bias
                       for o in range(n_out)])
    kc, vc = conv(k, params["conv_k"]), conv(v, params["conv_v"])
    ref = np_attention(q[b:b + 1, :n], kc[None], vc[None], np.ones((1, 1, 1, len(kc)), bool))
    np.testing.assert_allclose(out[b, :n], ref[0], atol=1e-5)


@pytest.mark.parametrize("layout_text", [
    "1x(4*full)", "1x(4*local(5))", "1x(4*local(3,2))", "1x(4*kernel(32))", "1x(4*conv(5,2))",
    "1x(4*conv(7,3,standard))", "1x(4*conv(4,2,separable))",
    "1x(1*full+1*local(7)+1*kernel(16)+1*conv(5,2))"])
def test_padding_and_batch_mates_do_not_change_outputs(layout_text):
  module = mhma(layout_text)
  lengths = [21, 14, 5]
  x = jnp.asarray(RNG.normal(size=(3, 21, 32)), jnp.float32)
  mask = jnp.asarray(np.arange(21)[None] < np.asarray(lengths)[:, None])
  params = module.init(jax.random.PRNGKey(0), x, mask)["params"]
  apply = jax.jit(module.apply)
  batched = apply({"params": params}, x, mask)
  for b, n in enumerate(lengths):
    alone = apply({"params": params}, x[b:b + 1, :n], jnp.ones((1, n), bool))
    np.testing.assert_allclose(batched[b, :n], alone[0], atol=1e-5)
  # Changing what sits in the padding or in the batch-mates changes nothing at valid frames.
  x2 = x.at[1, 14:].set(1e3).at[0].set(-x[0])
  other = apply({"params": params}, x2, mask)
  np.testing.assert_allclose(other[1, :14], batched[1, :14], atol=1e-5)
  np.testing.assert_allclose(other[2, :5], batched[2, :5], atol=1e-5)


def test_kernel_redraw_policies():
  module = mhma("1x(4*kernel(16))", kernel_redraw="step")
  x = jnp.asarray(RNG.normal(size=(1, 10, 32)), jnp.float32)
  mask = jnp.ones((1, 10), bool)
  params = module.init(jax.random.PRNGKey(0), x, mask)["params"]
  run = lambda key, det: module.apply({"params": params}, x, mask, det,
                                      rngs={"dropout": jax.random.PRNGKey(key)})
  np.testing.assert_array_equal(run(0, True), run(1, True))           # eval: fixed draw
  assert not np.allclose(run(0, False), run(1, False))                # train: per-step draw
  np.testing.assert_array_equal(run(3, False), run(3, False))         # same key, same draw


def _speechformer_conv_keys(length: int, kernel: int, stride: int) -> tuple[int, int]:
  """(keys computed, keys unmasked) of the Speechformer-style ConvAttention the thesis code
  builds on, transcribed: right-pad to k + s*ceil((L-k)/s) (k if L <= k), Conv1d with
  padding=s//2; the key mask's length is floor((L + 2*s//2 - k)/s + 1), where Python reads
  2*s//2 as (2*s)//2 = s (so it can exceed the keys computed)."""
  import math  # pylint: disable=import-outside-toplevel
  padded = kernel + stride * math.ceil((length - kernel) / stride) if length > kernel else kernel
  computed = (padded + 2 * (stride // 2) - kernel) // stride + 1
  unmasked = math.floor((length + 2 * stride // 2 - kernel) / stride + 1)
  return computed, unmasked


@pytest.mark.parametrize("kernel, stride, ours, reference", [
    (5, 2, 50, (50, 49)), (7, 3, 34, (32, 33))])
def test_conv_key_counts_against_the_thesis_codes_padding(kernel, stride, ours, reference):
  """A 100-frame utterance: this project pads k//2 on each side (README, "Choices ..."), the
  reference code s//2 after right-padding: conv(5,2) attends to 49 of its 50 keys there, and
  conv(7,3) computes 32 keys (34 here) under a 33-long mask."""
  from multiformer_jax.model.attention.masks import conv_output_lengths
  assert int(conv_output_lengths(100, kernel, stride, kernel // 2)) == ours
  assert _speechformer_conv_keys(100, kernel, stride) == reference
