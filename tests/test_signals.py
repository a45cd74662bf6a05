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
  """The tiny ASR stage with two loader workers and dev WER at every evaluation."""
  lines = ["config.data.loader_workers = 2", "config.eval.score_dev = True"]
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


@pytest.mark.parametrize("fault, signum, stopped_after", [
    ("asr.update:3=SIGINT@group", signal.SIGINT, 4),        # at an update
    ("asr.update:5=SIGUSR1@group", signal.SIGUSR1, 6),
    ("asr.dev_loss:1=SIGUSR1@group", signal.SIGUSR1, 4),    # computing the dev loss
    ("asr.dev_decode:1=SIGTERM@group", signal.SIGTERM, 4),  # decoding the dev split
])
def test_a_stop_signal_to_the_process_group_saves_exits_and_resumes_bit_for_bit(
    signals_config, uninterrupted, tmp_path, fault, signum, stopped_after):
  workdir = str(tmp_path / "stopped")
  process, stderr = _in_own_group(signals_config, workdir, fault)
  assert process.returncode == 128 + signum == faults.exit_code(signum), stderr[-3000:]
  assert "Traceback" not in stderr, stderr[-3000:]
  assert (f"stopped by {signal.Signals(signum).name} in stage asr after update "
          f"{stopped_after}; a checkpoint was saved" in stderr)
  progress = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"), name="asr",
                                       progress_directory=os.path.join(workdir, "asr",
                                                                       "progress"))
  assert list(progress.progress.all_steps()) == [stopped_after]
  cut = stopped_after % EVERY == 0              # the evaluation of this update was cut short
  assert progress.steps() == ([EVERY] if stopped_after > EVERY else [])
  result = _run(signals_config, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"resumed stage asr from step {stopped_after}" in result.stderr
  assert ("the dev evaluation of update" in result.stderr) == cut
  assert os.path.exists(os.path.join(workdir, "asr", DONE))
  assert not os.path.exists(os.path.join(workdir, "asr", "progress"))   # removed when done
  assert_same_checkpoints(uninterrupted, workdir)


def test_progress_checkpoints_bound_what_a_sigkill_loses(prepared, uninterrupted, tmp_path):
  config_file = _config(tmp_path, prepared[1], **{"train.checkpoint_every_updates": 2})
  workdir = str(tmp_path / "killed")
  process, stderr = _in_own_group(config_file, workdir, "asr.update:7")
  assert process.returncode == -signal.SIGKILL, stderr[-3000:]
  assert "step 6: progress checkpoint saved" in stderr
  result = _run(config_file, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed stage asr from step 6" in result.stderr      # not 4: lost one update
  assert_same_checkpoints(uninterrupted, workdir)        # progress ones change nothing else
