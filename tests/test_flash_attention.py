"""Our Pallas flash attention with attention dropout (model/attention/flash.py), run in Pallas'
interpreter on this CPU: it must compute the dense path's function, values and gradients, with
the very dropout mask `dropout.dropout` draws for the weights from the same key. The GPU's
Triton compile and its speed: benchmarks/flash_dropout.py (docs/benchmarks.md)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.model import dropout as dropout_lib
from multiformer_jax.model.attention import flash as flash_lib
from multiformer_jax.model.attention import full as full_lib
from multiformer_jax.model.attention import fused
from multiformer_jax.model.attention.full import attention_weights
from tests.test_attention import mhma, np_attention

interpreted = functools.partial(flash_lib.flash_attention, interpret=True)


def random_qkv(batch, q_len, k_len, heads, head_dim, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(keys[0], (batch, q_len, heads, head_dim)),
          jax.random.normal(keys[1], (batch, k_len, heads, head_dim)),
          jax.random.normal(keys[2], (batch, k_len, heads, head_dim)))


def dense(q, k, v, key_mask, rate, rng):
  """full.softmax_attention's arithmetic with dropout.dropout on the weights."""
  weights = attention_weights(q, k, key_mask[:, None, None, :])
  if rate > 0.0:
    weights = dropout_lib.dropout(weights, rate, rng)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def prefix_mask(k_len, lengths):
  return jnp.asarray(np.arange(k_len)[None, :] < np.asarray(lengths)[:, None])


@pytest.mark.parametrize("q_len, k_len, lengths, block", [
    (13, 13, [13, 7, 0], 8),      # self-attention, padding, a row with no valid key, 2 tiles
    (21, 6, [6, 3, 1], 4),        # compressed keys (conv heads): q_len != k_len
    (5, 40, [40, 33, 17], 16),    # more key tiles than query tiles
])
@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_values_and_gradients_equal_the_dense_path_with_the_same_mask(q_len, k_len, lengths,
                                                                     block, rate):
  q, k, v = random_qkv(3, q_len, k_len, 2, 16)
  key_mask = prefix_mask(k_len, lengths)
  rng = jax.random.PRNGKey(5)
  cotangent = jax.random.normal(jax.random.PRNGKey(6), q.shape)

  def loss(attend):
    return lambda q, k, v: jnp.sum(attend(q, k, v) * cotangent)
  ours = lambda q, k, v: interpreted(q, k, v, key_mask, rate, rng, block=block)
  ref = lambda q, k, v: dense(q, k, v, key_mask, rate, rng)
  np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), atol=2e-6)
  got = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=5e-6)


def test_without_dropout_it_is_numpy_softmax_attention():
  q, k, v = random_qkv(2, 11, 11, 2, 32, seed=1)
  key_mask = prefix_mask(11, [11, 4])
  out = interpreted(q, k, v, key_mask, block=4)
  ref = np_attention(q, k, v, np.asarray(key_mask)[:, None, None, :])
  np.testing.assert_allclose(out, ref, atol=2e-6)


def test_dropout_zeroes_the_expected_share_of_weights():
  """With v the identity over keys, out[b, i, h] is row i's dropped weights: a share `rate` of
  the positive weights is zero, and the rest are the weights / (1 - rate)."""
  length, rate = 16, 0.3
  q = jax.random.normal(jax.random.PRNGKey(2), (4, length, 1, 16))
  v = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (4, length, 1, length))
  key_mask = jnp.ones((4, length), bool)
  dropped = interpreted(q, q, v, key_mask, rate, jax.random.PRNGKey(3), block=16)
  weights = jnp.swapaxes(attention_weights(q, q, key_mask[:, None, None, :]), 1, 2)
  zero = np.asarray(dropped == 0.0)
  assert abs(zero.mean() - rate) < 0.03                 # 1024 draws
  np.testing.assert_allclose(np.asarray(dropped)[~zero],
                             np.asarray(weights / (1 - rate))[~zero], rtol=2e-5)


@pytest.mark.parametrize("rate", [0.1, 0.25, 1 / 3, 0.5, 0.9])
def test_keep_threshold_is_bernoullis_comparison(rate):
  """The kernel compares the hash's top 23 bits with an integer; dropout.bernoulli compares a
  float32 uniform with float32(1 - rate): they agree on every 23-bit value near the edge."""
  threshold = flash_lib.keep_threshold(rate)
  mantissas = np.arange(max(threshold - 1000, 0), min(threshold + 1000, 2 ** 23), dtype=np.uint32)
  uniform = (mantissas | np.float32(1.0).view(np.uint32)).view(np.float32) - np.float32(1.0)
  np.testing.assert_array_equal(mantissas < threshold, uniform < np.float32(1.0 - rate))


def test_refusals_name_the_value_and_what_is_valid(monkeypatch):
  q, k, v = random_qkv(1, 4, 4, 1, 12)
  mask = jnp.ones((1, 4), bool)
  with pytest.raises(ValueError, match="head_dim 12 is not one of \\(16, 32, 64, 128\\)"):
    interpreted(q, k, v, mask)
  q, k, v = random_qkv(1, 4, 4, 1, 16)
  with pytest.raises(ValueError, match="needs a dropout_rng"):
    interpreted(q, k, v, mask, 0.1)
  with pytest.raises(ValueError, match="must be in \\[0, 1\\), got 1.0"):
    interpreted(q, k, v, mask, 1.0, jax.random.PRNGKey(0))
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert "backend is 'cpu'" in fused.flash_unsupported(q.astype(jnp.bfloat16), k)


@pytest.fixture
def on_gpu_interpreted(monkeypatch):
  """The backend reports a GPU, and the kernel runs in the interpreter."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  calls = []

  def kernel(q, k, v, key_mask, rate, rng):
    calls.append((q.shape, k.shape, rate))
    return interpreted(q, k, v, key_mask, rate, rng)
  monkeypatch.setattr(full_lib, "flash_attention", kernel)
  return calls


def test_auto_runs_full_and_conv_heads_through_the_kernel_while_dropout_is_active(
    on_gpu_interpreted, monkeypatch):
  """In training with attention dropout, 'auto' sends bf16 full and conv heads to the kernel,
  which draws the dense path's masks: the layer's output equals 'xla's."""
  monkeypatch.setattr(fused, "cudnn_unsupported", lambda q, rate: "no cuDNN on this CPU")
  layout = "1x(2*full+1*conv(3,2)+1*local(3))"
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 9, 64)), jnp.bfloat16)
  mask = prefix_mask(9, [9, 5])
  rngs = {"dropout": jax.random.PRNGKey(1)}
  ours = mhma(layout, d_model=64, dtype=jnp.bfloat16, attention_dropout=0.2,
              attention_implementation="xla")
  params = ours.init(jax.random.PRNGKey(0), x, mask)
  want = ours.apply(params, x, mask, False, rngs=rngs)
  assert on_gpu_interpreted == []
  kernel = mhma(layout, d_model=64, dtype=jnp.bfloat16, attention_dropout=0.2,
                attention_implementation="auto")
  got = kernel.apply(params, x, mask, False, rngs=rngs)
  assert on_gpu_interpreted == [((2, 9, 2, 16), (2, 9, 2, 16), 0.2),
                                ((2, 9, 1, 16), (2, 5, 1, 16), 0.2)]
  for b, n in enumerate([9, 5]):
    np.testing.assert_allclose(np.asarray(got[b, :n], np.float32),
                               np.asarray(want[b, :n], np.float32), atol=0.03)
  on_gpu_interpreted.clear()
  kernel.apply(params, x, mask)                         # evaluation: no dropout, not the kernel
  assert on_gpu_interpreted == []


def test_forcing_flash_where_it_cannot_run_names_the_reason(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  q = jnp.zeros((1, 4, 2, 64), jnp.bfloat16)
  assert not fused.use_flash("auto", q, q, 0.1)
  with pytest.raises(ValueError, match="'flash' cannot run here: the backend is 'cpu'"):
    fused.use_flash("flash", q, q, 0.1)


def test_every_block_lies_inside_its_array():
  """Each BlockSpec of the three kernels, at every grid point, selects a block inside its
  operand (Pallas' interpreter clamps a block that is not, so the value tests cannot see it;
  a GPU reads past the end)."""
  q, k, _ = random_qkv(3, 21, 37, 2, 16)
  plan = flash_lib._Plan(q, k, 0.1, 8, interpret=True)
  rows_q = (plan.batch, plan.q_padded, plan.heads, plan.head_dim)
  rows_k = (plan.batch, plan.k_padded, plan.heads, plan.head_dim)
  per_row = (plan.batch, plan.heads, plan.q_padded)
  valid, words = (plan.batch, plan.k_padded), (2,)
  kernels = {
      "forward": (plan.forward_specs(), [rows_q, rows_k, rows_k, valid, words],
                  [rows_q, per_row]),
      "backward_kv": (plan.backward_kv_specs(),
                      [rows_q, rows_k, rows_k, valid, words, rows_q, per_row, per_row],
                      [rows_k, rows_k]),
      "backward_q": (plan.backward_q_specs(),
                     [rows_q, rows_k, rows_k, valid, words, rows_q, per_row, per_row],
                     [rows_q])}
  for name, ((tiles, in_specs, out_specs), in_shapes, out_shapes) in kernels.items():
    for spec, shape in zip(in_specs + out_specs, in_shapes + out_shapes):
      block = [1 if n is None else n for n in spec.block_shape]
      for point in np.ndindex(tiles, plan.batch, plan.heads):
        index = spec.index_map(*point)
        for i, n, size in zip(index, block, shape):
          assert 0 <= int(i) * n and (int(i) + 1) * n <= size, (name, spec, point, shape)


def test_the_kernels_lower_to_triton_for_cuda_here():
  """The forward and both backward kernels lower through Pallas' Triton lowering for a CUDA
  target on this CPU (what runs on a GPU, short of Triton's own compile), in bf16 at the
  s2t_transformer_s encoder's shape per head group, with dropout."""
  shape = jax.ShapeDtypeStruct((2, 250, 4, 64), jnp.bfloat16)
  key_mask = jnp.ones((2, 250), bool)

  def loss(q, k, v):
    out = flash_lib.flash_attention(q, k, v, key_mask, 0.1, jax.random.PRNGKey(0))
    return jnp.sum(out.astype(jnp.float32))
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(shape, shape, shape).lower(
      lowering_platforms=("cuda",))
  text = lowered.as_text()
  for name in ("flash_dropout_forward", "flash_dropout_backward_kv", "flash_dropout_backward_q"):
    assert f'name = "{name}"' in text
  assert text.count("__gpu$xla.gpu.triton") == 3


def test_the_gpu_benchmark_script_compares_the_same_function(tmp_path):
  """benchmarks/flash_dropout.py, run in the interpreter: its dense and kernel forms agree to
  float32 rounding, so the GPU's row compares equal work."""
  import json
  from benchmarks import flash_dropout
  out = tmp_path / "flash.jsonl"
  flash_dropout.main(["--out", str(out), "--shapes", "2x24", "--heads", "2", "--head_dim", "16",
                      "--dtype", "float32", "--interpret", "--repeats", "1"])
  (row,) = [json.loads(line) for line in out.read_text().splitlines()[1:]]
  for name in ("out", "dq", "dk", "dv"):
    assert row[f"max_abs_diff_{name}"] < 1e-5 < row[f"{name}_abs_mean"]
  assert {"seconds_xla", "seconds_flash", "seconds_flash_no_dropout"} <= set(row)


@pytest.mark.parametrize("q_len, k_len", [(3, 5), (20, 250), (250, 125)])
def test_default_tiles_suit_tritons_dot(q_len, k_len):
  """Tiles are powers of two from 16 (tl.dot's smallest side) to the default 64, even for
  sequences shorter than 16, whose padding is then masked."""
  q, k, _ = random_qkv(1, q_len, k_len, 1, 16)
  plan = flash_lib._Plan(q, k, 0.1, flash_lib.DEFAULT_BLOCK, interpret=True)
  for tile, padded, length in ((plan.block_q, plan.q_padded, q_len),
                               (plan.block_k, plan.k_padded, k_len)):
    assert tile in (16, 32, 64) and padded % tile == 0 and padded >= length
  v = jax.random.normal(jax.random.PRNGKey(9), k.shape)
  mask = prefix_mask(k_len, [k_len - 1])
  np.testing.assert_allclose(interpreted(q, k, v, mask, 0.2, jax.random.PRNGKey(1)),
                             dense(q, k, v, mask, 0.2, jax.random.PRNGKey(1)), atol=2e-6)
