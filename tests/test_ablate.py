"""The ablation runner: one row per run, and with --seeds the runs per seed and their mean."""

import csv
import json
import os
import statistics
import subprocess

import pytest

from multiformer_jax import ablate


def _fake_run(workdir, wer, bleu):
  """What run.py leaves in a workdir, as far as the table reads it."""
  for stage, metric, value in (("asr", "wer", wer), ("st", "bleu", bleu)):
    os.makedirs(os.path.join(workdir, stage, "eval_tst-COMMON"))
    with open(os.path.join(workdir, stage, "eval_tst-COMMON", "results.json"), "w",
              encoding="utf-8") as f:
      json.dump({metric: value, "by_tag": {}}, f)
    with open(os.path.join(workdir, stage, "DONE.json"), "w", encoding="utf-8") as f:
      json.dump({"wall_s": 10.0}, f)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump({"model": {"encoder_layout": "12x(4*full)"},
               "reported": {"bleu": 22.53, "wer": -1.0}}, f)


def test_seeds_give_a_row_per_seed_and_their_mean_and_std(tmp_path, monkeypatch):
  wers, bleus = [14.0, 14.5, 13.1], [22.4, 22.7, 22.5]
  for k, (wer, bleu) in enumerate(zip(wers, bleus), 1):
    _fake_run(str(tmp_path / "locality" / f"seed{k}"), wer, bleu)
  commands = []
  monkeypatch.setattr(ablate.subprocess, "run", lambda cmd, check: (
      commands.append(cmd), subprocess.CompletedProcess(cmd, 0))[1])
  ablate.main(["--configs", "configs/locality.py", "--workdir", str(tmp_path), "--seeds", "3",
               "--arg", "runlocal"])
  assert [c[2] for c in commands] == [
      f"--config=configs/locality.py:runlocal,train.seed={k},data.seed={k},"
      f"eval.after_training=true" for k in (1, 2, 3)]
  assert [c[3] for c in commands] == [f"--workdir={tmp_path}/locality/seed{k}"
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


def test_seeds_must_be_positive(tmp_path):
  with pytest.raises(SystemExit):
    ablate.main(["--configs", "configs/x.py", "--workdir", str(tmp_path), "--seeds", "0"])
