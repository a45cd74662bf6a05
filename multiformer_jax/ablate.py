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
import os
import re
import shutil
import subprocess
import sys

from multiformer_common.errors import InvalidValue, MissingInput
from multiformer_jax.evaluation import results
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.runtime import process_setup
from multiformer_jax.training import results_table

WINDOWS_ENTRY = re.compile(r"windows\((\w+)\)$")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_COMMAND = ("-m", "multiformer_jax.train")


def command_env(env=None) -> dict:
  """`env` (default: this process's) with this package first on PYTHONPATH."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
  return env


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
      raise InvalidValue(f"--configs entry {item!r}: expected FILE.py, FILE.py:VARIANT or "
                       f"windows(NAME)")
    entries.append(Entry(variant or run_name(path), path, variant))
  names = [e.name for e in entries]
  for e in entries:
    if names.count(e.name) > 1:
      raise InvalidValue(f"--configs: two entries run as {e.name!r}; give them other variants")
    if e.windows_from and e.windows_from not in names[:names.index(e.name)]:
      raise InvalidValue(f"--configs entry windows({e.windows_from}): no entry before it runs as "
                       f"{e.windows_from!r}; valid: {names[:names.index(e.name)]}")
  return entries


def run_name(config_path: str) -> str:
  return os.path.splitext(os.path.basename(config_path))[0]




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


def cpu_shares(jobs: int) -> list[list[int]]:
  """This process's CPUs split into `jobs` contiguous shares (at least one CPU each)."""
  cpus = sorted(os.sched_getaffinity(0))
  if jobs > len(cpus):
    raise InvalidValue(f"--jobs {jobs}: this process may use {len(cpus)} CPUs; give at most "
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
      raise MissingInput(f"windows: run {source} has no finished ST stage to analyse")
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
    config_rows = [results_table.collect_row(run_dir(entry.name, k), label, status[k],
                                             splits=splits)
                   for k, label in zip(seeds, labels)]
    rows += config_rows
    runs[entry.name] = config_rows
    if args.seeds > 1:
      rows.append(results_table.seeds_row(config_rows, entry.name, splits))
  md_path, csv_path = results_table.write_table(rows, args.workdir, splits)
  with open(md_path, encoding="utf-8") as f:
    print(f.read())
  figure = results_table.plot_scores_against_time(
      runs, os.path.join(args.workdir, "scores_vs_time.png"), splits)
  print(f"wrote {md_path} and {csv_path}" + (f" and {figure}" if figure else ""))


cli = process_setup.command(main)


if __name__ == "__main__":
  cli()
