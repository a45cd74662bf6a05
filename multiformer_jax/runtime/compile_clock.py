"""Seconds this process has spent compiling, read from JAX's monitoring events.

A jitted function's first call with a new input shape traces it to a jaxpr, lowers that to
StableHLO and hands it to XLA, which compiles it or, with the persistent compilation cache on
(`train.compilation_cache`), reads the executable from disk. JAX reports the duration of each of
the three phases as a `jax.monitoring` event; the clock adds them up, so a stage can say what
share of its wall time went to compiling rather than to training (its log line and DONE.json's
`compile_s` / `compile_fraction`).
"""

from __future__ import annotations

import os
import threading
import time

import jax
from jax import monitoring

# The phases of a first call (jax._src.dispatch's event names); XLA's phase includes reading
# the executable from the persistent cache when it is there.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
PHASES = ("trace", "lower", "compile")

_lock = threading.Lock()
# Per event: the (start, end) intervals it reported, on time.perf_counter's clock. Events can
# overlap in time (one reported inside another, or by another thread while the training loop
# compiles), so the clock measures the union of the intervals, never a plain sum of durations:
# the compile time it reports cannot exceed the wall time it happened in.
_intervals = {event: [] for event in COMPILE_EVENTS}
_installed = False


def _listen(event: str, duration: float, **_):
  if event in _intervals:
    end = time.perf_counter()
    with _lock:
      _intervals[event].append((end - duration, end))


def _union_seconds(intervals) -> float:
  """Length of the union of (start, end) intervals."""
  total, covered_to = 0.0, float("-inf")
  for start, end in sorted(intervals):
    if end > covered_to:
      total += end - max(start, covered_to)
      covered_to = end
  return total


def install():
  """Starts counting (once per process; later calls do nothing)."""
  global _installed
  with _lock:
    if not _installed:
      monitoring.register_event_duration_secs_listener(_listen)
      _installed = True


def seconds() -> float:
  """Compile seconds since `install()`: the time inside any phase (nested or overlapping
  events counted once)."""
  with _lock:
    return _union_seconds([i for event in COMPILE_EVENTS for i in _intervals[event]])


def by_phase() -> dict:
  """{'trace': s, 'lower': s, 'compile': s} since `install()`, each the time inside that phase
  (a phase nested in another is counted in both, so they can add up to more than `seconds()`)."""
  with _lock:
    return {phase: _union_seconds(_intervals[event])
            for phase, event in zip(PHASES, COMPILE_EVENTS)}


def use_compilation_cache(config):
  """Turns on the persistent compilation cache the config names (train.compilation_cache; ""
  = off): reruns, resumed runs and later commands on the same run load their compiled programs
  instead of compiling them again. Call it before anything compiles. Programs that compile in
  under JAX's jax_persistent_cache_min_compile_time_secs are not kept: 1 s unless the
  environment sets another (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS)."""
  cache = config.train.compilation_cache
  if cache:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(cache))
