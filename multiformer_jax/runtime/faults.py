"""Interruptions: the SIGTERM stop request and fault injection for the reliability tests.

SIGTERM (what SLURM, Kubernetes and `kill` send before killing a job) does not stop the run at
once: `StopRequest` records it, and the training loop saves a checkpoint at the end of the
current update and raises `Preempted`; run.py then exits with status 143 (128 + SIGTERM), so a
scheduler sees the job was terminated, and rerunning the same command resumes bit-exactly.

`MULTIFORMER_JAX_FAULT="asr.update:3,st.checkpoint:4"` makes the process SIGKILL itself at the
named points (after update 3 of the ASR stage; while the ST checkpoint of step 4 is being
written). Only the tests set it; it costs one dictionary lookup per update otherwise.
"""

from __future__ import annotations

import os
import signal
import threading

FAULT_ENV = "MULTIFORMER_JAX_FAULT"
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


class Preempted(Exception):
  """A stop was requested (SIGTERM); a checkpoint of `step` was saved."""

  def __init__(self, stage: str, step: int):
    super().__init__(f"stopped by SIGTERM in stage {stage} after update {step}; a checkpoint "
                     f"was saved: rerun the same command to resume")
    self.stage, self.step = stage, step


class StopRequest:
  """Context manager: while active, SIGTERM sets `requested` instead of killing the process."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    self.requested = True

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False


def _parse(spec: str) -> set[tuple[str, int]]:
  points = set()
  for item in filter(None, (s.strip() for s in spec.split(","))):
    name, sep, step = item.rpartition(":")
    if not sep or not step.isdigit():
      raise ValueError(f"{FAULT_ENV}={spec!r}: expected comma-separated point:step items such "
                       f"as asr.update:3 or st.checkpoint:4, got {item!r}")
    points.add((name, int(step)))
  return points


def fault_point(name: str, step: int):
  """SIGKILLs this process if MULTIFORMER_JAX_FAULT names (name, step)."""
  spec = os.environ.get(FAULT_ENV)
  if spec and (name, int(step)) in _parse(spec):
    os.kill(os.getpid(), signal.SIGKILL)
