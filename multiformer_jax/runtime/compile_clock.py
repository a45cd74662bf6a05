"""Seconds this process has spent compiling, read from JAX's monitoring events.

A jitted function's first call with a new input shape traces it to a jaxpr, lowers that to
StableHLO and hands it to XLA, which compiles it or, with the persistent compilation cache on
(`train.compilation_cache`), reads the executable from disk. JAX reports the duration of each of
the three phases as a `jax.monitoring` event; the clock adds them up, so a stage can say what
share of its wall time went to compiling rather than to training (its log line and DONE.json's
`compile_s` / `compile_fraction`).
"""

from __future__ import annotations

import threading

from jax import monitoring

# The phases of a first call (jax._src.dispatch's event names); XLA's phase includes reading
# the executable from the persistent cache when it is there.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")

_lock = threading.Lock()
_seconds = {event: 0.0 for event in COMPILE_EVENTS}
_installed = False


def _listen(event: str, duration: float, **_):
  if event in _seconds:
    with _lock:
      _seconds[event] += duration


def install():
  """Starts counting (once per process; later calls do nothing)."""
  global _installed
  with _lock:
    if not _installed:
      monitoring.register_event_duration_secs_listener(_listen)
      _installed = True


def seconds() -> float:
  """Compile seconds since `install()`, all phases together."""
  with _lock:
    return sum(_seconds.values())


def by_phase() -> dict:
  """{'trace': s, 'lower': s, 'compile': s} since `install()`."""
  with _lock:
    return dict(zip(("trace", "lower", "compile"), (_seconds[e] for e in COMPILE_EVENTS)))
