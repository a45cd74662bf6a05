"""The share of each training stage's wall time spent compiling, with the persistent compilation
cache cold and then warm:

    python benchmarks/compile_share.py --config configs/quickstart.py \
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
sys.path.insert(0, ROOT)
from benchmarks.common import Results, machine  # noqa: E402


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
