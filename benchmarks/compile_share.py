"""The share of each training stage's wall time spent compiling, with the persistent compilation
cache cold and then warm:

    python -m benchmarks.compile_share --config configs/quickstart.py \
        --out docs/benchmarks/compile_share.jsonl [--workdir /tmp/compile_share] [-- overrides]

Runs `run.py --config=CONFIG` twice, both with `train.compilation_cache` set to an empty folder
under --workdir: first into `cold/` (every step compiles), then into `warm/` (the same command
with the cache the first run filled: XLA's executables are read from disk). Arguments after
`--` go to both runs (e.g. `--config.asr.max_updates=100`). The data folders are the config's,
so a prepared corpus is reused. Each stage's DONE.json says its wall time in the training loop
and the seconds of it spent compiling (runtime/compile_clock.py: tracing, lowering and XLA's
compile or cache read, from JAX's monitoring events); one JSON line per (cache, stage).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from benchmarks.report_format import command_line, load, machine_line, markdown_table, verdict
from benchmarks.common import Results, machine



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  meta, rows = load(directory, "compile_share.jsonl")
  if not rows:
    return "", []
  table = markdown_table(["compilation cache", "stage", "updates", "training loop s", "compiling s",
                  "share"],
                 [[r["cache"], r["stage"], r["updates"], r["wall_s"], r["compile_s"],
                   f"{100 * r['compile_fraction']:.1f}%"] for r in rows])
  note = f" Note: {meta['note']}." if meta.get("note") else ""
  limits = {"cold": 0.25, "warm": 0.10}
  targets = [[f"{meta['config']} {r['stage']} stage, compilation cache {r['cache']}: <= "
              f"{100 * limits[r['cache']]:.0f}% of its wall time compiling",
              f"{100 * r['compile_fraction']:.1f}% ({r['compile_s']} of {r['wall_s']} s)",
              verdict(r["compile_fraction"] <= limits[r["cache"]])] for r in rows]
  text = f"""## Compiling: the share of each stage's time

Machine: {machine_line(meta)}. Command: `{command_line(meta['command'])}`: the main job's command of the
date above (an older recipe than today's: the updates in the table) twice with an empty
persistent compilation cache, the second run reading what the first wrote. Seconds of
each stage's training loop (updates, dev loss, dev WER / BLEU decoding, checkpoints) and of
those the seconds in tracing, lowering and XLA's compile or cache read (JAX's monitoring
events; `compile_s` in the stage's DONE.json).{note}

{table}
"""
  return text, targets


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  passed = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--out", default="docs/benchmarks/compile_share.jsonl")
  parser.add_argument("--workdir", default="/tmp/compile_share",
                      help="holds the cache and both runs; emptied first")
  args = parser.parse_args(own)
  shutil.rmtree(args.workdir, ignore_errors=True)
  cache = os.path.join(args.workdir, "cache")
  os.makedirs(cache)
  results = Results(args.out, {**machine(), "config": args.config, "overrides": passed,
                               "command": " ".join(sys.argv)})
  for label in ("cold", "warm"):
    workdir = os.path.join(args.workdir, label)
    started = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), f"--config={args.config}",
                    f"--workdir={workdir}", f"--config.train.compilation_cache={cache}",
                    *passed], check=True, cwd=ROOT)
    command_s = time.perf_counter() - started
    for stage in sorted(os.listdir(workdir)):
      done = os.path.join(workdir, stage, "DONE.json")
      if os.path.exists(done):
        with open(done, encoding="utf-8") as f:
          summary = json.load(f)
        results.add(cache=label, stage=stage, command_s=round(command_s, 1),
                    **{k: summary[k] for k in ("updates", "wall_s", "compile_s",
                                               "compile_fraction", "compile_phases_s")
                       if k in summary})


if __name__ == "__main__":
  main()
