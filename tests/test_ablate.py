"""The ablation runner: one row per run, with --seeds the runs per seed and their mean, entries
FILE:VARIANT and windows(NAME), finished runs kept, stages shared, runs side by side."""

import csv
import json
import os
import statistics
import subprocess
import sys

import pytest

from multiformer_jax import ablate


def _fake_run(workdir, wer, bleu, splits=("tst-COMMON",), layout="12x(4*full)"):
  """What run.py leaves in a workdir, as far as the table reads it."""
  for stage, metric, value in (("asr", "wer", wer), ("st", "bleu", bleu)):
    for n, split in enumerate(splits):
      os.makedirs(os.path.join(workdir, stage, f"eval_{split}"))
      with open(os.path.join(workdir, stage, f"eval_{split}", "results.json"), "w",
                encoding="utf-8") as f:
        json.dump({metric: value + n, "chrf": 40.0 + n, "by_tag": {}}, f)
    with open(os.path.join(workdir, stage, "DONE.json"), "w", encoding="utf-8") as f:
      json.dump({"wall_s": 10.0}, f)
    with open(os.path.join(workdir, stage, "log.jsonl"), "w", encoding="utf-8") as f:
      for step in range(10, 110, 10):   # steps 10-30 are warm-up: 9.0 s, left out
        f.write(json.dumps({"step": step, "loss": 1.0,
                            "step_time_s": 9.0 if step <= 30 else step / 100}) + "\n")
      f.write(json.dumps({"step": 100, "dev_loss": 1.0, f"dev_{metric}": value - 1}) + "\n")
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump({"model": {"encoder_layout": layout},
               "reported": {"bleu": 22.53, "wer": -1.0}}, f)


def _fake_subprocess(monkeypatch, scores, splits=("tst-COMMON",)):
  """subprocess.run that records the training commands' arguments (after `python -m
  multiformer_jax.train`) and writes the run of the next scores."""
  commands = []

  def run(cmd, check, env):
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ablate.PACKAGE_ROOT
    if tuple(cmd[1:3]) == ablate.TRAIN_COMMAND:
      cmd = cmd[3:]
      commands.append(cmd)
      workdir = cmd[1][len("--workdir="):]
      _fake_run(workdir, *scores.pop(0), splits=splits)
    return subprocess.CompletedProcess(cmd, 0)
  monkeypatch.setattr(ablate.subprocess, "run", run)
  return commands


def test_seeds_give_a_row_per_seed_and_their_mean_and_std(tmp_path, monkeypatch):
  wers, bleus = [14.0, 14.5, 13.1], [22.4, 22.7, 22.5]
  commands = _fake_subprocess(monkeypatch, list(zip(wers, bleus)))
  ablate.main(["--configs", "configs/locality.py", "--workdir", str(tmp_path), "--seeds", "3",
               "--arg", "runlocal"])
  assert [c[0] for c in commands] == [
      f"--config=configs/locality.py:runlocal,train.seed={k},data.seed={k},"
      f"eval.after_training=true" for k in (1, 2, 3)]
  assert [c[1] for c in commands] == [f"--workdir={tmp_path}/locality/seed{k}"
                                      for k in (1, 2, 3)]
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  assert [r["config"] for r in rows] == ["locality (seed 1)", "locality (seed 2)",
                                         "locality (seed 3)",
                                         "locality (mean ± std, 3 seeds)"]
  summary = rows[-1]
  assert summary["asr_wer"] == f"{statistics.mean(wers):.2f} ± {statistics.stdev(wers):.2f}"
  assert summary["st_bleu"] == "22.53 ± 0.15"              # by hand: mean 22.533, s 0.1528
  assert summary["reported_bleu"] == "22.53" and summary["status"] == "3 of 3 done"
  assert summary["train_wall_s"] == "60.0"
  # Each run's last dev score and median seconds per update (steps 40..100: 0.4..1.0 -> 0.7).
  assert rows[0]["dev_wer"] == "13.0" and rows[0]["dev_bleu"] == "21.4"
  assert rows[0]["asr_update_s"] == "0.7" and summary["st_update_s"] == "0.7000 ± 0.0000"

  # A rerun keeps the finished runs: no command, the same table.
  commands.clear()
  ablate.main(["--configs", "configs/locality.py", "--workdir", str(tmp_path), "--seeds", "3"])
  assert commands == []
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    again = list(csv.DictReader(f))
  assert [r["asr_wer"] for r in again] == [r["asr_wer"] for r in rows]
  assert again[0]["status"] == "done (kept)" and again[-1]["status"] == "3 of 3 done"


def test_variants_windows_shared_stages_and_splits(tmp_path, monkeypatch):
  splits = ("tst-COMMON", "tst-real")
  commands = _fake_subprocess(monkeypatch, [(20.0, 10.0), (22.0, 9.0), (21.0, 9.5),
                                            (23.0, 9.0)], splits)

  def fake_analysis(source, workdir):           # Algorithm 1 needs a trained model
    assert os.path.exists(os.path.join(source, "st", "DONE.json"))
    os.makedirs(os.path.join(workdir, "windows"))
    return os.path.join(workdir, "windows", "config.py")
  monkeypatch.setattr(ablate, "windows_config", fake_analysis)
  # The first entry's MT stage of seed 1 exists: later entries of seed 1 start with a copy.
  os.makedirs(tmp_path / "full" / "seed1" / "mt")
  (tmp_path / "full" / "seed1" / "mt" / "DONE.json").write_text("{}")
  ablate.main(["--configs", "configs/layouts.py:full,windows(full)", "--workdir",
               str(tmp_path), "--seeds", "2", "--share_stages", "mt", "--splits",
               ",".join(splits)])
  assert [c[0].split(",")[0] for c in commands] == [
      "--config=configs/layouts.py:full", "--config=configs/layouts.py:full",
      f"--config={tmp_path}/windows_full/seed1/windows/config.py:train.seed=1",
      f"--config={tmp_path}/windows_full/seed2/windows/config.py:train.seed=2"]
  assert (tmp_path / "windows_full" / "seed1" / "mt" / "DONE.json").exists()
  assert not (tmp_path / "windows_full" / "seed2" / "mt").exists()
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  assert [r["config"] for r in rows] == [
      "full (seed 1)", "full (seed 2)", "full (mean ± std, 2 seeds)", "windows_full (seed 1)",
      "windows_full (seed 2)", "windows_full (mean ± std, 2 seeds)"]
  assert rows[0]["wer tst-COMMON"] == "20.0" and rows[0]["wer tst-real"] == "21.0"
  assert rows[0]["bleu tst-real"] == "11.0" and rows[0]["chrf tst-real"] == "41.0"
  assert rows[2]["bleu tst-COMMON"] == "9.50 ± 0.71"
  with open(tmp_path / "results.md", encoding="utf-8") as f:
    header = f.readline()
  assert "tst-real WER ↓" in header and "tst-COMMON chrF ↑" in header
  with open(tmp_path / "scores_vs_time.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("configs, message", [
    ("windows(full),configs/a.py:full", "no entry before it runs as 'full'"),
    ("configs/a.py:x,configs/b.py:x", "two entries run as 'x'"),
    ("configs/a.txt", "expected FILE.py"),
])
def test_bad_entries_are_named(configs, message):
  with pytest.raises(ValueError, match=message):
    ablate.parse_entries(configs)


def test_seeds_and_jobs_must_be_positive(tmp_path):
  for flag in ("--seeds", "--jobs"):
    with pytest.raises(SystemExit):
      ablate.main(["--configs", "configs/x.py", "--workdir", str(tmp_path), flag, "0"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_jobs_run_side_by_side_on_their_own_cpus(tmp_path):
  probe = ("import json, os; print(json.dumps([sorted(os.sched_getaffinity(0)), "
           "os.environ.get('XLA_FLAGS', '')]))")
  logs = [str(tmp_path / f"run{k}.log") for k in (1, 2)]
  codes = ablate.run_commands([([sys.executable, "-c", probe], log) for log in logs], jobs=2)
  assert codes == [0, 0]
  shares = [json.loads(open(log, encoding="utf-8").read()) for log in logs]
  assert not set(shares[0][0]) & set(shares[1][0])
  assert all(len(cpus) >= 1 for cpus, _ in shares)
  if len(shares[0][0]) == 1:
    assert "--xla_cpu_multi_thread_eigen=false" in shares[0][1]


def test_a_windows_entry_without_its_source_run_fails_alone(tmp_path, monkeypatch):
  commands = []
  monkeypatch.setattr(ablate.subprocess, "run", lambda cmd, check, env: (
      commands.append(cmd), subprocess.CompletedProcess(cmd, 1))[1])   # full's run fails
  ablate.main(["--configs", "configs/layouts.py:full,windows(full)", "--workdir",
               str(tmp_path)])
  assert len(commands) == 1                       # no analysis of a run that did not finish
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  assert [r["status"][:22] for r in rows] == ["failed (exit 1)", "failed (windows: windo"]
  assert "has no finished ST stage to analyse" in rows[1]["status"]


def test_the_training_command_it_starts_runs_from_any_directory(tmp_path):
  """ablate starts `python -m multiformer_jax.train` with this package first on PYTHONPATH:
  the run imports the same package wherever the user is (no checkout's run.py needed)."""
  config = os.path.join(ablate.PACKAGE_ROOT, "configs", "s2t_v2.py")
  environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  result = subprocess.run([sys.executable, *ablate.TRAIN_COMMAND, f"--config={config}",
                           "--print_config"], cwd=tmp_path, env=ablate.command_env(environment),
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "name: s2t_multiformer_s_v2" in result.stdout
