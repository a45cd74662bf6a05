"""Paper configs trained end to end by run.py on a MuST-C-sized synthetic corpus: seconds per
update against the isolated update, the time the loop waited for data, compile count and time.

    python -m benchmarks.end_to_end --configs s2t_transformer_s,s2t_v2 --updates 120 \
        --gb 20 --out docs/benchmarks/gpu/end_to_end.jsonl [--corpus_dir /tmp/mustc_like]

Writes the synthetic prepared corpus of benchmarks/input_pipeline.py (features written
directly, MuST-C En-De-like lengths; a 100-piece vocabulary where the papers' has 8000,
about 2 % of an update's FLOPs less), then per config runs `run.py` (ASR stage only, no dev
evaluation, the config's own update: 320k frames, its dtype, its loader workers) for
`--updates` updates, and reads its log.jsonl: the steady seconds per update (the updates after
the first `--skip`), the data-wait fraction, and from the stage log the programs compiled and
the seconds spent compiling them. `--isolated` adds benchmarks/train_step.py's isolated update
of the same config at 320 x 1000 frames (the same padded frames per update) in the same call,
and the matmul peak (bf16, 8192) beside it. `--frames_per_update` and `--max_frames` shrink the
update for a dry run on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from benchmarks.common import Results, machine
from benchmarks.input_pipeline import write_corpus

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(config: str, corpus: str, workdir: str, updates: int, overrides: list[str]) -> dict:
  """run.py on `config` for `updates` ASR updates; -> its timing figures."""
  command = [sys.executable, "run.py", f"--config=configs/{config}.py", f"--workdir={workdir}",
             f"--config.data.prepared_dir={corpus}", "--config.train.stages=('asr',)",
             f"--config.asr.max_updates={updates}", "--config.asr.eval_every=1000000",
             "--config.train.log_every=10", "--config.eval.after_training=False", *overrides]
  start = time.time()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
  with open(os.path.join(workdir, "asr", "log.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  compiled = re.search(r"(\d+) programs compiled in (\d+) s", result.stderr)
  with open(os.path.join(workdir, "asr", "DONE.json"), encoding="utf-8") as f:
    summary = json.load(f)
  return {"rows": [r for r in rows if "data_wait_s" in r], "wall_s": time.time() - start,
          "programs": int(compiled.group(1)) if compiled else None,
          "programs_compile_s": int(compiled.group(2)) if compiled else None,
          "compile_s": summary.get("compile_s"), "loop_wall_s": summary.get("wall_s"),
          "log_tail": result.stderr[-1500:]}


def steady(rows: list[dict], skip: int) -> dict:
  """Seconds per update and the data-wait share over the log rows after update `skip`."""
  later = [r for r in rows if r.get("step", 0) > skip]
  if len(later) < 2:
    return {}
  # Each row covers the updates since the one before it: step_time_s each.
  elapsed = sum(r["step_time_s"] * (r["step"] - before["step"])
                for before, r in zip(later, later[1:]))
  updates = later[-1]["step"] - later[0]["step"]
  waited = sum(r["data_wait_s"] for r in later[1:])
  return {"updates_timed": updates, "s_per_update": round(elapsed / max(updates, 1), 4),
          "data_wait_fraction": round(waited / max(elapsed, 1e-9), 4)}


def isolated(config: str, out: str, dtype: str) -> dict:
  """benchmarks/train_step.py's isolated update of `config` at 320 x 1000 frames."""
  command = [sys.executable, "-m", "benchmarks.train_step", "--out", out, "--configs", config,
             "--dtype", dtype, "--batch", "320", "--frames", "1000", "--tokens", "50",
             "--steps", "10", "--peak_size", "8192", "--memory_configs="]
  subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
  with open(out, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return next((r for r in reversed(rows) if r.get("config") == config), {})


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default="s2t_transformer_s,s2t_v2")
  parser.add_argument("--updates", type=int, default=120)
  parser.add_argument("--skip", type=int, default=20, help="updates not timed (warm-up)")
  parser.add_argument("--gb", type=float, default=20.0)
  parser.add_argument("--corpus_dir", default="/tmp/mustc_like")
  parser.add_argument("--workdir", default="/tmp/end_to_end")
  parser.add_argument("--out", default="docs/benchmarks/gpu/end_to_end.jsonl")
  parser.add_argument("--frames_per_update", type=int, default=0, help="0: the config's")
  parser.add_argument("--max_frames", type=int, default=0, help="0: the config's")
  parser.add_argument("--isolated", action="store_true")
  parser.add_argument("--dtype", default="bfloat16", help="of the isolated update")
  args = parser.parse_args(argv)
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
  if not os.path.exists(os.path.join(args.corpus_dir, "prepared.json")):
    start = time.time()
    sizes = write_corpus(args.corpus_dir, args.gb)
    results.add(kind="corpus", **sizes["train"], write_s=round(time.time() - start, 1))
  overrides = ([f"--config.data.frames_per_update={args.frames_per_update}"]
               if args.frames_per_update else []) + (
                   [f"--config.data.max_frames={args.max_frames}"] if args.max_frames else [])
  for config in args.configs.split(","):
    run = train(config, args.corpus_dir, os.path.join(args.workdir, config), args.updates,
                overrides)
    row = {"kind": "end_to_end", "config": config, **steady(run["rows"], args.skip),
           **{k: v for k, v in run.items() if k not in ("rows", "log_tail")}}
    if args.isolated:
      alone = isolated(config, os.path.join(args.workdir, f"{config}_isolated.jsonl"),
                       args.dtype)
      row["isolated"] = alone
    results.add(**row)
    print(run["log_tail"], file=sys.stderr)


if __name__ == "__main__":
  main()
