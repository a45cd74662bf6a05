"""Progress is never discarded or mixed: a resumed run's config is held to the saved one, a
checkpoint that does not fit it is kept and named (only damaged ones move aside), one writer per
workdir (a second run refused, a dead one's lock taken over), the prepared corpus a run
trained on is the one it resumes and is read with, and a non-finite dev loss is never best."""

import json
import logging
import math
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from data_prep import prepare
from multiformer_common import locks
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import run_record
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.training import train
from multiformer_jax import schema
from tests.test_reliability import _run, _write_config
from tests.test_train import tiny_config


def _asr(prepared_dir, **stage):
  config = tiny_config(prepared_dir, **{"max_updates": 2, "eval_every": 2, **stage})
  config.train.stages = ("asr",)
  return config


class _Lines(logging.Handler):
  """The messages logged while it is attached (the project's logger does not propagate)."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


def test_a_resumed_run_refuses_config_changes_to_the_model_and_logs_safe_ones(prepared,
                                                                             tmp_path):
  workdir = str(tmp_path)
  train.train_and_evaluate(_asr(prepared[1]), workdir)
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    saved = f.read()
  changed = _asr(prepared[1])
  changed.model.ffn_dim, changed.data.max_frames = 24, 2000
  with pytest.raises(ValueError, match=r"settings that change the model or the data order: "
                                       r"data.max_frames: 3000 -> 2000; model.ffn_dim: 32 -> "
                                       r"24\. .*another --workdir.*--accept_config_changes"):
    train.train_and_evaluate(changed, workdir)
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    assert f.read() == saved                          # nothing was written
  safe = _asr(prepared[1], max_updates=3)
  safe.train.log_every, safe.eval.beam = 1, 3
  seen = _Lines()
  logging.getLogger("multiformer_jax").addHandler(seen)
  try:
    train.train_and_evaluate(safe, workdir)
  finally:
    logging.getLogger("multiformer_jax").removeHandler(seen)
  assert "config change on resume: asr.max_updates: 2 -> 3" in seen.lines
  train.train_and_evaluate(changed, workdir, accept_config_changes=True)
  with open(tmp_path / "config_changes.jsonl", encoding="utf-8") as f:
    records = [json.loads(line)["changes"] for line in f]
  assert records[0]["train.log_every"] == {"saved": 2, "new": 1, "accepted": False}
  assert records[1]["model.ffn_dim"] == {"saved": 32, "new": 24, "accepted": True}


def test_a_checkpoint_that_does_not_fit_the_config_is_kept_and_named(prepared, tmp_path):
  workdir = str(tmp_path)
  train.train_and_evaluate(_asr(prepared[1], max_updates=4), workdir)
  os.remove(tmp_path / "asr" / DONE)                          # as if killed after saving 4
  changed = _asr(prepared[1], max_updates=4)
  changed.model.ffn_dim = 24
  with pytest.raises(ckpt_lib.CheckpointRefused,
                     match=r"checkpoint 4 in .* does not restore: its tensors do not fit the "
                           r"model this config builds \(.*encoder/layers_0/ffn/fc1/kernel: "
                           r"saved \(16, 32\), config \(16, 24\).*kept as it is"):
    train.train_and_evaluate(changed, workdir, accept_config_changes=True)
  names = os.listdir(tmp_path / "asr" / "checkpoints")
  assert "4" in names and not any(n.startswith("corrupt") for n in names)


def test_a_second_run_into_a_busy_workdir_is_refused_and_a_dead_ones_lock_taken_over(
    prepared, tmp_path):
  config_file = _write_config(tmp_path / "long.py", prepared[1], 300, 300)
  workdir = str(tmp_path / "run")
  first = _run(config_file, workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  for line in first.stderr:
    if "training from update" in line:
      break
  second = _run(config_file, workdir)
  assert second.returncode == 2, second.stderr[-3000:]
  assert f"{workdir} is in use by training run on host" in second.stderr
  assert f"pid {first.pid}" in second.stderr and "One training run writes there" in second.stderr
  first.send_signal(signal.SIGKILL)
  first.wait(timeout=60)
  third = _run(config_file, workdir, extra=["--config.asr.max_updates=2"])
  assert third.returncode == 0, third.stderr[-3000:]
  assert f"taking over the lock of training run on host" in third.stderr
  assert "its process is gone" in third.stderr


def test_a_lock_names_a_holder_on_another_host_until_its_heartbeat_stops(tmp_path, caplog):
  holder = {"host": "gpu-elsewhere", "pid": 4242, "started": "1", "slurm_job": "77",
            "slurm_restart": 0, "what": "training run", "since": time.time()}
  path = tmp_path / locks.LOCK_FILE
  path.write_text(json.dumps(holder))
  lock = locks.DirectoryLock(str(tmp_path), "training run")
  with pytest.raises(locks.DirectoryBusy, match=r"in use by training run on host "
                                                r"gpu-elsewhere \(pid 4242, SLURM job 77"):
    lock.acquire()
  stale = time.time() - locks.STALE_S - 5
  os.utime(path, (stale, stale))
  with caplog.at_level(logging.WARNING):
    lock.acquire(log=logging.getLogger("test_locks"))
  assert "its heartbeat stopped" in caplog.text
  assert json.loads(path.read_text())["pid"] == os.getpid()
  lock.release()
  assert path.read_text() == ""                       # free: left empty, not removed


def test_a_requeued_slurm_job_takes_over_its_earlier_incarnations_lock(tmp_path, monkeypatch):
  path = tmp_path / locks.LOCK_FILE
  path.write_text(json.dumps({"host": "gpu-elsewhere", "pid": 1, "slurm_job": "77",
                              "slurm_restart": 0, "what": "training run",
                              "since": time.time()}))
  monkeypatch.setenv("SLURM_JOB_ID", "77")
  monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
  with locks.DirectoryLock(str(tmp_path), "training run").acquire():
    assert json.loads(path.read_text())["slurm_restart"] == 1


def test_a_run_refuses_a_prepared_corpus_that_is_not_the_one_it_trained_on(prepared, tmp_path):
  root, prepared_dir = prepared
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(_asr(prepared_dir, max_updates=4), workdir)
  os.remove(os.path.join(workdir, "asr", DONE))
  again = str(tmp_path / "prepared_again")            # the same corpus, another vocabulary
  prepare.prepare("mustc", root, ["en-de"], again, ["train", "dev"], asr_vocab=38, st_vocab=40,
                  workers=1, progress=False)
  moved = _asr(again, max_updates=4)
  with pytest.raises(ValueError, match=r"cannot resume training: .*prepared_again is not the "
                                       r"prepared corpus the run in .* trained on .*"
                                       r"spm_asr.model \(sha256 \w+ when the run trained, \w+ "
                                       r"now\)"):
    train.train_and_evaluate(moved, workdir)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    saved = json.load(f)
  saved["data"]["prepared_dir"] = again               # evaluate, translate, analyze read it
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(saved, f)
  with pytest.raises(ValueError, match="cannot read the run: .*spm_asr.model"):
    schema.load_config(workdir)


def test_a_non_finite_dev_loss_is_never_the_best(tmp_path):
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path), keep_last=5)
  state = {"w": np.zeros(3, np.float32)}
  for step, loss in ((1, 3.0), (2, math.nan), (3, -math.inf), (4, 5.0)):
    checkpoints.save(step, state, {"dev_loss": loss})
  assert checkpoints.best() == 1


def test_settings_of_a_stage_that_has_not_trained_yet_may_change():
  saved = {"model": {"ffn_dim": 32}, "asr": {"max_updates": 2, "lr": 1e-3},
           "st": {"max_updates": 2, "lr": 2e-3}, "train": {"stages": ["asr"]}}
  new = {"model": {"ffn_dim": 32}, "asr": {"max_updates": 2, "lr": 5e-4},
         "st": {"max_updates": 2, "lr": 1e-3}, "train": {"stages": ["asr", "st"]}}
  changes = run_record.config_changes(saved, new)
  assert set(changes) == {"asr.lr", "st.lr", "train.stages"}
  safe = {key for key in changes if run_record.is_safe(key, new, {"asr"})}
  assert safe == {"st.lr", "train.stages"}               # the trained ASR stage's lr is not
