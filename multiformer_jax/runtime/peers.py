"""Several processes of a run fail together: when one dies, the others stop within a bounded
time, naming it, instead of waiting for ever in a collective that cannot complete (NCCL waits
for a dead peer without end; gloo errors out, then JAX's shutdown waits for it).

Each process runs a watch (a daemon thread): every PERIOD_S it publishes a heartbeat counter in
the run's key-value store (JAX's coordination service) and reads the others'. A process whose
counter has not moved for `timeout_s`, or that published that it failed, is lost: the watch
logs which process it was (rank, host, pid) and why, and ends this process with status
PEER_LOST_EXIT_CODE (75, EX_TEMPFAIL: rerunning the same command resumes). A process that
leaves (finished, stopped by a signal as all of them are, or failed) says so and is not waited
for; a failure stops the others too. After it has left, a process's watch goes on, to cut short
an exit that waits for a dead peer (JAX's shutdown does). Process 0 runs the coordination
service: when it dies, JAX's own client ends every other process at once (SIGABRT, "the JAX
distributed service detected fatal errors"), before any watch could; each of them has named
process 0's host and pid in its log when it started (were the abort to be skipped, the watch
would name it after `timeout_s` of failed reads of the store, which dies with it).

At exit the watch is stopped and its thread joined (`stop_all`, an exit handler that the process
set-up registers before JAX is imported, so that it runs after JAX's own, which shuts the
client down while the watch still guards it). Left running into the interpreter's
finalization, a daemon thread that returns from a call into JAX's C++ client is ended by
pthread_exit, whose unwinding through that C++ frame aborts the process: a run that had
finished would end with SIGABRT.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time

PEER_LOST_EXIT_CODE = 75
PERIOD_S = 2.0
PREFIX = "peers"
_RUNNING: set[PeerWatch] = set()


def stop_all():
  """Stops every running watch and waits for its thread (see the module's docstring)."""
  for watch in list(_RUNNING):
    watch.stop()


def _exit_now(code: int):
  """Ends the process with `code` at once, its log flushed: the main thread may hang, and exit
  handlers or finalization would wait for it."""
  for handler in logging.getLogger("multiformer_jax").handlers:
    handler.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


class PeerWatch:
  """The watch of one process (see the module's docstring). `start` it after
  jax.distributed.initialize; `leave(status)` before the process ends on purpose."""

  def __init__(self, timeout_s: float = 60.0):
    import jax  # pylint: disable=import-outside-toplevel
    self.timeout_s = timeout_s
    self.rank, self.count = jax.process_index(), jax.process_count()
    self._thread = None
    self._beats = 0
    self._seen = {}                       # rank -> (last value, when it changed)
    self._who = {}                        # rank -> 'host H, pid P'
    self._left = None                     # this process's status once it leaves
    self._client = None
    self._failed = {}                     # rank -> when its failure was first read
    self._stopping = threading.Event()
    self._exit_status = 1                 # what `stop` exits with if the thread will not end

  def _set(self, key: str, value: str):
    self._client.key_value_set(f"multiformer_jax/{PREFIX}/{key}", value, allow_overwrite=True)

  def _get(self, key: str) -> str | None:
    try:
      return self._client.key_value_try_get(f"multiformer_jax/{PREFIX}/{key}")
    except Exception as error:  # pylint: disable=broad-except  # JaxRuntimeError
      if str(error).startswith("NOT_FOUND"):
        return None
      raise

  def start(self):
    # The client itself, not jax's functions: once JAX shuts down at exit they would start a
    # new backend from this thread.
    from multiformer_jax.runtime import processes  # pylint: disable=import-outside-toplevel
    self._client = processes.client()
    self._set(f"who/{self.rank}", f"host {socket.gethostname()}, pid {os.getpid()}")
    if self.rank:
      who = self._client.blocking_key_value_get(f"multiformer_jax/{PREFIX}/who/0", 300_000)
      self._who[0] = who
      logging.getLogger("multiformer_jax").info(
          "process 0 (%s) runs this run's coordination service: if it dies, JAX ends this "
          "process at once (\"the JAX distributed service detected fatal errors\")", who)
    self._thread = threading.Thread(target=self._run, daemon=True, name="peer watch")
    self._thread.start()
    _RUNNING.add(self)
    return self

  def leave(self, status: str, exit_status: int = 1):
    """This process ends ('finished', 'stopped by SIGTERM', 'failed: ...'; it will exit with
    `exit_status`): the others stop waiting for it (a failure stops them too). The watch goes
    on until the process exits, to cut short an exit that waits for a dead process (JAX's
    shutdown does)."""
    self._left, self._exit_status = status, exit_status
    try:
      self._set(f"beat/{self.rank}", f"left: {status}")
    except Exception:  # pylint: disable=broad-except  # the store may be gone already
      pass

  def describe(self, rank: int) -> str:
    """'process R (host H, pid P)', from what it published when it started (read while the
    store still answers, and kept)."""
    if rank not in self._who:
      try:
        who = self._get(f"who/{rank}")
      except Exception:  # pylint: disable=broad-except  # the store is gone
        who = None
      if who:
        self._who[rank] = who
    return f"process {rank} ({self._who.get(rank) or 'host unknown'})"

  def _lost(self, rank: int, why: str):
    """Ends this process: status 0 if it had finished its work, else PEER_LOST_EXIT_CODE."""
    code = 0 if self._left == "finished" else PEER_LOST_EXIT_CODE
    log = logging.getLogger("multiformer_jax")
    log.error("%s %s; process %d stops too (exit status %d)%s", self.describe(rank), why,
              self.rank, code, "" if code == 0 else ": rerun the same command to resume from "
              "the last checkpoint")
    _exit_now(code)

  def stop(self):
    """Ends the watch: its thread finishes the call it is in, if any, and returns. Should a call
    not return within `timeout_s`, the process exits at once with the status it was ending
    with (finalizing with the thread inside the call would abort it)."""
    _RUNNING.discard(self)
    self._stopping.set()
    if self._thread is None:
      return
    self._thread.join(self.timeout_s)
    if self._thread.is_alive():
      logging.getLogger("multiformer_jax").error(
          "process %d: the peer watch did not end within %.0f s of the exit; exiting with "
          "status %d", self.rank, self.timeout_s, self._exit_status)
      _exit_now(self._exit_status)

  def _run(self):
    failing_since = None
    while not self._stopping.wait(PERIOD_S):
      now = time.monotonic()
      try:
        self._beats += 1
        if self._left is None:
          self._set(f"beat/{self.rank}", str(self._beats))
        beats = {r: self._get(f"beat/{r}") for r in range(self.count) if r != self.rank}
        for rank, value in beats.items():
          if value is not None:
            self.describe(rank)            # known before it may be needed
        failing_since = None
      except Exception as error:  # pylint: disable=broad-except  # the coordinator is gone
        failing_since = failing_since or now
        if now - failing_since > self.timeout_s:
          self._lost(0, f"does not answer for {now - failing_since:.0f} s (the run's "
                        f"coordination service: {str(error).splitlines()[0][:200]}): it died "
                        f"or its host is down")
        continue
      for rank, value in beats.items():
        if value is None:
          value = "not started"
        if value.startswith("left: failed") and self._left is None:
          # A period's grace: this process's own main thread may be about to fail with it.
          if now - self._failed.setdefault(rank, now) >= PERIOD_S:
            self._lost(rank, f"{value[len('left: '):]}")
        if value.startswith("left:"):
          continue
        last, since = self._seen.get(rank, (None, now))
        if value != last:
          self._seen[rank] = (value, now)
        elif now - since > self.timeout_s:
          self._lost(rank, f"has given no sign of life for {now - since:.0f} s (killed, out of "
                           f"memory, or its host is down)")
