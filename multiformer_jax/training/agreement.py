"""What every process of a run decides together, at the same update: to stop (a stop signal
reached any of them), to save a progress checkpoint (its period is due on process 0's clock),
and to cut a dev evaluation short.

Each update casts a vote: this process's flags, summed over every device of every process by a
tiny collective queued just before the update. On each device it runs once the previous
update has finished, so reading it after the update is dispatched keeps the host one update
ahead (nothing is lost to the sync), and since every process reads the same sums they decide
alike: a signal that reaches one process, or all of them at different moments, stops all of
them after the same update. The dev loss casts one per dev batch the same way.

Dev scoring (decoding the dev split) is process 0's alone; the others wait for its result in a
loop that polls the run's key-value store (so their signal handlers run), publishing a stop
notice that process 0 reads between decoded batches. With one process there is nothing to
publish and the votes are this process's flags.

Why not orbax's save-decision policies and JAX's preemption sync point: JAX's notifier hears
SIGTERM alone (not SIGINT or SIGUSR1), only with several processes, through a C handler that
any Python SIGTERM handler replaces; orbax's time-based policy decides on each host's clock.
Orbax still writes every checkpoint.
"""

from __future__ import annotations

import dataclasses
import signal
import time

import jax
import numpy as np

from multiformer_jax.runtime import faults, processes
from multiformer_jax.training.parallel import DataParallel

# The vote's fields: one per stop signal (the first one named wins when several arrive), then
# whether process 0 finds a progress checkpoint due.
VOTED_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
WAIT_POLL_S = 0.2


class EvaluationCut(BaseException):
  """A dev evaluation was cut short by a stop signal (`signum`) on some process. A
  BaseException: nothing that catches Exception on the way must swallow it."""

  def __init__(self, signum: int):
    super().__init__(f"dev evaluation cut short by {faults.signal_name(signum)}")
    self.signum = signum


@dataclasses.dataclass(frozen=True)
class Decision:
  stop: int | None          # the signal to stop for, or None
  save: bool                # a progress checkpoint is due


@dataclasses.dataclass
class SavePeriod:
  """How often progress checkpoints are written, whatever the dev evaluation's period:
  train.checkpoint_every_minutes and train.checkpoint_every_updates (0 = not on that count),
  since the last checkpoint of any kind."""
  minutes: float = 0.0
  updates: int = 0
  last_step: int = 0
  last_time: float = dataclasses.field(default_factory=time.monotonic)

  def due(self, step: int) -> bool:
    return bool((self.updates and step - self.last_step >= self.updates) or
                (self.minutes and time.monotonic() - self.last_time >= 60 * self.minutes))

  def saved(self, step: int):
    self.last_step, self.last_time = step, time.monotonic()


class Agreement:
  """Votes of one stage's processes (see the module's docstring)."""

  def __init__(self, dp: DataParallel, stop: faults.StopRequest, period: SavePeriod,
               name: str):
    self.stop = stop
    self.period = period
    self.name = name                       # the stage: keys of the key-value store
    self._sum = dp.summing_program()
    self._first = jax.process_index() == 0
    self._published = False
    self._dev_batches = self._decoded_batches = 0    # counted for the tests' fault points

  def _flags(self, step: int | None) -> np.ndarray:
    flags = np.zeros(len(VOTED_SIGNALS) + 1, np.int32)
    signum = self.stop.signum
    if signum in VOTED_SIGNALS:
      flags[VOTED_SIGNALS.index(signum)] = 1
    flags[-1] = int(step is not None and self._first and self.period.due(step))
    return flags

  def _publish_stop(self, signum: int):
    if not self._published and not processes.single():
      processes.publish("stop", str(int(signum)))
      self._published = True

  def cast(self, step: int | None = None):
    """Queues this process's vote for what to do after update `step` (call before it; None:
    after a dev batch, where no checkpoint is saved)."""
    return self._sum(self._flags(step))

  def read(self, vote) -> Decision:
    """Every process's votes summed -> the decision (the same on every process)."""
    counts = DataParallel.read_sum(vote)
    stop = next((s for s, n in zip(VOTED_SIGNALS, counts[:-1]) if n > 0), None)
    return Decision(stop=None if stop is None else int(stop), save=bool(counts[-1]))

  def check_dev_batch(self, vote):
    """After a dev-loss batch: raises EvaluationCut if a process asked to stop."""
    self._dev_batches += 1
    faults.fault_point(f"{self.name}.dev_loss", self._dev_batches)   # tests: a stop here
    decision = self.read(vote)
    if decision.stop is not None:
      raise EvaluationCut(decision.stop)

  def scoring_cancelled(self) -> int | None:
    """For process 0 while it decodes the dev split: the stop signal, its own or one another
    process published, or None."""
    self._decoded_batches += 1
    faults.fault_point(f"{self.name}.dev_decode", self._decoded_batches)  # tests: a stop here
    return self.stop_signal()

  def stop_signal(self) -> int | None:
    """This process's stop signal, or one another process published, or None."""
    if self.stop.signum is not None:
      return self.stop.signum
    noticed = processes.read_published("stop")
    return int(noticed) if noticed else None

  def scoring_finished(self, step: int, cut: int | None):
    """Process 0 tells the others that dev scoring at `step` ended (cut by signal `cut`)."""
    processes.publish(f"{self.name}/scored/{step}", "done" if cut is None else str(cut))

  def wait_for_scoring(self, step: int):
    """The other processes wait for process 0's dev scoring at `step`, publishing their own
    stop signal meanwhile; raises EvaluationCut if it was cut short."""
    faults.fault_point(f"{self.name}.dev_wait", step)             # tests: a stop here
    while True:
      if self.stop.signum is not None:
        self._publish_stop(self.stop.signum)
      result = processes.read_published(f"{self.name}/scored/{step}")
      if result is not None:
        if result != "done":
          raise EvaluationCut(int(result))
        return
      time.sleep(WAIT_POLL_S)

