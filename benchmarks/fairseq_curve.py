"""Our trainer against fairseq 0.12.2's on a few hundred batches of the embedded corpus: the two
loss curves in one figure (docs/fairseq.md), and where they part.

    python -m benchmarks.fairseq_curve --prepared runs/quickstart/prepared \
        --fairseq_python /tmp/fsenv/bin/python --out_dir docs/fairseq

1. Writes the ASR training batches our pipeline assembles from the prepared corpus (utterance
   CMVN, no SpecAugment, padding rows dropped, each batch cropped to a multiple of 64 frames)
   to --work_dir.
2. fairseq trains on them (benchmarks/fairseq_curve_reference.py, in its own environment) from
   its random initialisation: a tiny s2t_transformer, fp32, dropout 0, one batch per update.
3. We train from fairseq's initial weights on the same batches twice: with fairseq's
   subsampler (model.subsampler_masks_padding=False, the same function) and with ours (padding
   zeroed between the convolutions, the default).
Writes curve.jsonl (per update: each run's loss per target token and gradient norm) and
curve.png, and prints the first update where the runs differ by 1e-5, 1e-4, 1e-3 and 1e-2
relatively.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from multiformer_jax.data import input_pipeline as ip
from tests import test_fairseq_training as parity

HERE = os.path.dirname(os.path.abspath(__file__))
THRESHOLDS = (1e-5, 1e-4, 1e-3, 1e-2)
CROP = 64
RECIPE = {"lr": 2e-3, "warmup_updates": 100, "clip_norm": 10.0}   # both trainers


def write_batches(prepared: str, updates: int, max_frames: int, path: str) -> int:
  config = ip.PipelineConfig(prepared, stage="asr", max_frames=max_frames, num_buckets=4,
                             cmvn="utterance", specaugment=False, seed=1)
  batcher = ip.Batcher(ip.SplitData(config, "train"), True)
  out = {"count": updates, "vocab": ip.stage_vocabulary(prepared, "asr").size}
  with ip.TrainIterator(batcher) as iterator:
    for i in range(updates):
      batch = next(iterator)
      rows = np.asarray(batch["weights"]) > 0
      # fairseq takes a batch as long as its longest utterance; cropping every batch to a
      # multiple of CROP frames (the same for both trainers) keeps our compiled shapes few.
      lengths = np.asarray(batch["lengths"])[rows]
      frames = max(lengths.max() // CROP * CROP, min(CROP, lengths.max()))
      out.update({f"batch_{i}/features": np.asarray(batch["features"])[rows, :frames],
                  f"batch_{i}/lengths": np.minimum(lengths, frames).astype(np.int64),
                  f"batch_{i}/target": np.asarray(batch["targets"])[rows].astype(np.int64),
                  f"batch_{i}/prev": np.asarray(batch["prev_tokens"])[rows].astype(np.int64)})
  np.savez(path, **out)
  return out["vocab"]


def ours(reference: dict, batches: list, masks_padding: bool) -> dict:
  train_step, dp, state, _ = parity.our_trainer(
      parity.state_dict(reference, "init/"), json.loads(str(reference["model_args"])),
      masks_padding, lr=RECIPE["lr"], warmup=RECIPE["warmup_updates"],
      clip_norm=RECIPE["clip_norm"], betas=(0.9, 0.999), eps=1e-8, label_smoothing=0.1)
  start = time.time()
  rows, _ = parity.run_updates(train_step, dp, state, batches, [[i] for i in range(len(batches))],
                               keep=False)
  rows["seconds"] = time.time() - start
  return rows


def plot(per_token: dict, path: str):
  """Each run's loss per target token, and each of ours' relative difference from fairseq's,
  one colour per run in both panels."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                    gridspec_kw={"height_ratios": [2, 1]})
  names = list(per_token)
  updates = np.arange(1, len(per_token[names[0]]) + 1)
  for k, (name, style) in enumerate(zip(names, ("-", "--", ":"))):
    top.plot(updates, per_token[name], style, color=f"C{k}", label=name)
  top.set_ylabel("training loss per target token")
  top.legend()
  for k, name in enumerate(names[1:], start=1):
    bottom.semilogy(updates, np.abs(per_token[name] - per_token[names[0]]) /
                    per_token[names[0]] + 1e-9, color=f"C{k}", label=name)
  bottom.set_ylabel(f"|ours - {names[0]}| / {names[0]}")
  bottom.set_xlabel("update")
  bottom.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=90)


def read_curves(path: str) -> dict:
  """curve.jsonl -> {run: loss per target token per update}."""
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f][1:]
  names = [k for k in rows[0] if k != "update"]
  return {name: np.array([r[name]["loss_per_token"] for r in rows]) for name in names}


def first_above(a, b, threshold):
  relative = np.abs(a - b) / np.abs(b)
  above = np.nonzero(relative > threshold)[0]
  return int(above[0]) + 1 if len(above) else None


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--prepared", help="a prepared corpus (the main job's)")
  parser.add_argument("--fairseq_python")
  parser.add_argument("--updates", type=int, default=300)
  parser.add_argument("--max_frames", type=int, default=6000)
  parser.add_argument("--work_dir", default="/tmp/fairseq_curve")
  parser.add_argument("--out_dir", default="docs/fairseq")
  parser.add_argument("--plot_only", action="store_true",
                      help="redraw curve.png from the curve.jsonl in --out_dir")
  args = parser.parse_args()
  if args.plot_only:
    plot(read_curves(os.path.join(args.out_dir, "curve.jsonl")),
         os.path.join(args.out_dir, "curve.png"))
    return
  os.makedirs(args.work_dir, exist_ok=True)
  os.makedirs(args.out_dir, exist_ok=True)
  batches_path = os.path.join(args.work_dir, "batches.npz")
  reference_path = os.path.join(args.work_dir, "fairseq.npz")
  vocab = write_batches(args.prepared, args.updates, args.max_frames, batches_path)
  subprocess.run([args.fairseq_python, "-m", "benchmarks.fairseq_curve_reference",
                  "--batches", batches_path, "--out", reference_path,
                  *(f"--{k}={v}" for k, v in RECIPE.items())], check=True,
                 cwd=os.path.dirname(HERE))
  reference = dict(np.load(reference_path))
  data = np.load(batches_path)
  batches = [parity.our_batch({k: data[f"batch_{i}/{k}"]
                               for k in ("features", "lengths", "target", "prev")})
             for i in range(args.updates)]
  runs = {"fairseq": {k: reference[f"curve/{k}"] for k in ("loss", "sample_size", "grad_norm")},
          "ours, fairseq's subsampler": ours(reference, batches, masks_padding=False),
          "ours (default)": ours(reference, batches, masks_padding=True)}
  per_token = {name: run["loss"] / run["sample_size"] for name, run in runs.items()}
  with open(os.path.join(args.out_dir, "curve.jsonl"), "w", encoding="utf-8") as f:
    f.write(json.dumps({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                        "updates": args.updates, "max_frames": args.max_frames, "vocab": vocab,
                        "fairseq_seconds": round(float(reference["seconds"]), 1),
                        **{f"{name} seconds": round(run["seconds"], 1)
                           for name, run in runs.items() if "seconds" in run}}) + "\n")
    for u in range(args.updates):
      f.write(json.dumps({"update": u + 1, **{
          name: {"loss_per_token": round(float(per_token[name][u]), 7),
                 "grad_norm": round(float(run["grad_norm"][u]), 7)}
          for name, run in runs.items()}}) + "\n")
  for name in list(runs)[1:]:
    parts = {t: first_above(per_token[name], per_token["fairseq"], t) for t in THRESHOLDS}
    print(f"{name} against fairseq: first update with a relative loss difference above "
          + ", ".join(f"{t:g}: {parts[t]}" for t in THRESHOLDS)
          + f"; last loss/token {per_token[name][-1]:.4f} against {per_token['fairseq'][-1]:.4f}")
  plot(per_token, os.path.join(args.out_dir, "curve.png"))
  print(f"wrote {args.out_dir}/curve.jsonl and curve.png")


if __name__ == "__main__":
  main()
