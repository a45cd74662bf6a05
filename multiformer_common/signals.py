"""Child processes that a stop signal does not reach: the stop signals a cluster or a user sends
to a whole process group (SIGTERM, SIGINT, SIGUSR1) are for the parent, which decides when to
stop and stops its children itself (a loader worker killed by Ctrl-C would take its batch with
it; SIGUSR1's default action would end it).

A child is started with the signals blocked (`stop_signals_blocked`: the mask survives fork and
exec, so none arrives while it starts), then ignores them and unblocks
(`ignore_stop_signals`, the first thing it runs): a signal that came meanwhile is dropped."""

from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@contextlib.contextmanager
def stop_signals_blocked():
  """Blocks the stop signals in this thread while children are started here; the parent sees
  any that arrived once the block ends (they wait, pending)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals(ignored=STOP_SIGNALS):
  """In a child started under `stop_signals_blocked`: ignore `ignored` from now on (the other
  stop signals keep their default action: ending the child)."""
  for signum in ignored:
    signal.signal(signum, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def ignore_interrupts():
  """ignore_stop_signals but for SIGTERM: a child its parent (or a broken process pool) ends
  with SIGTERM, which Ctrl-C and SIGUSR1 to the process group do not reach."""
  ignore_stop_signals((signal.SIGINT, signal.SIGUSR1))


def start_resource_tracker():
  """Starts multiprocessing's resource tracker (the process that cleans up the semaphores of
  queues and pools, started by the first one) with the stop signals blocked: it ignores SIGINT
  and SIGTERM itself, but SIGUSR1 to the process group would end it. A no-op once it runs."""
  from multiprocessing import resource_tracker  # pylint: disable=import-outside-toplevel
  with stop_signals_blocked():
    resource_tracker.ensure_running()
