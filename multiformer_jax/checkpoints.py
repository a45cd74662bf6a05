"""orbax checkpoints of a training stage: keep the last K and the best by dev loss, average.

A checkpoint holds the train state (parameters, optimizer state, accumulators, RNG key, step)
and a JSON `meta` item (stage, data-iterator position, dev loss, the model config). The
experiment config is saved once beside the stage directories (`{workdir}/config.json`).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from multiformer_jax import faults


class StageCheckpoints:
  """The checkpoints of one stage. `name` (the stage) names its fault-injection points."""

  def __init__(self, directory: str, keep_last: int = 5, name: str = ""):
    self.directory = os.path.abspath(directory)
    self.keep_last = keep_last
    self.name = name
    self.manager = self._open()

  def _open(self):
    # Orbax writes a step into a temporary directory and renames it when complete, so a run
    # killed while writing leaves no half-written step behind (only the temporary directory).
    return ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=None, create=True,
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
      if loss is not None:
        scored.append((loss, step))
    return min(scored)[1] if scored else self.latest()

  def save(self, step: int, state, meta: dict):
    """Saves, then keeps only the last `keep_last` checkpoints and the best one. The meta
    records the step saved before this one, so averaging can follow unbroken runs of saves."""
    if step in self.manager.all_steps():
      return
    meta = {**meta, "previous_step": self.latest()}
    try:
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)))
      faults.fault_point(f"{self.name}.checkpoint", step)   # tests: killed while writing
      self.manager.wait_until_finished()
    except OSError as error:
      raise OSError(error.errno, f"writing checkpoint {step} to {self.directory} failed "
                    f"({error.strerror or error}); the earlier checkpoints {self.steps()} are "
                    f"intact: free disk space or fix permissions, then rerun the same command "
                    f"to resume") from error
    steps = self.steps()
    keep = set(steps[-self.keep_last:]) | {self.best()}
    for old in steps:
      if old not in keep:
        self.manager.delete(old)

  def restore(self, step: int, target=None):
    """-> (state, meta). With `target` (an abstract or concrete state) the tree is typed."""
    state_args = ocp.args.StandardRestore(target) if target is not None else \
        ocp.args.StandardRestore()
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=state_args, meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["meta"])

  def restore_latest_valid(self, target, log) -> tuple[object, dict, int] | None:
    """(state, meta, step) of the newest checkpoint that restores; None if there is none.

    A checkpoint that fails to restore (truncated or corrupted files) is moved aside to
    `corrupt-{step}` (kept for inspection, never deleted) with a warning, and the previous one
    is tried."""
    for step in reversed(self.steps()):
      try:
        state, meta = self.restore(step, target)
        return state, meta, step
      except Exception as error:  # pylint: disable=broad-except
        aside = os.path.join(self.directory, f"corrupt-{step}")
        suffix = 1
        while os.path.exists(aside):
          aside, suffix = os.path.join(self.directory, f"corrupt-{step}.{suffix}"), suffix + 1
        log.warning("checkpoint %d in %s does not restore (%s: %s); moved to %s, trying the "
                    "previous one", step, self.directory, type(error).__name__,
                    str(error).splitlines()[0][:200] if str(error) else "", aside)
        os.replace(os.path.join(self.directory, str(step)), aside)
        self.manager.close()
        self.manager = self._open()
    return None

  def params(self, step: int):
    state, _ = self.restore(step)
    return state["params"] if isinstance(state, dict) else state.params

  def contiguous_steps(self, last: int) -> list[int]:
    """Up to `last` of the latest checkpoints with no save missing between them (following
    each checkpoint's previous_step back from the latest): a best checkpoint kept from long
    before the last `keep_last` is never averaged with them."""
    steps = self.steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    chain = [steps[-1]]
    while len(chain) < last:
      try:
        previous = self.meta(chain[-1]).get("previous_step", "unrecorded")
      except Exception:  # pylint: disable=broad-except
        break                                     # unreadable meta: stop the run here
      if previous == "unrecorded":                # saved without the link: the order is all
        previous = max((s for s in steps if s < chain[-1]), default=None)
      if previous is None or previous not in steps:
        break
      chain.append(previous)
    return sorted(chain)

  def averaged_params(self, last: int):
    """The mean of the parameters of the last `last` contiguous checkpoints (fairseq's
    averaging); fewer if fewer are kept."""
    steps = self.contiguous_steps(last)
    total = None
    for step in steps:
      params = jax.tree_util.tree_map(np.asarray, self.params(step))
      total = params if total is None else jax.tree_util.tree_map(np.add, total, params)
    return jax.tree_util.tree_map(lambda x: x / len(steps), total), steps

  def select_params(self, which: str, average_last: int = 10):
    """'latest' | 'best' | 'average' -> (params, description)."""
    if which == "average":
      params, steps = self.averaged_params(average_last)
      if len(steps) < average_last:
        return params, (f"average of steps {steps} (the {len(steps)} contiguous checkpoints "
                        f"kept of the {average_last} asked for)")
      return params, f"average of steps {steps}"
    step = self.best() if which == "best" else self.latest()
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    return self.params(step), f"{which} (step {step})"


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
    raise OSError(error.errno, f"cannot write to the workdir {workdir!r} ({reason}): pass a "
                  f"--workdir on a disk with free space that you can write to") from error


def save_config(workdir: str, config):
  check_writable(workdir)
  path = os.path.join(workdir, "config.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=1))
  os.replace(path + ".tmp", path)


def load_config(workdir: str):
  import ml_collections  # pylint: disable=import-outside-toplevel
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: evaluation reads the config saved by run.py "
                            f"beside the checkpoints; pass the run's --workdir")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))
