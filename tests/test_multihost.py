"""Two CPU processes training together (jax.distributed, one device each) cannot race: a kill
and a rerun resume both bit for bit (pmap), a corrupt latest checkpoint is moved aside once
and both resume from the same step (jit, two micro-batches an update), data that is missing
stops both with the reason (none waits for ever), and a process that finished exits cleanly
(its peer watch ended before the interpreter finalizes)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from multiformer_jax.runtime import peers
from multiformer_jax.runtime.train_log import DONE
from tests.test_reliability import (REPO, _communicate, _final_state, _free_port, _run,
                                    _write_config)
from tests.test_signals import assert_same_checkpoints
from tests.test_train import devices_flag

UPDATES, EVERY = 8, 4


def _two_processes(config_file, workdir, fault=None, faults=(None, None), extra=()):
  """Runs the config's training as two processes (`fault` for both, or `faults` one each);
  -> ([exit codes], [stderr])."""
  port = _free_port()
  processes = [_run(config_file, workdir, fault or faults[i],
                    extra=[f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
                           f"--process_id={i}", *extra],
                    env_update={"XLA_FLAGS": devices_flag(1)},
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for i in range(2)]
  logs = _communicate(processes)
  return [p.returncode for p in processes], logs


def _assert_same_final_state(workdir_a, workdir_b):
  (state_a, meta_a), (state_b, meta_b) = _final_state(workdir_a), _final_state(workdir_b)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state_a, state_b)
  assert meta_a["iterator"] == meta_b["iterator"] and meta_a["dev_loss"] == meta_b["dev_loss"]


def _reference(prepared_dir, folder, parallel, update_freq=1, extra_lines=()):
  """(config file, workdir) of an uninterrupted two-process run of the tiny ASR stage."""
  config_file = _write_config(folder / f"tiny_{parallel}.py", prepared_dir, UPDATES, EVERY,
                              parallel, update_freq, extra_lines)
  workdir = str(folder / "reference")
  codes, logs = _two_processes(config_file, workdir)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert all(f"2 processes; parallel={parallel}" in log for log in logs)
  return config_file, workdir


@pytest.fixture(scope="module")
def pmap_reference(prepared, tmp_path_factory):
  """Two processes under pmap, the dev split decoded (dev WER) by process 0 at every
  evaluation in two batches."""
  return _reference(prepared[1], tmp_path_factory.mktemp("pmap"), "pmap", extra_lines=[
      "config.eval.score_dev = True", "config.data.max_frames = 1500"])


def test_a_killed_two_process_run_resumes_bit_for_bit(pmap_reference, tmp_path):
  config_file, reference = pmap_reference
  workdir = str(tmp_path / "killed")
  codes, logs = _two_processes(config_file, workdir, fault="asr.update:6")
  assert codes == [-9, -9], logs[0][-2000:] + logs[1][-2000:]
  codes, logs = _two_processes(config_file, workdir)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert all(f"resumed stage asr from step {EVERY}" in log for log in logs)
  _assert_same_final_state(reference, workdir)


def test_a_signal_to_one_of_two_processes_stops_both_after_the_same_update(pmap_reference,
                                                                          tmp_path):
  config_file, reference = pmap_reference
  workdir = str(tmp_path / "signalled")
  # SIGUSR1 to process 1 alone after update 3: both stop after update 4 (its evaluation is
  # left for the rerun), exit 138, and save the same progress checkpoint.
  codes, logs = _two_processes(config_file, workdir,
                               faults=(None, "asr.update:3=SIGUSR1@process"))
  assert codes == [138, 138], logs[0][-3000:] + logs[1][-3000:]
  assert all("stopped by SIGUSR1 in stage asr after update 4" in log for log in logs)
  assert not any("Traceback" in log for log in logs)
  assert os.listdir(os.path.join(workdir, "asr", "progress")) == ["4"]
  # The rerun starts with that evaluation; SIGTERM reaches process 1 alone while process 0
  # decodes the dev split: both stop at the same update (the decoding cut short or not).
  codes, logs = _two_processes(config_file, workdir, faults=(None, "asr.dev_wait:4=SIGTERM@process"))
  assert codes == [143, 143], logs[0][-3000:] + logs[1][-3000:]
  stopped = [re.search(r"stopped by SIGTERM in stage asr after update (\d+)", log).group(1)
             for log in logs]
  assert stopped[0] == stopped[1], stopped
  codes, logs = _two_processes(config_file, workdir)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  _assert_same_final_state(reference, workdir)
  assert_same_checkpoints(reference, workdir)


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


def test_when_one_of_two_processes_dies_the_other_stops_naming_it(prepared, tmp_path):
  config_file = _write_config(tmp_path / "long.py", prepared[1], 200, 100)
  for killed in (1, 0):                  # a worker; the coordinator (process 0) itself
    faults = [None, None]
    faults[killed] = "asr.update:3"
    started = time.monotonic()
    codes, logs = _two_processes(config_file, str(tmp_path / f"run{killed}"), faults=faults,
                                 extra=["--peer_timeout_s=15"])
    survivor = 1 - killed
    assert codes[killed] == -signal.SIGKILL, logs[killed][-3000:]
    assert time.monotonic() - started < 600                  # generous: it does not hang
    if killed == 1:       # named by the watch: it gave no sign of life for --peer_timeout_s
      assert codes[survivor] == peers.PEER_LOST_EXIT_CODE, logs[survivor][-3000:]
      assert re.search(r"process 1 \(host \S+, pid \d+\) has given no sign of life",
                       logs[survivor]), logs[survivor][-3000:]
    else:                 # JAX's client ends it at once: process 0 ran the coordination service
      assert codes[survivor] == -signal.SIGABRT, logs[survivor][-3000:]
      assert re.search(r"process 0 \(host \S+, pid \d+\) runs this run's coordination "
                       r"service", logs[survivor])
      assert "the JAX distributed service detected fatal errors" in logs[survivor]


EXIT_ORDER = textwrap.dedent("""
    import atexit, sys
    sys.path.insert(0, {repo!r})
    watches = []

    def at_finalization():   # registered first, so it runs last
      from jax._src import distributed
      print("jax shut down:", distributed.global_state.client is None,
            "watch thread alive:", watches[0]._thread.is_alive(), flush=True)

    atexit.register(at_finalization)
    from multiformer_jax.runtime import process_setup
    process_setup.set_up()
    import jax
    jax.distributed.initialize("127.0.0.1:{port}", 1, 0)
    from multiformer_jax.runtime import peers
    watches.append(peers.PeerWatch(60).start())
    watches[0].leave("finished", 0)
""")


def test_a_finished_process_ends_its_peer_watch_before_the_interpreter_finalizes():
  """A daemon thread that returns from a call into JAX's C++ client while the interpreter
  finalizes is ended by pthread_exit, whose unwinding through the C++ frame aborts the process
  (a finished two-process run once exited with SIGABRT so): by then the watch has ended, and
  JAX's own exit handler has shut its client down while the watch still ran."""
  env = {**os.environ, "MULTIFORMER_TCMALLOC": "0", "MULTIFORMER_HUGE_PAGES": "0"}
  result = subprocess.run(
      [sys.executable, "-c", EXIT_ORDER.format(repo=REPO, port=_free_port())], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "jax shut down: True watch thread alive: False" in result.stdout, result.stdout
