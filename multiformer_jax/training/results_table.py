"""The results table of runs: a row per run (its config, layout, evaluation scores per split,
last dev scores, median seconds per update and training time), a mean ± std row per config over
its seeds, written as markdown and CSV, and the scores drawn against the time per update. run.py
prints it for the run it trains; `ablate` writes it for an ablation's runs (the thesis's Table 2
and the locality paper's Table 2 have this form).
"""

from __future__ import annotations

import json
import os
import statistics

from multiformer_jax import schema
from multiformer_jax.evaluation import results
from multiformer_jax.runtime import tables
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.training import curves

COLUMNS = ("config", "encoder_layout", "asr_wer", "st_bleu", "asr_wer_avg", "st_bleu_avg",
           "asr_wer_by_task", "st_bleu_by_task", "reported_bleu", "reported_wer",
           "reported_averages", "dev_wer", "dev_bleu", "asr_update_s", "st_update_s",
           "train_wall_s", "status")
HEADERS = {"config": "config", "encoder_layout": "encoder layout", "asr_wer": "ASR WER ↓",
           "st_bleu": "ST BLEU ↑", "asr_wer_avg": "WER average over languages",
           "st_bleu_avg": "BLEU averages over directions", "asr_wer_by_task": "WER per task",
           "st_bleu_by_task": "BLEU per task", "reported_bleu": "paper BLEU",
           "reported_wer": "paper WER", "reported_averages": "paper averages",
           "dev_wer": "dev WER", "dev_bleu": "dev BLEU", "asr_update_s": "ASR s/update",
           "st_update_s": "ST s/update", "train_wall_s": "train s", "status": "status"}
# The per-split columns (--splits): metric key of results.json, stage, header.
SPLIT_METRICS = (("wer", "asr", "WER"), ("bleu", "st", "BLEU"), ("chrf", "st", "chrF"))
# Numbers the seeds' summary row averages.
AVERAGED = ("asr_wer", "st_bleu", "dev_wer", "dev_bleu", "asr_update_s", "st_update_s")
# Which per-tag scores of results.json make the per-task columns, in order of preference
# (the model's own task tag first).
TASK_TAG_PREFERENCE = ("pair", "source_lang", "target_lang", "domain")
# Updates left out of the median seconds per update: compilation and warm-up.
WARM_UP_UPDATES = 30
# Where this package is imported from (a checkout or site-packages): the runs it starts import
# the same one, through `python -m`, wherever the user runs ablate from.


def split_columns(splits) -> tuple[str, ...]:
  """'tst-COMMON' -> ('wer tst-COMMON', 'bleu tst-COMMON', 'chrf tst-COMMON')."""
  return tuple(f"{metric} {split}" for split in splits for metric, _, _ in SPLIT_METRICS)


def table_columns(splits=()) -> tuple[str, ...]:
  at = COLUMNS.index("reported_bleu")
  return COLUMNS[:at] + split_columns(splits) + COLUMNS[at:]


def by_task(results: dict, metric: str) -> str:
  """'de 12.3 · es 9.1' from an evaluation's per-tag scores ('' for a one-task test set): per
  task of a model with one task key, else per language pair."""
  by_tag = results.get("by_tag", {})
  keys = set(results.get("task_keys", {}).values())   # one key: its tasks; two: the pairs
  for tag in (tuple(keys) if len(keys) == 1 else ()) + TASK_TAG_PREFERENCE:
    if tag in by_tag:
      return " · ".join(f"{v} {r[metric]}" for v, r in by_tag[tag].items())
  return ""


def averages(results: dict) -> str:
  """'AVG-A 13.2 · AVG-T 14.6 · AVG-Z 8.5' (ST) or 'AVG 49.0' (ASR): the head-selection
  paper's averages over directions / languages ('—' where a direction was left out)."""
  return " · ".join(f"{k} {'—' if v is None else v}"
                    for k, v in results.get("averages", {}).items() if k.startswith("AVG"))


def collect_row(workdir: str, name: str, status: str = "", split: str | None = None,
                splits=()) -> dict:
  """One table row from a run's saved config and the evaluation results of `split` (default:
  the config's data.test_split; without a saved config, whichever split was evaluated), plus
  the columns of each of `splits`."""
  row = {c: "" for c in table_columns(splits)}
  row["config"], row["status"] = name, status
  run_config = None
  if os.path.exists(os.path.join(workdir, "config.json")):
    run_config = schema.load_config(workdir, check_corpus=False)
    config = run_config.to_dict()
    split = split or config.get("data", {}).get("test_split")
    row["encoder_layout"] = config["model"]["encoder_layout"]
    for key in ("bleu", "wer"):            # a negative value: the paper has no such number
      value = config.get("reported", {}).get(key, "")
      row[f"reported_{key}"] = value if isinstance(value, (int, float)) and value >= 0 else ""
    row["reported_averages"] = config.get("reported", {}).get("averages", "")
  wall = 0.0
  for stage, key, column in (("asr", "wer", "asr_wer"), ("st", "bleu", "st_bleu")):
    stage_dir = os.path.join(workdir, stage)
    for evaluated in results.evaluated_splits(workdir, stage) if run_config else []:
      evaluation = results.read(workdir, stage, evaluated, run_config)
      if evaluation and (evaluated == split if split else True):
        row[column] = evaluation[key]
        row[f"{column}_by_task"] = by_task(evaluation, key)
        row[f"{column}_avg"] = averages(evaluation)
    for other in splits:
      evaluation = results.read(workdir, stage, other, run_config) if run_config else None
      for metric, metric_stage, _ in SPLIT_METRICS:
        if evaluation and metric_stage == stage:
          row[f"{metric} {other}"] = evaluation.get(metric, "")
    train_rows, dev_rows = curves.read_log(stage_dir)
    row[f"dev_{key}"] = next((r[f"dev_{key}"] for r in reversed(dev_rows) if f"dev_{key}" in r),
                             "")                   # eval.score_dev's last dev WER / BLEU
    times = [r["step_time_s"] for r in train_rows
             if "step_time_s" in r and r["step"] > WARM_UP_UPDATES]
    row[f"{stage}_update_s"] = round(statistics.median(times), 4) if times else ""
    done = os.path.join(stage_dir, DONE)
    if os.path.exists(done):
      with open(done, encoding="utf-8") as f:
        wall += json.load(f).get("wall_s", 0.0)
  row["train_wall_s"] = round(wall, 1) if wall else ""
  if not row["status"]:
    row["status"] = "done" if row["st_bleu"] != "" or row["asr_wer"] != "" else "incomplete"
  return row


def mean_std(values, digits: int = 2) -> str:
  """'22.49 ± 0.11' (sample standard deviation) of the numbers among `values`; '' if none."""
  numbers = [float(v) for v in values if isinstance(v, (int, float))]
  if not numbers:
    return ""
  std = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
  return f"{statistics.mean(numbers):.{digits}f} ± {std:.{digits}f}"


def seeds_row(rows: list[dict], name: str, splits=()) -> dict:
  """The summary row of one config's runs over seeds: mean ± std of the scores, the summed
  training time, and how many seeds finished."""
  row = {c: "" for c in table_columns(splits)}
  row["config"] = f"{name} (mean ± std, {len(rows)} seeds)"
  row["encoder_layout"] = next((r["encoder_layout"] for r in rows if r["encoder_layout"]), "")
  for column in AVERAGED + split_columns(splits):
    row[column] = mean_std((r[column] for r in rows), 4 if column.endswith("update_s") else 2)
  for column in ("reported_bleu", "reported_wer", "reported_averages"):
    row[column] = rows[0][column] if rows else ""
  walls = [r["train_wall_s"] for r in rows if isinstance(r["train_wall_s"], (int, float))]
  row["train_wall_s"] = round(sum(walls), 1) if walls else ""
  done = sum(r["status"].startswith("done") for r in rows)
  row["status"] = f"{done} of {len(rows)} done"
  return row


def write_table(rows: list[dict], out_dir: str, splits=()) -> tables.TablePaths:
  """The results table of `rows` -> {out_dir}/results.md and results.csv."""
  columns = table_columns(splits)
  return tables.write_table(
      rows, os.path.join(out_dir, "results"), columns,
      headers=[HEADERS.get(c) or _split_header(c) for c in columns],
      cell=lambda column, value: (f"`{value}`" if column == "encoder_layout" else
                                  "—" if value == "" else str(value)))


def _split_header(column: str) -> str:
  metric, split = column.split(" ", 1)
  arrow = "↓" if metric == "wer" else "↑"
  return f"{split} {dict((m, h) for m, _, h in SPLIT_METRICS)[metric]} {arrow}"


def _numbers(rows: list[dict], column: str) -> list[float]:
  return [float(r[column]) for r in rows if isinstance(r.get(column), (int, float))]


def plot_scores_against_time(runs: dict[str, list[dict]], path: str, splits=()) -> str | None:
  """Per entry, mean ± std over its seeds of ST BLEU and ASR WER (each of `splits`, else the
  test split) against the runs' median seconds per ASR update: what a layout buys and costs."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  panels = ([(f"bleu {s}", f"{s} ST BLEU") for s in splits] +
            [(f"wer {s}", f"{s} ASR WER") for s in splits]) or [
                ("st_bleu", "ST BLEU"), ("asr_wer", "ASR WER")]
  panels = [(c, t) for c, t in panels
            if any(_numbers(rows, c) for rows in runs.values())]
  if not panels or not any(_numbers(rows, "asr_update_s") for rows in runs.values()):
    return None
  fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
  for ax, (column, title) in zip(axes[0], panels):
    for name, rows in runs.items():
      x, y = _numbers(rows, "asr_update_s"), _numbers(rows, column)
      if not x or not y:
        continue
      ax.errorbar(statistics.mean(x), statistics.mean(y),
                  yerr=statistics.stdev(y) if len(y) > 1 else 0, fmt="o", capsize=3)
      ax.annotate(name, (statistics.mean(x), statistics.mean(y)), fontsize=8,
                  xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("s per ASR update (runs' median)")
    ax.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
