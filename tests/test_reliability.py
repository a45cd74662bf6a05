"""Reliability, by doing the damage for real: SIGKILL at several points (one of them while a
checkpoint is being written), SIGTERM, a corrupted latest checkpoint, non-finite updates, and
run-to-run determinism. Every interrupted run must end with the parameters of an uninterrupted
run, bit for bit (CPU)."""

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import faults
from multiformer_jax.training import train
from multiformer_jax import experiment
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax import model as model_lib
from multiformer_jax.training import optimizer
from multiformer_jax.training import steps
from multiformer_jax.training import transfer
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.training.parallel import DataParallel
from tests.test_train import devices_flag, losses, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_UPDATES, EVAL_EVERY = 8, 4


def _write_config(path, prepared_dir, max_updates, eval_every, parallel="pmap", update_freq=1,
                  extra_lines=()):
  """A config file for run.py: the tiny ASR stage (`update_freq` micro-batches an update),
  then `extra_lines` (statements on `config`)."""
  cache = os.path.join(os.path.expanduser("~"), ".cache", "multiformer_jax", "jax-tests")
  extra = "".join(f"\n  {line}" for line in extra_lines)
  path.write_text(textwrap.dedent(f"""
      from tests.test_train import tiny_config

      def get_config():
        config = tiny_config({prepared_dir!r}, max_updates={max_updates},
                             eval_every={eval_every}, keep_last=2)
        config.train.stages = ("asr",)
        config.train.log_every = 1
        config.train.parallel = {parallel!r}
        config.asr.update_freq = {update_freq}
        config.train.compilation_cache = {cache!r}""") + extra + "\n  return config\n")
  return str(path)


@pytest.fixture(scope="module")
def config_file(prepared, tmp_path_factory):
  """The tiny ASR stage, 8 updates, a checkpoint every 4."""
  _, prepared_dir = prepared
  return _write_config(tmp_path_factory.mktemp("configs") / "tiny_asr.py", prepared_dir,
                       MAX_UPDATES, EVAL_EVERY)


def _run(config_file, workdir, fault=None, extra=(), env_update=None, **popen):
  env = dict(os.environ)
  env.pop(faults.FAULT_ENV, None)
  env.update(env_update or {})
  if fault:
    env[faults.FAULT_ENV] = fault
  command = [sys.executable, "run.py", f"--config={config_file}", f"--workdir={workdir}",
             *extra]
  if popen:
    return subprocess.Popen(command, cwd=REPO, env=env, text=True, **popen)
  return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600, check=False)


def _communicate(processes, timeout=600):
  """Waits for processes started by `_run(..., stderr=PIPE)` -> their stderr; kills them all
  if one is still running at the timeout (a hung pair must not outlive its test)."""
  try:
    return [p.communicate(timeout=timeout)[1] for p in processes]
  finally:
    for process in processes:
      process.kill()


def _final_state(workdir, step=MAX_UPDATES):
  return ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints")).restore(step)


def _assert_same_state(workdir_a, workdir_b):
  state_a, meta_a = _final_state(workdir_a)
  state_b, meta_b = _final_state(workdir_b)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state_a, state_b)
  assert meta_a["iterator"] == meta_b["iterator"]
  assert meta_a["dev_loss"] == meta_b["dev_loss"]


def uninterrupted_run(config_file, workdir: str) -> str:
  """run.py with `config_file` into `workdir`, to its end; -> the workdir."""
  result = _run(config_file, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir


@pytest.fixture(scope="module")
def reference(config_file, tmp_path_factory):
  """An uninterrupted run of the same command."""
  return uninterrupted_run(config_file, str(tmp_path_factory.mktemp("reference")))


def test_sigkill_at_several_points_then_rerun_gives_the_same_parameters(config_file,
                                                                         reference, tmp_path):
  workdir = str(tmp_path / "killed")
  checkpoints = os.path.join(workdir, "asr", "checkpoints")
  # Killed after update 3 (no checkpoint yet), while checkpoint 4 is being written (the save
  # was started asynchronously and not finished), and after update 6 (checkpoint 4 exists).
  for fault in ("asr.update:3", "asr.checkpoint:4", "asr.update:6"):
    result = _run(config_file, workdir, fault)
    assert result.returncode == -signal.SIGKILL, (fault, result.stderr[-3000:])
    assert not os.path.exists(os.path.join(workdir, "asr", DONE))
    if fault == "asr.checkpoint:4":
      # Really killed mid-write: only orbax's temporary directory, no (half) step 4.
      assert ckpt_lib.StageCheckpoints(checkpoints).steps() == []
      assert any(name.startswith("4.") and "tmp" in name for name in os.listdir(checkpoints))
  assert ckpt_lib.StageCheckpoints(checkpoints).steps() == [4]
  result = _run(config_file, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed stage asr from step 4" in result.stderr
  _assert_same_state(reference, workdir)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly_then_resumes(config_file, reference,
                                                                   tmp_path):
  workdir = str(tmp_path / "terminated")
  process = _run(config_file, workdir, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
  seen = []
  for line in process.stderr:            # the handler is installed before the first update
    seen.append(line)
    if "programs before the first update" in line:
      process.send_signal(signal.SIGTERM)
      break
  rest = process.stderr.read()
  assert process.wait(timeout=600) == faults.PREEMPTED_EXIT_CODE, "".join(seen) + rest
  assert "Traceback" not in rest and "stopped by SIGTERM" in rest
  # A progress checkpoint, outside the evaluation checkpoints (never evaluated or averaged).
  checkpoints = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"),
                                          progress_directory=os.path.join(workdir, "asr",
                                                                          "progress"))
  steps = list(checkpoints.progress.all_steps())
  assert len(steps) == 1 and steps[0] < MAX_UPDATES
  assert checkpoints.steps() == [s for s in (EVAL_EVERY,) if s < steps[0]]
  meta = checkpoints.progress.restore(steps[0], args=ckpt_lib.ocp.args.Composite(
      meta=ckpt_lib.ocp.args.JsonRestore()))["meta"]
  assert meta["saved_on"] == "SIGTERM" and "dev_loss" not in meta
  result = _run(config_file, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"resumed stage asr from step {steps[0]}" in result.stderr
  _assert_same_state(reference, workdir)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(config_file, reference,
                                                                  tmp_path):
  workdir = str(tmp_path / "corrupt")
  shutil.copytree(reference, workdir)
  os.remove(os.path.join(workdir, "asr", DONE))          # as if killed after saving 8
  latest = os.path.join(workdir, "asr", "checkpoints", str(MAX_UPDATES))
  for root, _, files in os.walk(os.path.join(latest, "state")):
    for name in files:                                          # truncate every state file
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(max(os.path.getsize(f.name) // 3, 0))
  result = _run(config_file, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"checkpoint {MAX_UPDATES}" in result.stderr and "is damaged (state/" in result.stderr
  assert f"resumed stage asr from step {MAX_UPDATES - EVAL_EVERY}" in result.stderr
  aside = os.path.join(workdir, "asr", "checkpoints", f"corrupt-{MAX_UPDATES}")
  assert os.path.isdir(aside)                       # kept for inspection, not deleted
  _assert_same_state(reference, workdir)


def test_fault_spec_errors_name_the_bad_item(monkeypatch):
  monkeypatch.setenv(faults.FAULT_ENV, "asr.update:x")
  with pytest.raises(ValueError, match="asr.update:x.*asr.update:3"):
    faults.fault_point("asr.update", 1)


def _tiny_step(prepared_dir):
  config = tiny_config(prepared_dir)
  data = ip.SplitData(experiment.pipeline_config(config, "asr"), "train")
  batch = ip.Batcher(data, True).assemble(0, np.arange(2), 0)
  model = model_lib.S2TModel(experiment.model_config_for(config, data.vocab.size))
  tx, schedule = optimizer.make_optimizer(config.train, config.asr)
  state = steps.create_state(model, tx, jax.random.PRNGKey(0))
  step, _ = steps.make_steps(model, tx, schedule, DataParallel("jit"), 0.1)
  return state, batch, step


def test_a_non_finite_update_leaves_parameters_and_optimizer_state_unchanged(prepared):
  _, prepared_dir = prepared
  state, batch, step = _tiny_step(prepared_dir)
  state, _ = step(state, batch, True, True)                 # one good update: Adam moments non-zero
  before = jax.device_get(state)
  bad = dict(batch, features=np.where(np.arange(batch["features"].shape[1])[None, :, None] == 3,
                                      np.nan, batch["features"]).astype(np.float32))
  state, metrics = step(state, jax.tree_util.tree_map(jnp.asarray, bad), True, True)
  after = jax.device_get(state)
  assert not bool(metrics["finite"]) and int(after.nonfinite) == 1
  assert int(after.step) == int(before.step) + 1      # counted as an update (skipped)
  jax.tree_util.tree_map(np.testing.assert_array_equal, after.params, before.params)
  jax.tree_util.tree_map(np.testing.assert_array_equal, after.opt_state, before.opt_state)
  state, metrics = step(state, jax.tree_util.tree_map(jnp.asarray, batch), True, True)
  assert bool(metrics["finite"]) and int(jax.device_get(state).nonfinite) == 0


def test_consecutive_non_finite_updates_stop_the_run_with_advice(prepared, tmp_path,
                                                                 monkeypatch):
  _, prepared_dir = prepared
  assemble_into = ip.Batcher.assemble_into

  def poisoned(self, batch, bucket_id, indices, epoch):
    assemble_into(self, batch, bucket_id, indices, epoch)
    if self.train:
      batch["features"][:, 0, 0] = np.inf
  monkeypatch.setattr(ip.Batcher, "assemble_into", poisoned)
  config = tiny_config(prepared_dir, max_updates=6, eval_every=6)
  config.train.stages = ("asr",)
  config.train.log_every = 1
  config.train.max_consecutive_nonfinite = 3
  with pytest.raises(FloatingPointError, match=r"3 consecutive updates had a non-finite loss "
                                               r"or gradient.*lower asr.lr"):
    train.train_and_evaluate(config, str(tmp_path))
  with open(tmp_path / "asr" / "log.jsonl", encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  skipped = [r for r in records if "skipped_utterances" in r]
  assert [r["skipped_total"] for r in skipped] == [1, 2, 3]
  ids = json.loads(skipped[0]["skipped_utterances"])[0]
  data = ip.SplitData(experiment.pipeline_config(config, "asr"), "train")
  assert ids and set(ids) <= set(map(str, data.ids))   # the utterances of the skipped update


def test_same_seed_and_config_give_identical_loss_curves(prepared, tmp_path):
  _, prepared_dir = prepared
  curves = []
  for run in ("a", "b"):
    config = tiny_config(prepared_dir, max_updates=6, eval_every=3)
    config.train.stages = ("asr",)
    config.train.log_every = 1
    train.train_and_evaluate(config, str(tmp_path / run))
    with open(tmp_path / run / "asr" / "log.jsonl", encoding="utf-8") as f:
      dev = [r["dev_loss"] for r in map(json.loads, f) if "dev_loss" in r]
    curves.append((losses(str(tmp_path / run / "asr")), dev))
  assert len(curves[0][0]) == 6 and len(curves[0][1]) == 2
  assert curves[0] == curves[1]


def test_training_skips_utterances_longer_than_max_source_frames(prepared):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  data = ip.SplitData(experiment.pipeline_config(config, "asr"), "train")
  limit = int(np.sort(data.n_frames)[-3])              # the two longest are over the limit
  config.data.max_source_frames = limit
  batcher = ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr"), "train"), True)
  longest = np.argsort(data.n_frames, kind="stable")[-2:]
  assert sorted(batcher.too_long) == sorted(str(data.ids[i]) for i in longest
                                            if data.n_frames[i] > limit)
  planned = np.concatenate([idx for _, idx in batcher.epoch_plan(0)])
  assert not set(planned[planned >= 0]) & set(longest[data.n_frames[longest] > limit])
  assert len(set(planned[planned >= 0])) == len(data) - len(batcher.too_long)
  evaluation = ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr", "test"), "train"),
                          False)
  assert not evaluation.too_long                       # evaluation never drops an utterance
  config.data.max_source_frames = int(data.n_frames.min()) - 1
  with pytest.raises(ValueError, match=r"every utterance of train is skipped: \{'longer than "
                                       r"data.max_source_frames=\d+': 40\}.*raise "
                                       r"data.max_source_frames"):
    ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr"), "train"), True)


def test_dev_utterances_and_targets_that_no_batch_can_take_are_skipped_and_counted(prepared):
  """A dev utterance longer than a batch, and targets longer than the decoder's positions,
  are skipped in the dev loss and training, each counted with its reason, instead of stopping
  training or being cut; evaluation keeps every one."""
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  dev = ip.SplitData(experiment.pipeline_config(config, "asr", "dev"), "dev")
  longest = int(dev.n_frames.max())
  config.data.max_frames = (longest - 1) // 16 * 16     # the longest dev utterance cannot fit
  config.model.max_target_positions = 6                 # 5 tokens before EOS
  dev = ip.SplitData(experiment.pipeline_config(config, "asr", "dev"), "dev")
  batcher = ip.Batcher(dev, False, skip_unfit=True)
  limit = (longest - 1) // 16 * 16
  frames_reason = f"longer than a batch of data.max_frames={limit} ({limit} frames on each " \
                  f"of 1 devices)"
  target_reason = "a target longer than 5 tokens (model.max_target_positions - 1)"
  unfit = dev.n_frames > limit
  assert batcher.skipped[frames_reason] == [str(i) for i in dev.ids[unfit]]
  over = [str(i) for i, cut, no_fit in zip(dev.ids, dev.target_too_long, unfit)
          if cut and not no_fit]
  assert over and batcher.skipped[target_reason] == over
  planned = np.concatenate([idx for _, idx in batcher.epoch_plan(0)])
  assert len(planned[planned >= 0]) == len(dev) - len(over) - int(unfit.sum())
  config.data.max_frames = 3000
  train_data = ip.SplitData(experiment.pipeline_config(config, "asr"), "train")
  assert ip.Batcher(train_data, True).skipped[target_reason] == [
      str(i) for i, cut in zip(train_data.ids, train_data.target_too_long) if cut]
  config.eval.batch_frames = 3000
  test = ip.SplitData(experiment.pipeline_config(config, "asr", "test"), "dev")
  evaluation = ip.Batcher(test, False)
  assert not evaluation.skipped                          # evaluation decodes every one
  planned = np.concatenate([idx for _, idx in evaluation.epoch_plan(0)])
  assert len(planned[planned >= 0]) == len(test)


def test_an_asr_encoder_that_does_not_fit_the_st_config_is_named(prepared):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  asr_model = model_lib.S2TModel(experiment.model_config_for(config, 40))
  asr_params = model_lib.init_params(asr_model, jax.random.PRNGKey(0))
  config.model.ffn_dim = 24
  st_model = model_lib.S2TModel(experiment.model_config_for(config, 50))
  st_params = model_lib.init_params(st_model, jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match=r"(?s)does not fit the ST model config.*"
                                       r"encoder/layers_0/ffn/fc1/kernel: ASR \(16, 32\) vs ST "
                                       r"\(16, 24\).*same model\.\* settings"):
    transfer.carry_from_asr(st_params, asr_params, logging.getLogger("test"))


def test_st_init_carries_the_encoder_alone(prepared):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  asr_params = model_lib.init_params(model_lib.S2TModel(experiment.model_config_for(config, 40)),
                                 jax.random.PRNGKey(0))
  st_params = model_lib.init_params(model_lib.S2TModel(experiment.model_config_for(config, 50)),
                                jax.random.PRNGKey(1))
  carried = transfer.carry_from_asr(st_params, asr_params, logging.getLogger("test"))
  flat = lambda tree: flax.traverse_util.flatten_dict(dict(tree), sep="/")
  asr, st, new = flat(asr_params), flat(st_params), flat(carried)
  assert set(new) == set(st)
  for name, value in new.items():
    from_asr = name.startswith("encoder/")
    np.testing.assert_array_equal(value, asr[name] if from_asr else st[name], err_msg=name)
  assert any(n.startswith("decoder/layers_") for n in new)
  assert new["decoder/embed_tokens/embedding"].shape[0] == 50


def test_an_unwritable_workdir_is_named_before_anything_runs(prepared, tmp_path):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  with pytest.raises(OSError, match="cannot write to the workdir .*a_file/run.*free space"):
    train.train_and_evaluate(config, str(blocker / "run"))
  if os.geteuid() != 0:                    # root ignores permissions
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    with pytest.raises(OSError, match="cannot write to the workdir"):
      train.train_and_evaluate(config, str(locked / "run"))


def test_a_full_disk_while_checkpointing_keeps_earlier_checkpoints(prepared, tmp_path,
                                                                   monkeypatch):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, max_updates=4, eval_every=2)
  config.train.stages = ("asr",)
  save = ckpt_lib.ocp.CheckpointManager.save

  def full_disk_at_step_4(self, step, *args, **kwargs):
    if step == 4:
      raise OSError(28, "No space left on device")
    return save(self, step, *args, **kwargs)
  monkeypatch.setattr(ckpt_lib.ocp.CheckpointManager, "save", full_disk_at_step_4)
  with pytest.raises(OSError, match=r"writing checkpoint 4 .* failed \(No space left on "
                                    r"device\); the earlier checkpoints \[2\] are intact"):
    train.train_and_evaluate(config, str(tmp_path))
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / "asr" / "checkpoints"))
  assert checkpoints.steps() == [2]
  checkpoints.restore(2)                   # still readable


def test_empty_audio_is_rejected_with_its_reason(tmp_path):
  import soundfile  # pylint: disable=import-outside-toplevel
  from data_prep import audio  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "empty.wav")
  soundfile.write(path, np.zeros(0, np.float32), 16000)
  with pytest.raises(audio.AudioError) as info:
    audio.load_audio(path)
  assert info.value.reason == "empty audio" and "empty.wav" in str(info.value)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_train_together_like_one_process_with_the_same_global_batch(prepared,
                                                                                  tmp_path):
  _, prepared_dir = prepared
  config_file = _write_config(tmp_path / "tiny_jit.py", prepared_dir, 4, 2, "jit")
  port = _free_port()
  two = str(tmp_path / "two_processes")
  one_device = {"XLA_FLAGS": devices_flag(1)}
  processes = [_run(config_file, two, extra=[f"--coordinator=127.0.0.1:{port}",
                                             "--num_processes=2", f"--process_id={i}"],
                    env_update=one_device, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for i in range(2)]
  logs = _communicate(processes)
  for p, log in zip(processes, logs):
    assert p.returncode == 0, log[-3000:]
    assert "devices: 1 local (cpu), 2 processes; parallel=jit" in log
  checksums = [re.search(r"parameter checksum (\w+) \(process (\d) of 2\)", log).groups()
               for log in logs]
  assert {c[1] for c in checksums} == {"0", "1"}
  assert checksums[0][0] == checksums[1][0]          # identical parameters in both processes
  # One process with two devices sees the same global batches.
  one = str(tmp_path / "one_process")
  result = _run(config_file, one, env_update={"XLA_FLAGS": devices_flag(2)})
  assert result.returncode == 0, result.stderr[-3000:]
  assert "devices: 2 local (cpu), 1 processes; parallel=jit" in result.stderr
  state_two, meta_two = _final_state(two, 4)
  state_one, meta_one = _final_state(one, 4)
  assert meta_two["iterator"] == meta_one["iterator"]
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                         state_two["params"], state_one["params"])
  assert meta_two["dev_loss"] == pytest.approx(meta_one["dev_loss"], rel=1e-5)


def test_unprepared_data_and_impossible_batches_are_named(prepared, tmp_path):
  _, prepared_dir = prepared
  with pytest.raises(FileNotFoundError, match="is not a prepared corpus.*data_prep.prepare"):
    ip.SplitData(ip.PipelineConfig(str(tmp_path)), "train")
  with pytest.raises(ValueError, match=r"split 'tst-COMMON' was not prepared.*\['dev', "
                                       r"'train'\]"):
    ip.SplitData(ip.PipelineConfig(prepared_dir), "tst-COMMON")
  data = ip.SplitData(ip.PipelineConfig(prepared_dir, max_frames=100), "dev")
  with pytest.raises(ValueError, match=r"data.max_frames=100 cannot hold 1 utterances of "
                                       r"\d+ frames.*raise data.max_frames to at least"):
    ip.Batcher(data, False)
  with pytest.raises(ValueError, match="data.cmvn='mean'; valid"):
    ip.PipelineConfig(prepared_dir, cmvn="mean")
  config = tiny_config(prepared_dir)
  config.train.stages = ("asr", "mt")
  with pytest.raises(ValueError, match=r"train.stages=\('asr', 'mt'\); valid: 'asr' \| 'st'"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()               # rejected before anything ran


def test_incomplete_multi_process_flags_are_named(config_file, tmp_path):
  result = _run(config_file, str(tmp_path), extra=["--coordinator=127.0.0.1:1"])
  assert result.returncode != 0
  assert "--coordinator, --num_processes and --process_id go together" in result.stderr
