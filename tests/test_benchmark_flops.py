"""The FLOP count the benchmarks' utilisation figures divide by (benchmarks/common.py)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.common import executable_stats, lowered_flops


def test_lowered_flops_of_a_matmul_is_2mnk():
  a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
  assert lowered_flops(jax.jit(jnp.matmul).lower(a, b)) == 2 * 64 * 32 * 16


def test_lowered_flops_match_the_compiled_count_on_cpu_for_a_gradient():
  """The train step's count is read off the lowered program because a GPU's compiled count
  leaves out library matmuls; on CPU the two agree, which is what makes the switch safe."""
  if jax.default_backend() != "cpu":
    pytest.skip("the compiled count is the reference only on CPU")
  params = {"w1": jnp.ones((128, 256)), "w2": jnp.ones((256, 64))}
  x = jnp.ones((32, 128))

  def loss(p, x):
    return jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2

  lowered = jax.jit(jax.grad(loss)).lower(params, x)
  # forward x w1, h w2; backward d w2, d h, d w1 (x is not differentiated)
  matmuls = 2 * 32 * (2 * 128 * 256 + 3 * 256 * 64)
  counted = lowered_flops(lowered)
  assert matmuls <= counted < 1.01 * matmuls   # plus the element-wise tanh and its derivative
  compiled = executable_stats(lowered.compile())["flops"]
  assert counted == pytest.approx(compiled, rel=0.02)
