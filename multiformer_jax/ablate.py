"""Config-driven ablations: run config variants through both stages and evaluation, then
write a results table like the thesis's Table 2 (markdown + CSV).

    python -m multiformer_jax.ablate --workdir runs/ablation \
        --configs configs/multiformer_full.py,configs/multiformer_h_lc.py,configs/s2t_v2.py \
        --arg runlocal --set data.prepared_dir=data/prepared/embedded_en_de,asr.max_updates=300

Each config runs as `python run.py --config=FILE:ARG --workdir=WORKDIR/NAME` (so a rerun
resumes, and one failing config does not stop the others); `--table-only` just collects the
evaluation JSONs already in the workdir. With `--seeds N` each config runs N times, seed k
(train.seed = data.seed = k: initialisation, dropout, batch order) in WORKDIR/NAME/seed{k},
and the table adds a row with the mean ± sample standard deviation over the seeds (the
locality paper's Table 2 reports 5 seeds so).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

from data_prep.common import cli_errors

COLUMNS = ("config", "encoder_layout", "asr_wer", "st_bleu", "asr_wer_avg", "st_bleu_avg",
           "asr_wer_by_task", "st_bleu_by_task", "reported_bleu", "reported_wer",
           "reported_averages", "train_wall_s", "status")
# Which per-tag scores of results.json make the per-task columns, in order of preference
# (the model's own task tag first).
TASK_TAG_PREFERENCE = ("pair", "source_lang", "target_lang", "domain")


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


def run_name(config_path: str) -> str:
  return os.path.splitext(os.path.basename(config_path))[0]


def collect_row(workdir: str, name: str, status: str = "", split: str | None = None) -> dict:
  """One table row from a run's saved config and the evaluation results of `split` (default:
  the config's data.test_split; without a saved config, whichever split was evaluated)."""
  row = {c: "" for c in COLUMNS}
  row["config"], row["status"] = name, status
  config_path = os.path.join(workdir, "config.json")
  if os.path.exists(config_path):
    with open(config_path, encoding="utf-8") as f:
      config = json.load(f)
    split = split or config.get("data", {}).get("test_split")
    row["encoder_layout"] = config["model"]["encoder_layout"]
    for key in ("bleu", "wer"):            # a negative value: the paper has no such number
      value = config.get("reported", {}).get(key, "")
      row[f"reported_{key}"] = value if isinstance(value, (int, float)) and value >= 0 else ""
    row["reported_averages"] = config.get("reported", {}).get("averages", "")
  wall = 0.0
  for stage, key, column in (("asr", "wer", "asr_wer"), ("st", "bleu", "st_bleu")):
    stage_dir = os.path.join(workdir, stage)
    for entry in sorted(os.listdir(stage_dir)) if os.path.isdir(stage_dir) else []:
      results = os.path.join(stage_dir, entry, "results.json")
      if (entry == f"eval_{split}" if split else entry.startswith("eval_")) and \
          os.path.exists(results):
        with open(results, encoding="utf-8") as f:
          evaluation = json.load(f)
        row[column] = evaluation[key]
        row[f"{column}_by_task"] = by_task(evaluation, key)
        row[f"{column}_avg"] = averages(evaluation)
    done = os.path.join(stage_dir, "DONE.json")
    if os.path.exists(done):
      with open(done, encoding="utf-8") as f:
        wall += json.load(f).get("wall_s", 0.0)
  row["train_wall_s"] = round(wall, 1) if wall else ""
  if not row["status"]:
    row["status"] = "done" if row["st_bleu"] != "" or row["asr_wer"] != "" else "incomplete"
  return row


def mean_std(values) -> str:
  """'22.49 ± 0.11' (sample standard deviation) of the numbers among `values`; '' if none."""
  numbers = [float(v) for v in values if isinstance(v, (int, float))]
  if not numbers:
    return ""
  std = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
  return f"{statistics.mean(numbers):.2f} ± {std:.2f}"


def seeds_row(rows: list[dict], name: str) -> dict:
  """The summary row of one config's runs over seeds: mean ± std of the scores, the summed
  training time, and how many seeds finished."""
  row = {c: "" for c in COLUMNS}
  row["config"] = f"{name} (mean ± std, {len(rows)} seeds)"
  row["encoder_layout"] = next((r["encoder_layout"] for r in rows if r["encoder_layout"]), "")
  for column in ("asr_wer", "st_bleu"):
    row[column] = mean_std(r[column] for r in rows)
  for column in ("reported_bleu", "reported_wer", "reported_averages"):
    row[column] = rows[0][column] if rows else ""
  walls = [r["train_wall_s"] for r in rows if isinstance(r["train_wall_s"], (int, float))]
  row["train_wall_s"] = round(sum(walls), 1) if walls else ""
  done = sum(r["status"] == "done" for r in rows)
  row["status"] = f"{done} of {len(rows)} done"
  return row


def write_table(rows: list[dict], out_dir: str) -> tuple[str, str]:
  os.makedirs(out_dir, exist_ok=True)
  csv_path = os.path.join(out_dir, "results.csv")
  with open(csv_path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  md_path = os.path.join(out_dir, "results.md")
  header = ("| config | encoder layout | ASR WER ↓ | ST BLEU ↑ | WER average over languages | "
            "BLEU averages over directions | WER per task | BLEU per task | paper BLEU | "
            "paper WER | paper averages | train s | status |")
  lines = [header, "|" + "---|" * len(COLUMNS)]
  for r in rows:
    cells = [f"`{r[c]}`" if c == "encoder_layout" else
             "—" if r[c] == "" else str(r[c]).replace("|", "\\|") for c in COLUMNS]
    lines.append("| " + " | ".join(cells) + " |")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return md_path, csv_path


def main(argv=None):
  parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
  parser.add_argument("--configs", required=True, help="comma-separated config files")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--arg", default="", help="variant passed to every config (file.py:ARG)")
  parser.add_argument("--set", default="", help="comma-separated key=value for every config")
  parser.add_argument("--table-only", action="store_true")
  parser.add_argument("--seeds", type=int, default=1,
                      help="runs per config with seeds 1..N (mean ± std rows); default 1")
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.error(f"--seeds {args.seeds}: give a number of seeds >= 1")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  rows = []
  for path in [p for p in args.configs.split(",") if p]:
    name = run_name(path)
    runs = [(os.path.join(args.workdir, name), name, "")] if args.seeds == 1 else [
        (os.path.join(args.workdir, name, f"seed{k}"), f"{name} (seed {k})",
         f"train.seed={k},data.seed={k}") for k in range(1, args.seeds + 1)]
    config_rows = []
    for workdir, label, seed_set in runs:
      status = ""
      if not args.table_only:
        variant = ",".join(x for x in (args.arg, args.set, seed_set,
                                       "eval.after_training=true") if x)
        cmd = [sys.executable, os.path.join(repo, "run.py"), f"--config={path}:{variant}",
               f"--workdir={workdir}"]
        print("running:", " ".join(cmd), flush=True)
        result = subprocess.run(cmd, check=False)
        status = "done" if result.returncode == 0 else f"failed (exit {result.returncode})"
      config_rows.append(collect_row(workdir, label, status))
    rows += config_rows
    if args.seeds > 1:
      rows.append(seeds_row(config_rows, name))
  md_path, csv_path = write_table(rows, args.workdir)
  with open(md_path, encoding="utf-8") as f:
    print(f.read())
  print(f"wrote {md_path} and {csv_path}")


# The command line and console script: user errors -> their message and exit status 2.
cli = cli_errors.command_line_entry(main)


if __name__ == "__main__":
  cli()
