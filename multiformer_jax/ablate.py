"""Config-driven ablations: run config variants through both stages and evaluation, then
write a results table like the thesis's Table 2 (markdown + CSV).

    python -m multiformer_jax.ablate --workdir runs/ablation \
        --configs configs/multiformer_full.py,configs/multiformer_h_lc.py,configs/s2t_v2.py \
        --arg runlocal --set data.prepared_dir=data/prepared/embedded_en_es,asr.max_updates=300

Each entry of --configs is a config file (run NAME = the file's name) or FILE:VARIANT (NAME =
the variant), run as `python -m multiformer_jax.train --config=FILE[:VARIANT,...]
--workdir=WORKDIR/NAME` (run.py's command, from the package ablate itself runs from), so a
rerun resumes, a finished run (both stages and their evaluations there) is kept, and one
failing entry does not stop the others. The entry `windows(NAME)` is the locality paper's
efficient model: Algorithm 1 (`python -m multiformer_jax.analyze windows`, ST stage, 400
utterances of dev) on run NAME's contributions selects per-layer windows, and NAME's config
trains again with them. `--table-only` just collects the evaluation JSONs already there.

With `--seeds N` each entry runs N times, seed k (train.seed = data.seed = k: initialisation,
dropout, batch order) in WORKDIR/NAME/seed{k}, and the table adds a row with the mean ± sample
standard deviation over the seeds (the locality paper's Table 2 reports 5 seeds so); a
`windows(NAME)` entry analyses NAME's run of the same seed. `--jobs J` runs J seeds of an
entry at once, each pinned to its share of the CPUs (its log in WORKDIR/NAME/seed{k}/run.log).
`--share_stages mt` lets later entries reuse the first entry's finished MT stage of the same
seed (the MT model does not depend on the encoder). `--splits` reports those evaluation
splits side by side (ASR WER, ST BLEU and chrF each); the table also carries each run's last
dev WER / BLEU (eval.score_dev) and its median seconds per update of each stage, and
WORKDIR/scores_vs_time.png draws each entry's scores (mean ± std) against those seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

from data_prep.common import cli_errors
from multiformer_jax.evaluation import results
from multiformer_jax.runtime import tables
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.training import curves
from multiformer_jax import schema

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
WINDOWS_ENTRY = re.compile(r"windows\((\w+)\)$")
# Updates left out of the median seconds per update: compilation and warm-up.
WARM_UP_UPDATES = 30
# Where this package is imported from (a checkout or site-packages): the runs it starts import
# the same one, through `python -m`, wherever the user runs ablate from.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_COMMAND = ("-m", "multiformer_jax.train")


def command_env(env=None) -> dict:
  """`env` (default: this process's) with this package first on PYTHONPATH."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
  return env


def split_columns(splits) -> tuple[str, ...]:
  """'tst-COMMON' -> ('wer tst-COMMON', 'bleu tst-COMMON', 'chrf tst-COMMON')."""
  return tuple(f"{metric} {split}" for split in splits for metric, _, _ in SPLIT_METRICS)


def table_columns(splits=()) -> tuple[str, ...]:
  at = COLUMNS.index("reported_bleu")
  return COLUMNS[:at] + split_columns(splits) + COLUMNS[at:]


@dataclasses.dataclass(frozen=True)
class Entry:
  """One entry of --configs: run NAME from config file PATH (with VARIANT), or the efficient
  model whose windows come from run WINDOWS_FROM."""
  name: str
  path: str = ""
  variant: str = ""
  windows_from: str = ""


def parse_entries(text: str) -> list[Entry]:
  entries = []
  for item in (x.strip() for x in text.split(",")):
    if not item:
      continue
    match = WINDOWS_ENTRY.match(item)
    if match:
      entries.append(Entry(f"windows_{match.group(1)}", windows_from=match.group(1)))
      continue
    path, _, variant = item.partition(":")
    if not path.endswith(".py"):
      raise ValueError(f"--configs entry {item!r}: expected FILE.py, FILE.py:VARIANT or "
                       f"windows(NAME)")
    entries.append(Entry(variant or run_name(path), path, variant))
  names = [e.name for e in entries]
  for e in entries:
    if names.count(e.name) > 1:
      raise ValueError(f"--configs: two entries run as {e.name!r}; give them other variants")
    if e.windows_from and e.windows_from not in names[:names.index(e.name)]:
      raise ValueError(f"--configs entry windows({e.windows_from}): no entry before it runs as "
                       f"{e.windows_from!r}; valid: {names[:names.index(e.name)]}")
  return entries


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


def finished(workdir: str, splits) -> bool:
  """Whether both stages of a run finished and were evaluated on every one of `splits` (on some
  split, without `splits`): a rerun of the ablation keeps such a run as it is."""
  for stage in ("asr", "st"):
    stage_dir = os.path.join(workdir, stage)
    if not os.path.exists(os.path.join(stage_dir, DONE)):
      return False
    evaluated = results.evaluated_splits(workdir, stage)
    if not evaluated or any(s not in evaluated for s in splits):
      return False
  return True


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


def cpu_shares(jobs: int) -> list[list[int]]:
  """This process's CPUs split into `jobs` contiguous shares (at least one CPU each)."""
  cpus = sorted(os.sched_getaffinity(0))
  if jobs > len(cpus):
    raise ValueError(f"--jobs {jobs}: this process may use {len(cpus)} CPUs; give at most "
                     f"{len(cpus)}")
  size = len(cpus) // jobs
  return [cpus[i * size:(i + 1) * size] for i in range(jobs)]


def run_commands(commands: list[tuple[list[str], str]], jobs: int) -> list[int]:
  """Runs (command, log path) pairs `jobs` at a time and returns their exit codes. One job:
  in this terminal. More: each on its own share of the CPUs (XLA's CPU thread pool follows the
  affinity; on one CPU, Eigen's threading is turned off), its output in its log."""
  if jobs == 1:
    return [subprocess.run(cmd, check=False, env=command_env()).returncode
            for cmd, _ in commands]
  codes = []
  for start in range(0, len(commands), jobs):
    running = []
    for (cmd, log_path), cpus in zip(commands[start:start + jobs], cpu_shares(jobs)):
      env = command_env()
      if len(cpus) == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                            ).strip()
      os.makedirs(os.path.dirname(log_path), exist_ok=True)
      log = open(log_path, "a", encoding="utf-8")   # pylint: disable=consider-using-with
      running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       preexec_fn=lambda c=cpus: os.sched_setaffinity(0, c)),
                      log))
    for process, log in running:
      codes.append(process.wait())
      log.close()
  return codes


def share_stages(stages, source: str, target: str) -> None:
  """Copies each finished stage of run `source` that run `target` does not have yet."""
  for stage in stages:
    done = os.path.join(source, stage, DONE)
    if os.path.exists(done) and not os.path.exists(os.path.join(target, stage)):
      shutil.copytree(os.path.join(source, stage), os.path.join(target, stage))


def windows_config(source: str, workdir: str) -> str:
  """Algorithm 1 on run `source`'s ST stage (400 dev utterances): its table, plots and the
  efficient model's config under WORKDIR/windows; returns the config's path (kept on rerun)."""
  out = os.path.join(workdir, "windows")
  path = os.path.join(out, "config.py")
  if not os.path.exists(path):
    if not os.path.exists(os.path.join(source, "st", DONE)):
      raise FileNotFoundError(f"windows: run {source} has no finished ST stage to analyse")
    subprocess.run([sys.executable, "-m", "multiformer_jax.analyze", "windows", "--workdir",
                    source, "--stage", "st", "--num_utterances", "400", "--out", out,
                    "--config_out", path], check=True, env=command_env())
  return path


def main(argv=None):
  parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
  parser.add_argument("--configs", required=True,
                      help="comma-separated entries: FILE.py, FILE.py:VARIANT or windows(NAME)")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--arg", default="", help="variant passed to every config (file.py:ARG)")
  parser.add_argument("--set", default="", help="comma-separated key=value for every config")
  parser.add_argument("--table-only", action="store_true")
  parser.add_argument("--seeds", type=int, default=1,
                      help="runs per config with seeds 1..N (mean ± std rows); default 1")
  parser.add_argument("--jobs", type=int, default=1,
                      help="runs of one entry (its seeds) at once, each on its share of the "
                           "CPUs; default 1")
  parser.add_argument("--share_stages", default="",
                      help="comma-separated stages (mt) later entries copy from the first "
                           "entry's run of the same seed")
  parser.add_argument("--splits", default="",
                      help="comma-separated evaluation splits reported side by side")
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.error(f"--seeds {args.seeds}: give a number of seeds >= 1")
  if args.jobs < 1:
    parser.error(f"--jobs {args.jobs}: give a number of runs at once >= 1")
  entries = parse_entries(args.configs)
  splits = [s for s in args.splits.split(",") if s]
  shared = [s for s in args.share_stages.split(",") if s]

  def run_dir(name: str, seed: int) -> str:
    base = os.path.join(args.workdir, name)
    return base if args.seeds == 1 else os.path.join(base, f"seed{seed}")
  rows, runs = [], {}
  for index, entry in enumerate(entries):
    seeds = list(range(1, args.seeds + 1))
    labels = [entry.name if args.seeds == 1 else f"{entry.name} (seed {k})" for k in seeds]
    status = {k: "" for k in seeds}
    if not args.table_only:
      commands, launched = [], []
      for k in seeds:
        workdir = run_dir(entry.name, k)
        if finished(workdir, splits):
          status[k] = "done (kept)"
          continue
        if index > 0:
          share_stages(shared, run_dir(entries[0].name, k), workdir)
        path, variant = entry.path, entry.variant
        if entry.windows_from:
          try:
            path = windows_config(run_dir(entry.windows_from, k), workdir)
          except (FileNotFoundError, subprocess.CalledProcessError) as error:
            status[k] = f"failed (windows: {error})"     # the other runs go on
            continue
        seed_set = f"train.seed={k},data.seed={k}" if args.seeds > 1 else ""
        variant = ",".join(x for x in (variant, args.arg, args.set, seed_set,
                                       "eval.after_training=true") if x)
        cmd = [sys.executable, *TRAIN_COMMAND, f"--config={path}:{variant}",
               f"--workdir={workdir}"]
        print("running:", " ".join(cmd), flush=True)
        commands.append((cmd, os.path.join(workdir, "run.log")))
        launched.append(k)
      for k, code in zip(launched, run_commands(commands, args.jobs)):
        status[k] = "done" if code == 0 else f"failed (exit {code})"
    config_rows = [collect_row(run_dir(entry.name, k), label, status[k], splits=splits)
                   for k, label in zip(seeds, labels)]
    rows += config_rows
    runs[entry.name] = config_rows
    if args.seeds > 1:
      rows.append(seeds_row(config_rows, entry.name, splits))
  md_path, csv_path = write_table(rows, args.workdir, splits)
  with open(md_path, encoding="utf-8") as f:
    print(f.read())
  figure = plot_scores_against_time(runs, os.path.join(args.workdir, "scores_vs_time.png"),
                                    splits)
  print(f"wrote {md_path} and {csv_path}" + (f" and {figure}" if figure else ""))


# The command line and console script: user errors -> their message and exit status 2.
cli = cli_errors.command_line_entry(main)


if __name__ == "__main__":
  cli()
