"""orbax checkpoints of a training stage: keep the last K and the best by dev loss (with the
N around it when those are averaged), select or average.

A checkpoint holds the train state (parameters, optimizer state, accumulators, RNG key, step)
and a JSON `meta` item (stage, data-iterator position, dev loss, the model config). The
experiment config is saved once beside the stage directories (`{workdir}/config.json`).
"""

from __future__ import annotations

import math
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp

from multiformer_common.errors import InvalidValue, MissingInput, ResourceError
from multiformer_common import atomic

from multiformer_jax.runtime import checkpoint_files, faults, processes


SELECTIONS = ("latest", "best", "average", "around_best")


class CheckpointRefused(InvalidValue):
  """A checkpoint that is not damaged but does not restore: the run stops, naming why."""


class StageCheckpoints:
  """The checkpoints of one stage. `name` (the stage) names its fault-injection points.

  Evaluation checkpoints (`directory`) are the ones written with a dev evaluation: evaluation
  selects and averages them. Progress checkpoints (`progress_directory`, only the newest kept)
  are written on a period of their own and when a stop signal arrives, so that a run loses
  little when killed; they only serve to resume and are never selected or averaged."""

  def __init__(self, directory: str, keep_last: int = 5, name: str = "",
               keep_around_best: int = 1, progress_directory: str | None = None):
    self.directory = os.path.abspath(directory)
    self.keep_last = keep_last
    self.keep_around_best = keep_around_best     # the best and its neighbours: N in all
    self.name = name
    self.manager = self._open(self.directory)
    self.progress_directory = progress_directory and os.path.abspath(progress_directory)
    self.progress = self._open(self.progress_directory, 1) if progress_directory else None

  @staticmethod
  def _open(directory: str, max_to_keep: int | None = None):
    # Orbax writes a step into a temporary directory and renames it when complete, so a run
    # killed while writing leaves no half-written step behind (only the temporary directory).
    return ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=True))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def meta(self, step: int) -> dict:
    restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])

  def best(self) -> int | None:
    scored = []
    for step in self.steps():
      try:
        loss = self.meta(step).get("dev_loss")
      except Exception:  # pylint: disable=broad-except
        continue                                  # unreadable: never the best
      if loss is not None and math.isfinite(loss):     # a non-finite loss is never best
        scored.append((loss, step))
    return min(scored)[1] if scored else self.latest()

  def save(self, step: int, state, meta: dict):
    """Saves, then keeps only the last `keep_last` checkpoints and the `keep_around_best`
    around the best one. The meta records the step saved before this one, so averaging can
    follow unbroken runs of saves."""
    if step in self.manager.all_steps():
      return
    meta = {**meta, "previous_step": self.latest()}
    self._write(self.manager, step, state, meta, "checkpoint")
    steps = self.steps()
    keep = set(steps[-self.keep_last:]) | set(self.steps_around_best(self.keep_around_best))
    for old in steps:
      if old not in keep:
        self.manager.delete(old)

  def _write(self, manager, step: int, state, meta: dict, point: str):
    try:
      manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 meta=ocp.args.JsonSave(meta)))
      faults.fault_point(f"{self.name}.{point}", step)   # tests: killed while writing
      manager.wait_until_finished()
      processes.barrier(f"checkpoint {step} of {manager.directory} written")
      if jax.process_index() == 0:
        checkpoint_files.write_manifest(os.path.join(manager.directory, str(step)))
    except OSError as error:
      raise ResourceError(error.errno, f"writing checkpoint {step} to {manager.directory} failed "
                    f"({error.strerror or error}); the earlier checkpoints {self.steps()} are "
                    f"intact: free disk space or fix permissions, then rerun the same command "
                    f"to resume") from error

  def save_progress(self, step: int, state, meta: dict) -> bool:
    """A progress checkpoint of `step` (the previous one is deleted once it is written); ->
    False, writing nothing, where an evaluation checkpoint of that step exists."""
    if self.progress is None:
      raise InvalidValue(f"{self.directory}: opened without a progress directory")
    if step in self.manager.all_steps() or step in self.progress.all_steps():
      return False
    self._write(self.progress, step, state, meta, "progress")
    return True

  def remove_progress(self):
    """Deletes the progress checkpoints (the stage is finished: nothing resumes from them)."""
    if self.progress is not None and os.path.isdir(self.progress_directory):
      self.progress.close()
      shutil.rmtree(self.progress_directory, ignore_errors=True)

  def restore(self, step: int, target=None):
    """-> (state, meta). With `target` (an abstract or concrete state) the tree is typed."""
    state_args = ocp.args.StandardRestore(target) if target is not None else \
        ocp.args.StandardRestore()
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=state_args, meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["meta"])

  def _newest(self) -> tuple[int, bool]:
    """(step, whether it is the progress checkpoint) of the newest checkpoint of either kind;
    (-1, False) if there is none. An evaluation checkpoint wins a tie."""
    candidates = [(step, False) for step in self.steps()]
    if self.progress is not None:
      candidates += [(step, True) for step in self.progress.all_steps()]
    return max(candidates, key=lambda c: (c[0], not c[1]), default=(-1, False))

  def restore_latest_valid(self, target, log) -> tuple[object, dict, int] | None:
    """(state, meta, step) of the newest checkpoint, evaluation or progress, that restores;
    None if there is none.

    A checkpoint whose files are damaged (runtime/checkpoint_files.py: truncated, missing or
    changed since written) is moved aside to `corrupt-{step}` (kept for inspection, never
    deleted) with a warning, and the previous one is tried; one that fails for another reason
    (tensors that do not fit the config, memory, an I/O error) stops the run with
    CheckpointRefused, naming it. With several processes they agree: each tries the step
    process 0 names, a step is taken only if it restored on every process, process 0 judges a
    failure and alone moves a step aside (then every process reads the directory again)."""
    while True:
      step, progress = self._newest()
      chosen = processes.broadcast_int(2 * step + progress if step >= 0 else -1)
      if chosen < 0:
        return None
      step, progress = chosen // 2, bool(chosen % 2)
      manager = self.progress if progress else self.manager
      try:
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        state, meta = restored["state"], dict(restored["meta"])
        error = None
      except Exception as caught:  # pylint: disable=broad-except
        state = meta = None
        error = caught
      if processes.all_true(error is None):
        return state, meta, step
      step_dir = os.path.join(manager.directory, str(step))
      damaged, reason = checkpoint_files.diagnose(
          step_dir, target, error or RuntimeError("it restored on process 0 but not on every "
                                                  "process")) \
          if jax.process_index() == 0 else (False, "")
      if not processes.broadcast_int(damaged):
        raise CheckpointRefused(
            f"checkpoint {step} in {manager.directory} does not restore: "
            f"{reason or 'see the log of process 0'}. It is kept as it "
            f"is (nothing was moved or deleted); rerun once the cause is fixed")
      if jax.process_index() == 0:
        self._move_aside(manager.directory, step, reason, log)
      processes.barrier(f"checkpoint {step} of {manager.directory} moved aside")
      manager.close()
      if progress:
        self.progress = self._open(self.progress_directory, 1)
      else:
        self.manager = self._open(self.directory)

  @staticmethod
  def _move_aside(directory, step: int, reason: str, log):
    directory = str(directory)
    aside = os.path.join(directory, f"corrupt-{step}")
    suffix = 1
    while os.path.exists(aside):
      aside, suffix = os.path.join(directory, f"corrupt-{step}.{suffix}"), suffix + 1
    log.warning("checkpoint %d in %s is damaged (%s); moved to %s, trying the previous one",
                step, directory, reason, aside)
    os.replace(os.path.join(directory, str(step)), aside)

  def params(self, step: int):
    state, _ = self.restore(step)
    return state["params"] if isinstance(state, dict) else state.params

  def _previous(self, step: int, steps: list[int]) -> int | None:
    """The checkpoint saved before `step` if it is still kept, else None."""
    try:
      previous = self.meta(step).get("previous_step", "unrecorded")
    except Exception:  # pylint: disable=broad-except
      return None                                 # unreadable meta: no link
    if previous == "unrecorded":                  # saved without the link: the order is all
      previous = max((s for s in steps if s < step), default=None)
    return previous if previous in steps else None

  def steps_around_best(self, count: int) -> list[int]:
    """Up to `count` contiguous checkpoints centred on the best one (the thesis's "7 around
    the best": 3 saved before it, the best, 3 after); where fewer exist on one side (training
    ended soon after the best, or started just before it), more are taken from the other."""
    steps = self.steps()
    best = self.best()
    if best is None:
      return []
    before, after = [], []
    while len(before) < count - 1:
      previous = self._previous(before[-1] if before else best, steps)
      if previous is None:
        break
      before.append(previous)
    current = best
    while len(after) < count - 1:
      following = [s for s in steps if s > current]
      if not following or self._previous(following[0], steps) != current:
        break
      current = following[0]
      after.append(current)
    before = before[:max((count - 1) // 2, count - 1 - len(after))]
    after = after[:count - 1 - len(before)]
    return sorted(before + [best] + after)

  def contiguous_steps(self, last: int) -> list[int]:
    """Up to `last` of the latest checkpoints with no save missing between them (following
    each checkpoint's previous_step back from the latest): a best checkpoint kept from long
    before the last `keep_last` is never averaged with them."""
    steps = self.steps()
    if not steps:
      raise MissingInput(f"no checkpoint in {self.directory}")
    chain = [steps[-1]]
    while len(chain) < last:
      previous = self._previous(chain[-1], steps)
      if previous is None:
        break
      chain.append(previous)
    return sorted(chain)

  def averaged_params(self, last: int, around_best: bool = False):
    """The mean of the parameters of the last `last` contiguous checkpoints (fairseq's
    averaging), or with `around_best` of the `last` around the best; fewer if fewer are
    kept."""
    steps = self.steps_around_best(last) if around_best else self.contiguous_steps(last)
    if not steps:
      raise MissingInput(f"no checkpoint in {self.directory}")
    return average_params(self.params(step) for step in reversed(steps)), steps

  def select_params(self, which: str, average_last: int = 10):
    """'latest' | 'best' | 'average' (of the last `average_last`) | 'around_best' (the average
    of the `average_last` around the best) -> (params, description)."""
    if which not in SELECTIONS:
      raise InvalidValue(f"checkpoint selection {which!r}; valid: {', '.join(SELECTIONS)}")
    if which in ("average", "around_best"):
      params, steps = self.averaged_params(average_last, which == "around_best")
      what = "average of steps" if which == "average" else \
          f"average around the best (step {self.best()}) of steps"
      if len(steps) < average_last:
        return params, (f"{what} {steps} (the {len(steps)} contiguous checkpoints kept of the "
                        f"{average_last} asked for)")
      return params, f"{what} {steps}"
    step = self.best() if which == "best" else self.latest()
    if step is None:
      raise MissingInput(f"no checkpoint in {self.directory}")
    return self.params(step), f"{which} (step {step})"


def average_params(newest_first):
  """The mean of parameter trees (an iterable, read one at a time) as fairseq's
  scripts/average_checkpoints.py computes it: the sum in the order given (newest first, as its
  last_n_checkpoints lists them), then one division, so that the result is fairseq's bit for
  bit."""
  total, count = None, 0
  for params in newest_first:
    params = jax.tree_util.tree_map(np.asarray, params)
    total = params if total is None else jax.tree_util.tree_map(np.add, total, params)
    count += 1
  return jax.tree_util.tree_map(lambda x: x / count, total)


def check_writable(workdir: str):
  """Fails early, naming the directory, if the run could not write its results there."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, ".write_probe")
    with open(probe, "w", encoding="utf-8") as f:
      f.write("x" * 4096)
      f.flush()
      os.fsync(f.fileno())
    os.remove(probe)
  except OSError as error:
    reason = error.strerror or str(error)
    raise ResourceError(error.errno, f"cannot write to the workdir {workdir!r} ({reason}): pass a "
                  f"--workdir on a disk with free space that you can write to") from error


def save_config(workdir: str, config):
  check_writable(workdir)
  atomic.write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=1))
