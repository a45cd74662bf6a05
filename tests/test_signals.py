"""Stop signals as a cluster sends them, for real: SIGTERM, SIGINT and SIGUSR1 to the run's whole
process group (the loader workers with it) at an update, while the dev loss is computed and
while the dev split is decoded; a SIGKILL after a progress checkpoint. Each run exits with
128 + the signal's number, without a traceback, leaves no worker behind, and its rerun ends
with an uninterrupted run's checkpoints, bit for bit. (Two processes with only one
signalled: tests/test_multihost.py.)"""

import os
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import faults
from multiformer_jax.runtime.train_log import DONE
from tests.test_reliability import _run, _write_config, uninterrupted_run

UPDATES, EVERY = 8, 4


def _config(folder, prepared_dir, **extra):
  """The tiny ASR stage with two loader workers, dev WER at every evaluation and a progress
  checkpoint every 2 updates."""
  lines = ["config.data.loader_workers = 2", "config.eval.score_dev = True",
           "config.train.checkpoint_every_updates = 2"]
  lines += [f"config.{key} = {value!r}" for key, value in extra.items()]
  return _write_config(folder / "signals.py", prepared_dir, UPDATES, EVERY, extra_lines=lines)


@pytest.fixture(scope="module")
def signals_config(prepared, tmp_path_factory):
  return _config(tmp_path_factory.mktemp("signals"), prepared[1])


@pytest.fixture(scope="module")
def uninterrupted(signals_config, tmp_path_factory):
  return uninterrupted_run(signals_config, str(tmp_path_factory.mktemp("uninterrupted")))


def _in_own_group(config_file, workdir, fault=None):
  """run.py as the leader of a process group of its own (a scheduler's job step) ->
  (the finished process, its stderr); asserts that nothing of the group outlives it."""
  process = _run(config_file, workdir, fault, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, start_new_session=True)
  _, stderr = process.communicate(timeout=600)
  deadline = time.monotonic() + 60        # the loader workers are gone too (once reaped)
  while time.monotonic() < deadline:
    try:
      os.killpg(process.pid, 0)
    except ProcessLookupError:
      return process, stderr
    time.sleep(0.2)
  raise AssertionError(f"processes of the run's group outlive it: {stderr[-2000:]}")


def assert_same_checkpoints(workdir_a, workdir_b, stage="asr"):
  """Both runs' evaluation checkpoints: the same steps, states bit for bit, the same meta
  (but the dev decoding time)."""
  a = ckpt_lib.StageCheckpoints(os.path.join(workdir_a, stage, "checkpoints"))
  b = ckpt_lib.StageCheckpoints(os.path.join(workdir_b, stage, "checkpoints"))
  assert a.steps() == b.steps()
  for step in a.steps():
    (state_a, meta_a), (state_b, meta_b) = a.restore(step), b.restore(step)
    jax.tree_util.tree_map(np.testing.assert_array_equal, state_a, state_b)
    meta_a.pop("dev_decode_s", None), meta_b.pop("dev_decode_s", None)
    assert meta_a == meta_b


def _progress_steps(workdir) -> tuple[list[int], list[int]]:
  """(evaluation checkpoints, progress checkpoints) of the run's ASR stage."""
  checkpoints = ckpt_lib.StageCheckpoints(
      os.path.join(workdir, "asr", "checkpoints"),
      progress_directory=os.path.join(workdir, "asr", "progress"))
  return checkpoints.steps(), sorted(checkpoints.progress.all_steps())


def test_stop_signals_and_a_sigkill_to_the_process_group_then_the_reruns_end_bit_for_bit(
    signals_config, uninterrupted, tmp_path):
  """One run stopped four times, each rerun resuming where the last stopped: SIGINT at an
  update, SIGUSR1 while the dev loss is computed, SIGKILL after a progress checkpoint (every 2
  updates here), SIGTERM while the dev split is decoded; then it runs to its end."""
  workdir = str(tmp_path / "stopped")
  stops = [  # fault, exit status, the update stopped after, (evaluation, progress) checkpoints
      ("asr.update:1=SIGINT@group", 128 + signal.SIGINT, 2, ([], [2])),
      ("asr.dev_loss:1=SIGUSR1@group", 128 + signal.SIGUSR1, 4, ([], [4])),   # cut: due
      ("asr.update:7", -signal.SIGKILL, None, ([4], [6])),                   # loses update 7
      ("asr.dev_decode:1=SIGTERM@group", 128 + signal.SIGTERM, 8, ([4], [8])),
  ]
  resumed = None
  for fault, status, stopped_after, kept in stops:
    process, stderr = _in_own_group(signals_config, workdir, fault)
    assert process.returncode == status, (fault, stderr[-3000:])
    if resumed is not None:
      assert f"resumed stage asr from step {resumed}" in stderr, stderr[-3000:]
    if stopped_after is not None:
      assert status == faults.exit_code(status - 128) and "Traceback" not in stderr, stderr
      name = signal.Signals(status - 128).name
      assert (f"stopped by {name} in stage asr after update {stopped_after}; a checkpoint "
              f"was saved" in stderr), stderr[-3000:]
    assert _progress_steps(workdir) == kept, fault
    resumed = kept[1][-1]
  result = _run(signals_config, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed stage asr from step 8" in result.stderr
  assert "the dev evaluation of update 8, cut short by the stop, first" in result.stderr
  assert os.path.exists(os.path.join(workdir, "asr", DONE))
  assert not os.path.exists(os.path.join(workdir, "asr", "progress"))   # removed when done
  assert_same_checkpoints(uninterrupted, workdir)
