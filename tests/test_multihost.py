"""Two CPU processes training together (jax.distributed, one device each) cannot race: a kill
and a rerun resume both bit for bit (pmap), a corrupt latest checkpoint is moved aside once
and both resume from the same step (jit, two micro-batches an update), and data that is missing stops both with the reason
(none waits for ever)."""

import os
import shutil
import subprocess

import jax
import numpy as np

from multiformer_jax.runtime.train_log import DONE
from tests.test_reliability import _final_state, _free_port, _run, _write_config
from tests.test_train import devices_flag

UPDATES, EVERY = 8, 4


def _two_processes(config_file, workdir, fault=None):
  """Runs the config's training as two processes; -> ([exit codes], [stderr])."""
  port = _free_port()
  processes = [_run(config_file, workdir, fault,
                    extra=[f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
                           f"--process_id={i}"],
                    env_update={"XLA_FLAGS": devices_flag(1)},
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for i in range(2)]
  logs = [p.communicate(timeout=600)[1] for p in processes]
  return [p.returncode for p in processes], logs


def _assert_same_final_state(workdir_a, workdir_b):
  (state_a, meta_a), (state_b, meta_b) = _final_state(workdir_a), _final_state(workdir_b)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state_a, state_b)
  assert meta_a["iterator"] == meta_b["iterator"] and meta_a["dev_loss"] == meta_b["dev_loss"]


def _reference(prepared_dir, folder, parallel, update_freq=1):
  """(config file, workdir) of an uninterrupted two-process run of the tiny ASR stage."""
  config_file = _write_config(folder / f"tiny_{parallel}.py", prepared_dir, UPDATES, EVERY,
                              parallel, update_freq)
  workdir = str(folder / "reference")
  codes, logs = _two_processes(config_file, workdir)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert all(f"2 processes; parallel={parallel}" in log for log in logs)
  return config_file, workdir


def test_a_killed_two_process_run_resumes_bit_for_bit(prepared, tmp_path):
  config_file, reference = _reference(prepared[1], tmp_path, "pmap")
  workdir = str(tmp_path / "killed")
  codes, logs = _two_processes(config_file, workdir, fault="asr.update:6")
  assert codes == [-9, -9], logs[0][-2000:] + logs[1][-2000:]
  codes, logs = _two_processes(config_file, workdir)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert all(f"resumed stage asr from step {EVERY}" in log for log in logs)
  _assert_same_final_state(reference, workdir)


def test_a_corrupt_latest_checkpoint_is_moved_aside_once_and_both_resume_from_the_same_step(
    prepared, tmp_path):
  # Two micro-batches an update: jit's accumulator, sharded over the processes' devices.
  config_file, reference = _reference(prepared[1], tmp_path, "jit", update_freq=2)
  workdir = str(tmp_path / "corrupt")
  shutil.copytree(reference, workdir)
  os.remove(os.path.join(workdir, "asr", DONE))          # as if killed after saving 8
  latest = os.path.join(workdir, "asr", "checkpoints", str(UPDATES))
  for root, _, files in os.walk(os.path.join(latest, "state")):
    for name in files:
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 3)
  codes, logs = _two_processes(config_file, workdir)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert f"checkpoint {UPDATES} in" in logs[0] and "moved to" in logs[0]
  assert all(f"resumed stage asr from step {UPDATES - EVERY}" in log for log in logs)
  names = os.listdir(os.path.join(workdir, "asr", "checkpoints"))
  assert [n for n in names if n.startswith("corrupt-")] == [f"corrupt-{UPDATES}"]
  _assert_same_final_state(reference, workdir)


def test_missing_data_stops_both_processes_with_the_reason(tmp_path):
  config_file = _write_config(tmp_path / "missing.py", str(tmp_path / "not_prepared"), 2, 2)
  codes, logs = _two_processes(config_file, str(tmp_path / "run"))
  assert codes[0] != 0 and codes[1] != 0
  assert "is not prepared and data.root is empty" in logs[0]
  assert "process 0 failed preparing" in logs[1]
