"""The C++ FAVOR+ kernel (kernel_cpu.py) against kernel.py's XLA path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.model.attention import MultiHeadMultiAttention, cpu_kernels, kernel_cpu
from multiformer_jax.model.attention.kernel import (KernelAttention, favor_attention,
                                                    orthogonal_gaussian_features)
from multiformer_jax.model.layout import parse_layout
from tests.test_local_cpu_kernel import lengths_mask, needs_compiler

RNG = np.random.default_rng(0)


def qkv(batch, length, heads, dim, scale=1.0):
  return tuple(jnp.asarray(scale * RNG.normal(size=(batch, length, heads, dim)), jnp.float32)
               for _ in range(3))


def value_and_grads(implementation, q, k, v, mask, projection):
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  loss = lambda q, k, v: jnp.sum(favor_attention(q, k, v, mask, projection, implementation)
                                 * cotangent)
  return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)


def assert_kernel_matches_xla(q, k, v, mask, projection, atol=2e-5):
  (want, want_grads), (got, got_grads) = (
      value_and_grads(implementation, q, k, v, mask, projection)
      for implementation in ("xla", "cpu"))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol)


@needs_compiler
@pytest.mark.parametrize("length,head_dim,features", [
    (150, 64, 256), (37, 32, 48), (70, 128, 64), (5, 64, 16), (90, 64, 266), (20, 32, 7)])
def test_kernel_equals_the_xla_path(length, head_dim, features):
  """Values and gradients, with padded keys and an utterance with no valid key at all; lengths
  that are no multiple of the kernel's tile (64) or register block (4), feature counts that
  are no multiple of its column block (64) or of its vectors (16: padded, 266 as in
  multiformer_fast)."""
  q, k, v = qkv(3, length, 2, head_dim)
  mask = lengths_mask(length, [length, max(length - 11, 1), 0])
  projection = orthogonal_gaussian_features(jax.random.PRNGKey(length), features, head_dim)
  assert_kernel_matches_xla(q, k, v, mask, projection)


@needs_compiler
def test_kernel_takes_the_query_stabiliser_at_the_first_argmax():
  """Zero queries tie every feature (u = 0), and two equal projection rows tie wherever they
  win: the derivative goes through the first maximal feature, as query_stabiliser's does."""
  q, k, v = qkv(2, 20, 2, 32, scale=0.5)
  q = q.at[:, :6].set(0.0)
  projection = orthogonal_gaussian_features(jax.random.PRNGKey(7), 32, 32)
  projection = projection.at[1].set(projection[0])
  assert_kernel_matches_xla(q, k, v, jnp.ones((2, 20), bool), projection)


@needs_compiler
def test_padded_keys_do_not_matter():
  q, k, v = qkv(1, 40, 2, 64)
  mask = lengths_mask(40, [25])
  projection = orthogonal_gaussian_features(jax.random.PRNGKey(1), 64, 64)
  full = favor_attention(q, k, v, mask, projection, "cpu")
  garbage = favor_attention(q, k.at[:, 25:].set(100.0), v.at[:, 25:].set(-50.0), mask,
                            projection, "cpu")
  np.testing.assert_allclose(garbage, full, atol=1e-6)
  alone = favor_attention(q[:, :25], k[:, :25], v[:, :25], jnp.ones((1, 25), bool), projection,
                          "cpu")
  np.testing.assert_allclose(alone, full[:, :25], atol=1e-6)


def calls_the_kernel(fn, *args) -> bool:
  return kernel_cpu.FORWARD in str(jax.make_jaxpr(fn)(*args))


@needs_compiler
def test_auto_takes_the_kernel_only_where_it_applies():
  q, k, v = qkv(1, 40, 2, 64)
  mask = jnp.ones((1, 40), bool)
  projection = orthogonal_gaussian_features(jax.random.PRNGKey(0), 64, 64)
  attend = lambda q, k, v, implementation="auto", p=projection: favor_attention(
      q, k, v, mask, p, implementation)
  assert calls_the_kernel(attend, q, k, v)
  assert not calls_the_kernel(lambda q: attend(q, k, v, "xla"), q)
  half = lambda x: x.astype(jnp.bfloat16)
  assert not calls_the_kernel(lambda q: attend(half(q), half(k), half(v)), q)
  q8 = jnp.zeros((1, 40, 2, 8))
  assert not calls_the_kernel(lambda q: attend(q, q, q, p=projection[:, :8]), q8)
  assert calls_the_kernel(lambda q: attend(q, k, v, p=projection[:40]), q)   # padded to 48
  cross = lambda q, implementation="auto": favor_attention(
      q, k[:, :30], v[:, :30], jnp.ones((1, 30), bool), projection, implementation)
  assert not calls_the_kernel(cross, q)
  with pytest.raises(ValueError, match="differ in shape"):
    cross(q, "cpu")
  with pytest.raises(ValueError, match="valid: .*'auto', 'xla', 'cpu'"):
    attend(q, k, v, "pallas")


@needs_compiler
def test_an_inference_call_keeps_no_features():
  """Without a backward, E_q and E_k ([batch, heads, time, m] each) stay in the kernel's
  per-thread scratch: XLA's temporaries are a fraction of one of them."""
  q, k, v = qkv(2, 1024, 2, 64)
  mask = jnp.ones((2, 1024), bool)
  projection = orthogonal_gaussian_features(jax.random.PRNGKey(0), 256, 64)
  compiled = jax.jit(lambda q, k, v: favor_attention(q, k, v, mask, projection, "cpu")).lower(
      q, k, v).compile()
  one_feature_map = 2 * 2 * 1024 * 256 * 4
  assert compiled.memory_analysis().temp_size_in_bytes < one_feature_map / 4


@needs_compiler
@pytest.mark.parametrize("redraw", ["fixed", "step"])
def test_module_xla_and_auto_agree(redraw):
  """KernelAttention in training (features redrawn from the dropout key under 'step'):
  outputs and gradients of both implementations."""
  q, k, v = qkv(2, 30, 2, 32)
  mask = lengths_mask(30, [30, 12])
  rngs = {"dropout": jax.random.PRNGKey(3)}

  def loss(implementation, q, k, v):
    module = KernelAttention(64, redraw, implementation=implementation)
    return jnp.sum(module.apply({}, q, k, v, mask, deterministic=False, rngs=rngs) ** 2)
  for implementation in ("xla", "auto"):
    value, grads = jax.value_and_grad(lambda *a: loss(implementation, *a), (0, 1, 2))(q, k, v)
    if implementation == "xla":
      want, want_grads = value, grads
  np.testing.assert_allclose(value, want, rtol=1e-5)
  for g, w in zip(grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


def test_without_a_compiler_kernel_heads_take_the_xla_path(monkeypatch, tmp_path):
  monkeypatch.setenv("CXX", "no-such-compiler-xyz")
  monkeypatch.setenv("MULTIFORMER_KERNEL_CACHE", str(tmp_path))
  cpu_kernels.unavailable.cache_clear()
  try:
    q, k, v = qkv(1, 20, 1, 32)
    mask = jnp.ones((1, 20), bool)
    projection = orthogonal_gaussian_features(jax.random.PRNGKey(0), 32, 32)
    assert not calls_the_kernel(lambda q: favor_attention(q, k, v, mask, projection), q)
    with pytest.raises(ValueError, match="no-such-compiler-xyz"):
      favor_attention(q, k, v, mask, projection, "cpu")
  finally:
    cpu_kernels.unavailable.cache_clear()


@needs_compiler
def test_a_layer_of_kernel_heads_takes_the_kernel_unless_told_xla():
  """MultiHeadMultiAttention routes kernel heads to the kernel under the default
  attention_implementation and keeps them on XLA under 'xla'; the layer's outputs and its
  parameters' gradients agree."""
  (layer,) = parse_layout("1x(2*kernel(64)+2*full)")
  x = jnp.asarray(RNG.normal(size=(2, 24, 128)), jnp.float32)          # head_dim 32
  mask = lengths_mask(24, [24, 17])
  modules = {implementation: MultiHeadMultiAttention(128, layer,
                                                     attention_implementation=implementation)
             for implementation in ("auto", "xla")}
  params = modules["xla"].init(jax.random.PRNGKey(0), x, mask)["params"]
  apply = {name: (lambda p, module=module: module.apply({"params": p}, x, mask))
           for name, module in modules.items()}
  assert calls_the_kernel(apply["auto"], params)
  assert not calls_the_kernel(apply["xla"], params)
  loss = lambda name: jax.value_and_grad(lambda p: jnp.sum(apply[name](p) ** 2))(params)
  (want, want_grads), (got, got_grads) = loss("xla"), loss("auto")
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads)):
    # Sums over every position and head: float rounding relative to the largest entry.
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * float(np.max(np.abs(w))))
