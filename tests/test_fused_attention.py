"""cuDNN's fused attention for full and conv heads (attention/fused.py): the call it makes,
when it is chosen, and what it refuses. cuDNN itself needs a GPU; benchmarks/gpu_check.sh
compares it with our softmax there."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import ModelConfig
from multiformer_jax.model.attention import fused
from multiformer_jax.model.attention import full as full_lib
from multiformer_jax.model.model_config import ConfigError
from tests.test_attention import mhma, np_attention, qkv


def test_prefix_key_call_equals_numpy_softmax_with_padding():
  """The arguments given to jax.nn.dot_product_attention (layout, scale, key lengths), run
  through its XLA implementation, give our masked softmax; a row with no valid key stays
  finite."""
  q, k, v = qkv(3, 11, 2, 8)
  lengths = np.array([11, 6, 0])
  key_mask = jnp.asarray(np.arange(11)[None] < lengths[:, None])
  out = fused.prefix_key_attention(q, k, v, key_mask, implementation="xla")
  ref = np_attention(q, k, v, np.asarray(key_mask)[:, None, None, :])
  np.testing.assert_allclose(out[:2], ref[:2], atol=2e-6)
  assert np.isfinite(np.asarray(out)).all()


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on a GPU only")
@pytest.mark.parametrize("head_dim", [8, 64])
def test_cudnn_call_equals_numpy_softmax_on_a_gpu(head_dim):
  """The same call through cuDNN itself, in bf16 (the smallest head_dim 'auto' sends to it, and
  the papers' 64): numpy's softmax of the same bf16 inputs, to bf16 rounding."""
  q, k, v = (x.astype(jnp.bfloat16) for x in qkv(3, 11, 2, head_dim))
  lengths = np.array([11, 6, 0])
  key_mask = jnp.asarray(np.arange(11)[None] < lengths[:, None])
  out = fused.prefix_key_attention(q, k, v, key_mask, implementation="cudnn")
  ref = np_attention(*(np.asarray(x, np.float32) for x in (q, k, v)),
                     np.asarray(key_mask)[:, None, None, :])
  np.testing.assert_allclose(np.asarray(out[:2], np.float32), ref[:2], atol=0.05)


@pytest.fixture
def on_gpu(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


@pytest.mark.parametrize("dtype, head_dim, rate, reason", [
    (jnp.bfloat16, 64, 0.0, None),
    (jnp.float16, 128, 0.0, None),
    (jnp.float32, 64, 0.0, "model.dtype='bfloat16'"),
    (jnp.bfloat16, 12, 0.0, "head_dim 12"),
    (jnp.bfloat16, 256, 0.0, "head_dim 256"),
    (jnp.bfloat16, 64, 0.1, "attention dropout 0.1 is active")])
def test_cudnn_applies_only_where_it_computes_the_same_function(on_gpu, dtype, head_dim, rate,
                                                                reason):
  q = jnp.zeros((1, 4, 2, head_dim), dtype)
  got = fused.cudnn_unsupported(q, rate)
  assert got is None if reason is None else reason in got
  assert fused.use_cudnn("auto", q, rate) == (reason is None)
  assert not fused.use_cudnn("xla", q, rate)


def test_forcing_cudnn_where_it_cannot_run_names_the_reason(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  q = jnp.zeros((1, 4, 2, 64), jnp.bfloat16)
  assert not fused.use_cudnn("auto", q, 0.0)
  with pytest.raises(ValueError, match="cannot run here: the backend is 'cpu'"):
    fused.use_cudnn("cudnn", q, 0.0)
  with pytest.raises(ValueError, match="valid: \\('auto', 'xla', 'cudnn', 'flash'\\)"):
    fused.use_cudnn("pallas", q, 0.0)
  with pytest.raises(ConfigError, match="model.attention_implementation='pallas'"):
    ModelConfig(attention_implementation="pallas")


def test_full_and_conv_heads_route_through_cudnn_only_without_dropout(on_gpu, monkeypatch):
  """With the backend reporting a GPU, bf16 full and conv heads call the fused attention in
  evaluation (here its XLA twin, since this machine has no cuDNN) and give the layer's output
  of our own softmax; in training with attention dropout they do not call it."""
  calls = []

  def fused_twin(q, k, v, key_mask):
    calls.append(q.shape)
    return fused.prefix_key_attention(q, k, v, key_mask, implementation="xla")
  monkeypatch.setattr(full_lib, "prefix_key_attention", fused_twin)
  layout = "1x(2*full+1*conv(3,2)+1*local(3))"
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 9, 32)), jnp.bfloat16)
  mask = jnp.asarray(np.arange(9)[None] < np.array([[9], [5]]))
  ours = mhma(layout, dtype=jnp.bfloat16, attention_dropout=0.2,
              attention_implementation="xla")
  params = ours.init(jax.random.PRNGKey(0), x, mask)
  want = ours.apply(params, x, mask)
  cudnn = mhma(layout, dtype=jnp.bfloat16, attention_dropout=0.2,
               attention_implementation="auto")
  got = cudnn.apply(params, x, mask)
  assert calls == [(2, 9, 2, 8), (2, 9, 1, 8)]          # the full group, then the conv group
  for b, n in enumerate([9, 5]):
    np.testing.assert_allclose(np.asarray(got[b, :n], np.float32),
                               np.asarray(want[b, :n], np.float32), atol=0.03)
  calls.clear()
  cudnn.apply(params, x, mask, False, rngs={"dropout": jax.random.PRNGKey(1)})
  assert calls == []
