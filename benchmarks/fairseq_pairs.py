"""Our s2t_transformer_s update against fairseq's, in alternating runs (ABBA order), so that a
machine whose speed drifts over minutes biases neither side:

    python -m benchmarks.fairseq_pairs --rounds 6 --fairseq_python /tmp/fsenv/bin/python \
        --out_dir docs/benchmarks/cpu/pairs

Round i runs benchmarks/train_step.py (s2t_transformer_s only) and
benchmarks/fairseq_train_step.py one after the other, ours first in rounds 0, 3, 4, 7, ...
and fairseq first in rounds 1, 2, 5, 6, ...; each writes its own JSON lines under --out_dir.
The ratio of a round is fairseq's seconds per update over ours; `summary.json` holds every
round and the median. fairseq runs on glibc's default malloc (set --fairseq_env to change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.report_format import command_line, verdict
from benchmarks.common import read_results


def seconds_per_update(path: str) -> float:
  """The last measured row's seconds (train_step.py writes a meta line first, fairseq's script
  one row)."""
  measured = [row for row in read_results(path)[1] if "seconds" in row]
  if not measured:
    raise SystemExit(f"{path} holds no measurement; see its run's output above")
  return measured[-1]["seconds"]


def check_pairs_args(rounds: int, python: str, flag: str):
  """Refuses a run that cannot alternate: no rounds, or no peer interpreter at `python`."""
  if rounds < 1:
    raise SystemExit(f"--rounds={rounds}; give 1 or more")
  if not os.access(python, os.X_OK):
    raise SystemExit(f"--{flag}={python!r} is not an executable")


def ours_first(round_index: int) -> bool:
  """ABBA: ours first in rounds 0, 3, 4, 7, 8, ..."""
  return round_index % 4 in (0, 3)



# The report's section of this benchmark (benchmarks/report.py assembles them).
FAIRSEQ_PAIRS_SUMMARY = os.path.join("cpu", "2026-11-24-abba", "summary.json")


def report_targets(directory) -> list:
  """The Targets row against fairseq: one alternating run of benchmarks/fairseq_pairs.py."""
  path = os.path.join(directory, FAIRSEQ_PAIRS_SUMMARY)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  allocator = summary.get("fairseq_env") or "glibc's default malloc"
  return [["s2t_transformer_s update vs fairseq 0.12.2: >= 1.2x faster",
           f"{summary['median_ratio']:.2f}x (median of {len(summary['rounds'])} ABBA rounds, "
           f"{summary['min_ratio']:.2f}-{summary['max_ratio']:.2f}x; ours on huge pages, fairseq "
           f"on {allocator}, its faster allocator in the single runs below; "
           f"`{command_line(summary['command'])}`)", verdict(summary["median_ratio"] >= 1.2)]]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--out_dir", required=True)
  parser.add_argument("--fairseq_python", required=True,
                      help="a Python with torch and fairseq 0.12.2 (docs/notes/benchmarks-lab-notebook.md)")
  parser.add_argument("--fairseq_env", default="",
                      help="extra environment for fairseq, e.g. GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args(argv)
  check_pairs_args(args.rounds, args.fairseq_python, "fairseq_python")
  os.makedirs(args.out_dir, exist_ok=True)
  fairseq_env = dict(os.environ)
  for item in filter(None, args.fairseq_env.split()):
    key, _, value = item.partition("=")
    fairseq_env[key] = value
  rounds = []
  for i in range(args.rounds):
    ours_path = os.path.join(args.out_dir, f"ours_{i}.jsonl")
    fairseq_path = os.path.join(args.out_dir, f"fairseq_{i}.jsonl")
    ours = ([sys.executable, os.path.join(HERE, "train_step.py"), "--configs",
             "s2t_transformer_s", "--memory_configs", "", "--steps", str(args.steps),
             "--out", ours_path], {**os.environ, "MULTIFORMER_TCMALLOC": "0"})  # glibc, as fairseq
    fairseq = ([args.fairseq_python, os.path.join(HERE, "fairseq_train_step.py"), "--steps",
                str(args.steps), "--out", fairseq_path], fairseq_env)
    for command, env in (ours, fairseq) if ours_first(i) else (fairseq, ours):
      subprocess.run(command, env=env, check=True)
    ours_s, fairseq_s = seconds_per_update(ours_path), seconds_per_update(fairseq_path)
    rounds.append({"round": i, "ours_first": ours_first(i), "ours_s": ours_s,
                   "fairseq_s": fairseq_s, "ratio": round(fairseq_s / ours_s, 4)})
    print(json.dumps(rounds[-1]), flush=True)
  ratios = [r["ratio"] for r in rounds]
  summary = {"rounds": rounds, "median_ratio": statistics.median(ratios),
             "min_ratio": min(ratios), "max_ratio": max(ratios),
             "command": " ".join(sys.argv), "fairseq_env": args.fairseq_env}
  with open(os.path.join(args.out_dir, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps({k: summary[k] for k in ("median_ratio", "min_ratio", "max_ratio")}))


if __name__ == "__main__":
  main()
