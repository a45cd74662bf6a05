"""The compile clock counts first calls (trace, lower, XLA) and nothing else."""

import jax
import jax.numpy as jnp

from multiformer_jax.runtime import compile_clock


def test_counts_a_first_call_and_not_a_cached_one():
  compile_clock.install()
  compile_clock.install()                       # idempotent: one listener, not two

  @jax.jit
  def step(x):
    return jnp.tanh(x @ x.T).sum()

  x = jnp.ones((5, 7))
  before = compile_clock.seconds()
  phases_before = compile_clock.by_phase()
  jax.block_until_ready(step(x))
  first = compile_clock.seconds() - before
  assert first > 0
  phases = compile_clock.by_phase()
  assert all(phases[p] > phases_before[p] for p in ("trace", "lower", "compile"))
  assert abs(sum(phases.values()) - compile_clock.seconds()) < 1e-9
  y = jax.block_until_ready(x + 1)              # (an eager op compiles too: before the clock)
  again = compile_clock.seconds()
  jax.block_until_ready(step(y))                # same shape: the compiled step is reused
  assert compile_clock.seconds() == again
  jax.block_until_ready(step(jnp.ones((6, 7))))  # a new shape compiles again
  assert compile_clock.seconds() > again
