"""The compile clock counts first calls (trace, lower, XLA) and nothing else; the persistent
cache keeps what JAX's threshold says."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax.runtime import compile_clock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_the_cache_keeps_the_minimum_compile_time_the_environment_sets(tmp_path):
  """use_compilation_cache names the cache's folder and leaves JAX's threshold for what to keep
  to JAX: its default, or what JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says."""
  script = ("import ml_collections, jax\n"
            "from multiformer_jax.runtime import compile_clock\n"
            "config = ml_collections.ConfigDict({'train': {'compilation_cache': %r}})\n"
            "compile_clock.use_compilation_cache(config)\n"
            "print(jax.config.jax_compilation_cache_dir, "
            "jax.config.jax_persistent_cache_min_compile_time_secs)\n" % str(tmp_path))
  for setting, expected in (("0.2", 0.2), (None, 1.0)):
    env = {k: v for k, v in os.environ.items()
           if k != "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"}
    if setting is not None:
      env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = setting
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    folder, threshold = result.stdout.split()
    assert folder == str(tmp_path) and float(threshold) == expected, (setting, result.stdout)
