"""The compile clock counts first calls (trace, lower, XLA) and nothing else."""

import jax
import jax.numpy as jnp
import numpy as np

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
  assert compile_clock.seconds() <= sum(phases.values()) + 1e-9
  y = jax.block_until_ready(x + 1)              # (an eager op compiles too: before the clock)
  again = compile_clock.seconds()
  jax.block_until_ready(step(y))                # same shape: the compiled step is reused
  assert compile_clock.seconds() == again
  jax.block_until_ready(step(jnp.ones((6, 7))))  # a new shape compiles again
  assert compile_clock.seconds() > again


def test_nested_events_count_once(monkeypatch):
  """Events that overlap in time (one reported inside another, or by two threads) add the time
  they cover once: the clock never exceeds the wall time."""
  monkeypatch.setattr(compile_clock, "_intervals",
                      {event: [] for event in compile_clock.COMPILE_EVENTS})
  trace, lower = compile_clock.COMPILE_EVENTS[:2]
  compile_clock._listen(trace, 0.5)   # pylint: disable=protected-access  # an inner trace...
  compile_clock._listen(trace, 2.0)   # pylint: disable=protected-access  # ...in an outer one
  compile_clock._listen(lower, 1.0)   # pylint: disable=protected-access  # inside both
  phases = compile_clock.by_phase()
  assert abs(phases["trace"] - 2.0) < 0.01 and abs(phases["lower"] - 1.0) < 0.01
  assert abs(compile_clock.seconds() - 2.0) < 0.01


def test_union_of_intervals_against_a_brute_force_count():
  rng = np.random.default_rng(0)
  for _ in range(50):
    starts = rng.integers(0, 100, size=rng.integers(1, 8))
    intervals = [(int(s), int(s + rng.integers(0, 30))) for s in starts]
    covered = np.zeros(200, bool)
    for start, end in intervals:
      covered[start:end] = True
    assert compile_clock._union_seconds(intervals) == covered.sum()  # pylint: disable=protected-access
