"""The C++ local-attention kernel (local_cpu.py) against the XLA band and numpy."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.model.attention import cpu_kernels, local_cpu
from multiformer_jax.model.attention.local import LocalAttention, local_attention

RNG = np.random.default_rng(0)

# Where no C++ compiler exists the kernel cannot be built and local heads take the XLA band
# (tested below with a missing compiler); a compiler that exists but fails fails these tests.
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="no C++ compiler ($CXX, default g++) to build the CPU kernel")


def qkv(batch, length, heads, dim):
  return tuple(jnp.asarray(RNG.normal(size=(batch, length, heads, dim)), jnp.float32)
               for _ in range(3))


def lengths_mask(length, valid_lengths):
  return jnp.asarray(np.arange(length)[None] < np.asarray(valid_lengths)[:, None])


def value_and_grads(implementation, q, k, v, mask, window, dilation=1):
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  loss = lambda q, k, v: jnp.sum(local_attention(
      q, k, v, mask, window, dilation, implementation=implementation) * cotangent)
  return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)


def assert_kernel_matches_the_xla_band(q, k, v, mask, window, dilation=1):
  (want, want_grads), (got, got_grads) = (
      value_and_grads(implementation, q, k, v, mask, window, dilation)
      for implementation in ("xla", "cpu"))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, atol=2e-5)


@needs_compiler
@pytest.mark.parametrize("length,window,head_dim", [
    (37, 1, 64), (37, 9, 32), (37, 33, 64), (37, 129, 128), (150, 65, 64), (150, 129, 32)])
def test_kernel_equals_the_xla_band(length, window, head_dim):
  """Values and gradients, with padded keys and an utterance with no valid key at all; lengths
  that are no multiple of the kernel's tile or vector, windows from 1 to wider than the
  sequence."""
  q, k, v = qkv(3, length, 2, head_dim)
  mask = lengths_mask(length, [length, length - 11, 0])
  assert_kernel_matches_the_xla_band(q, k, v, mask, window)


@needs_compiler
def test_kernel_equals_numpy_banded_softmax():
  q, k, v = qkv(2, 45, 3, 32)
  mask = lengths_mask(45, [45, 30])
  out = np.asarray(local_attention(q, k, v, mask, 11, implementation="cpu"))
  qn, kn, vn, mn = (np.asarray(x, np.float64) for x in (q, k, v, mask))
  offsets = np.arange(45)[None, :] - np.arange(45)[:, None]
  visible = (np.abs(offsets) <= 5)[None, None] & (mn[:, None, None, :] > 0)    # [b, 1, q, k]
  logits = np.einsum("bqhd,bkhd->bhqk", qn, kn) / np.sqrt(32)
  weights = np.where(visible, np.exp(logits - logits.max(-1, keepdims=True)), 0.0)
  # Queries of utterance 2 past position 35 see no valid key: they output zeros.
  weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-30)
  np.testing.assert_allclose(out, np.einsum("bhqk,bkhd->bqhd", weights, vn), atol=1e-5)


@needs_compiler
def test_dilated_window_through_the_kernel():
  q, k, v = qkv(2, 40, 2, 64)
  mask = lengths_mask(40, [40, 25])
  assert_kernel_matches_the_xla_band(q, k, v, mask, 5, 3)


@needs_compiler
@pytest.mark.parametrize("length,window,dilation,rate", [
    (150, 33, 1, 0.1), (37, 9, 1, 0.3), (300, 129, 1, 0.1), (80, 9, 2, 0.2)])
def test_kernel_dropout_draws_the_xla_bands_masks(length, window, dilation, rate):
  """With attention dropout the kernel and the XLA band compute the same function: values and
  gradients agree to float rounding (other masks would differ by the dropped weights), for
  several chunks of the band (n = 300), dilation, and an utterance with no valid key."""
  q, k, v = qkv(3, length, 2, 64)
  mask = lengths_mask(length, [length, length - 11, 0])
  key = jax.random.PRNGKey(7)
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

  def outputs_and_grads(implementation):
    attend = lambda q, k, v: local_attention(q, k, v, mask, window, dilation, dropout_rate=rate,
                                             dropout_rng=key, implementation=implementation)
    out = jax.jit(attend)(q, k, v)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(attend(*a) * cotangent), (0, 1, 2)))(q, k, v)
    return out, grads
  (want, want_grads), (got, got_grads) = outputs_and_grads("xla"), outputs_and_grads("cpu")
  np.testing.assert_allclose(got, want, atol=2e-6)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, atol=2e-5)
  without = local_attention(q, k, v, mask, window, dilation, implementation="cpu")
  assert float(jnp.max(jnp.abs(got - without))) > 0.1     # the masks did drop weights


def calls_the_kernel(fn, *args) -> bool:
  return local_cpu.FORWARD in str(jax.make_jaxpr(fn)(*args))


@needs_compiler
def test_auto_takes_the_kernel_only_where_it_applies():
  q, k, v = qkv(1, 40, 2, 64)
  mask = jnp.ones((1, 40), bool)
  key = jax.random.PRNGKey(0)
  assert calls_the_kernel(lambda q: local_attention(q, k, v, mask, 9), q)
  assert not calls_the_kernel(lambda q: local_attention(q, k, v, mask, 9, implementation="xla"), q)
  assert calls_the_kernel(lambda q: local_attention(q, k, v, mask, 9, dropout_rate=0.1,
                                                    dropout_rng=key), q)
  other_key = jax.random.key(0, impl="rbg")        # dropout.py hashes only under threefry keys
  assert not calls_the_kernel(lambda q: local_attention(q, k, v, mask, 9, dropout_rate=0.1,
                                                        dropout_rng=other_key), q)
  half = lambda x: x.astype(jnp.bfloat16)
  assert not calls_the_kernel(lambda q: local_attention(half(q), half(k), half(v), mask, 9), q)
  q48 = jnp.zeros((1, 40, 2, 48))
  assert not calls_the_kernel(lambda q: local_attention(q, q, q, mask, 9), q48)
  with pytest.raises(ValueError, match="not a threefry key"):
    local_attention(q, k, v, mask, 9, dropout_rate=0.1, dropout_rng=other_key,
                    implementation="cpu")
  with pytest.raises(ValueError, match="valid: .*'auto', 'xla', 'cpu'"):
    local_attention(q, k, v, mask, 9, implementation="pallas")


@needs_compiler
def test_module_xla_and_auto_agree():
  """In evaluation and in training with attention dropout (flax's dropout rng stream)."""
  q, k, v = qkv(2, 30, 2, 32)
  mask = lengths_mask(30, [30, 12])
  for deterministic in (True, False):
    outs = [LocalAttention(7, attention_dropout=0.2, implementation=implementation).apply(
        {}, q, k, v, mask, deterministic, rngs={"dropout": jax.random.PRNGKey(4)})
        for implementation in ("xla", "auto")]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


def test_without_a_compiler_local_heads_take_the_xla_band(monkeypatch, tmp_path):
  monkeypatch.setenv("CXX", "no-such-compiler-xyz")
  monkeypatch.setenv("MULTIFORMER_KERNEL_CACHE", str(tmp_path))
  cpu_kernels.unavailable.cache_clear()
  try:
    q, k, v = qkv(1, 20, 1, 32)
    reason = local_cpu.kernel_unsupported(q, 4, 0.0)
    assert "no-such-compiler-xyz" in reason and "$CXX" in reason
    assert not calls_the_kernel(lambda q: local_attention(q, k, v, jnp.ones((1, 20), bool), 9),
                                q)
    with pytest.raises(ValueError, match="no-such-compiler-xyz"):
      local_attention(q, k, v, jnp.ones((1, 20), bool), 9, implementation="cpu")
  finally:
    cpu_kernels.unavailable.cache_clear()


def test_a_failed_build_names_the_compiler_output(monkeypatch, tmp_path):
  """A compiler that fails leaves no library behind and reports its output."""
  fake = tmp_path / "fake-cxx"
  fake.write_text("#!/bin/sh\necho 'fatal: out of disk' >&2\nexit 3\n")
  fake.chmod(0o755)
  monkeypatch.setenv("MULTIFORMER_KERNEL_CACHE", str(tmp_path / "cache"))
  with pytest.raises(RuntimeError, match="failed \\(3\\): fatal: out of disk"):
    cpu_kernels.build(str(fake))
  assert not list((tmp_path / "cache").glob("*.so"))
