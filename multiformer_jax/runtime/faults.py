"""Interruptions: the stop signals a cluster sends, and fault injection for the reliability
tests.

SIGTERM (what SLURM, Kubernetes and `kill` send before killing a job), SIGINT (Ctrl-C, and
what some schedulers send) and SIGUSR1 (SLURM's `--signal=USR1@SECONDS`, the usual warning
before a time limit) do not kill a training run on the spot. `StopRequest` records the first
one; the training loop finishes the update it is in (cutting short a dev evaluation), saves a
checkpoint with the data position and raises `Preempted`; the command then exits with
128 + the signal's number (143, 130, 138), without a traceback, and rerunning the same command
resumes bit-exactly. Outside the training loop (preparing data, building a stage, evaluating
after training) a stop signal ends the run at once with the same status: nothing there needs
saving, since preparation and evaluation resume by themselves. A second Ctrl-C stops at once,
without saving.

`MULTIFORMER_JAX_FAULT="asr.update:3,st.checkpoint:4"` makes the process SIGKILL itself at the
named points (after update 3 of the ASR stage; while the ST checkpoint of step 4 is being
written); `asr.update:3=SIGUSR1@group` sends SIGUSR1 to its whole process group there instead
(`@process`: to this process alone). Only the tests set it; it costs one dictionary lookup per
update otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from multiformer_common.errors import InvalidValue
from multiformer_common.signals import STOP_SIGNALS

FAULT_ENV = "MULTIFORMER_JAX_FAULT"
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


def exit_code(signum: int) -> int:
  """The exit status after a stop by `signum`: 128 + its number, as a shell reports a process
  that signal ended (SIGTERM 143, SIGINT 130, SIGUSR1 138)."""
  return 128 + int(signum)


def signal_name(signum: int) -> str:
  return signal.Signals(signum).name


class Stopped(BaseException):
  """A stop signal outside the training loop: the run ends at once (nothing to save). A
  BaseException, as KeyboardInterrupt is: code that catches Exception (a checkpoint that does
  not restore, a worker's error) must not take it for a failure of its own."""

  def __init__(self, signum: int, where: str = ""):
    super().__init__(f"stopped by {signal_name(signum)}{where}; rerun the same command to "
                     f"resume")
    self.signum = signum


class Preempted(Stopped):
  """A stop was requested in a stage's training loop; a checkpoint of `step` was saved."""

  def __init__(self, stage: str, step: int, signum: int = signal.SIGTERM):
    super().__init__(signum, f" in stage {stage} after update {step}; a checkpoint was saved")
    self.stage, self.step = stage, step


class StopRequest:
  """The process's stop signals: while installed, SIGTERM, SIGINT and SIGUSR1 set `signum`
  (the first one received) instead of killing the process. Inside `deferred()` (the training
  loop) that is all they do, and the loop stops at a safe point; outside it the handler raises
  `Stopped` at once. A second SIGINT raises KeyboardInterrupt (stop now, save nothing)."""

  def __init__(self):
    self.signum: int | None = None
    self.deferring = False
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    log = logging.getLogger("multiformer_jax")
    if self.signum is not None:
      if signum == signal.SIGINT == self.signum:
        raise KeyboardInterrupt("a second Ctrl-C: stopped at once, without saving")
      log.warning("%s received while already stopping for %s: still stopping",
                  signal_name(signum), signal_name(self.signum))
      return
    self.signum = signum
    if not self.deferring:
      raise Stopped(signum)
    log.warning("%s received: the run saves a checkpoint after the current update and stops "
                "(exit status %d)%s", signal_name(signum), exit_code(signum),
                "; Ctrl-C again stops at once without saving" if signum == signal.SIGINT
                else "")

  @contextlib.contextmanager
  def deferred(self):
    """Within: a stop signal only sets `signum`; one received before raises Stopped now."""
    if self.signum is not None:
      raise Stopped(self.signum)
    before, self.deferring = self.deferring, True
    try:
      yield self
    finally:
      self.deferring = before

  def install(self):
    if threading.current_thread() is threading.main_thread():
      for signum in STOP_SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)

  def uninstall(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}


_ACTIVE: StopRequest | None = None


@contextlib.contextmanager
def handling_stop_signals():
  """Installs the process's StopRequest for the duration (once: nested calls share it)."""
  global _ACTIVE  # pylint: disable=global-statement
  if _ACTIVE is not None:
    yield _ACTIVE
    return
  _ACTIVE = StopRequest()
  _ACTIVE.install()
  try:
    yield _ACTIVE
  finally:
    _ACTIVE.uninstall()
    _ACTIVE = None


def active_stop_request() -> StopRequest:
  """The installed StopRequest, or a fresh one that no signal reaches (a stage run outside
  `handling_stop_signals`, as some tests do)."""
  return _ACTIVE if _ACTIVE is not None else StopRequest()


def _parse(spec: str) -> list[tuple[str, int, str]]:
  """-> [(point, step, action)]: action '' (SIGKILL this process), or a signal's name with
  '@group' or '@process' (to whom it is sent)."""
  points = []
  for item in filter(None, (s.strip() for s in spec.split(","))):
    where, _, action = item.partition("=")
    name, sep, step = where.rpartition(":")
    signame, _, whom = action.partition("@")
    if (not sep or not step.isdigit() or (action and (
        signame not in {signal_name(s) for s in STOP_SIGNALS} or
        whom not in ("group", "process")))):
      raise InvalidValue(f"{FAULT_ENV}={spec!r}: expected comma-separated point:step items such "
                       f"as asr.update:3 or st.checkpoint:4, optionally =SIGNAL@group or "
                       f"=SIGNAL@process (SIGTERM, SIGINT, SIGUSR1), got {item!r}")
    points.append((name, int(step), action))
  return points


def fault_point(name: str, step: int):
  """At a point MULTIFORMER_JAX_FAULT names (name:step): SIGKILLs this process, or with
  =SIGNAL@group sends SIGNAL to this process's whole process group (its loader workers too),
  with =SIGNAL@process to this process alone."""
  spec = os.environ.get(FAULT_ENV)
  if not spec:
    return
  for point, at, action in _parse(spec):
    if (point, at) != (name, int(step)):
      continue
    if not action:
      os.kill(os.getpid(), signal.SIGKILL)
    signame, _, whom = action.partition("@")
    signum = signal.Signals[signame]
    if whom == "group":
      os.killpg(os.getpgid(0), signum)
    else:
      os.kill(os.getpid(), signum)
