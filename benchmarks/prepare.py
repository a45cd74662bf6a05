"""Data at scale: streaming preparation of an N-hour corpus, and the training input pipeline.

    python -m benchmarks.prepare --hours 1,10 --workers 2 --out docs/benchmarks/prepare.jsonl \
        [--corpus_dir /tmp/synthetic_mustc] [--keep]

For each size: builds a synthetic MuST-C-layout En-De corpus (30-minute talks of 10-second
segments; tones and noise at 16 kHz, 16-bit wav; short random sentences; a 10-minute dev talk), runs
`python -m data_prep.prepare` on it in a subprocess with `--workers`, and records the wall
time (and that of the features -> shards phase alone, which includes starting the workers),
seconds of audio prepared per second per worker, the peak RSS of the main process and of
the largest worker, and the bytes written. Then it times the input pipeline on the prepared
train split at the thesis's per-device batch (20 000 frames, utterance CMVN, SpecAugment):
frames/s assembled inline, and with 1 and `--workers` background workers, and from that how
many workers feed an update of 320k frames in 0.1 s (an H100's s2t_transformer_s update).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import soundfile

from benchmarks.report_format import command_line, load, machine_line, markdown_table, verdict
from benchmarks.common import Results, machine

TALK_SECONDS = 1800
SEGMENT_SECONDS = 10.0
RATE = 16000
WORDS = "the cat sat on a mat and then it ran to see the dog in the sun".split()
GERMAN = "der hund sah die katze auf der matte und dann lief sie in die sonne".split()
H100_UPDATE_S, THESIS_UPDATE_FRAMES = 0.1, 320_000

MEASURE = """
import json, resource, sys, time
from data_prep import prepare
write_index, marks = prepare.write_split_index, {{}}
def timed_write_index(*args, **kwargs):   # the features -> shards phase ends at the first
  marks.setdefault("shards_s", time.time() - start)
  return write_index(*args, **kwargs)
prepare.write_split_index = timed_write_index
start = time.time()
summary = prepare.prepare("mustc", {root!r}, ["en-de"], {out!r}, ["train", "dev"],
                          asr_vocab=1000, st_vocab=1000, workers={workers}, progress=False)
# VmHWM: the peak RSS of this process's own memory (ru_maxrss would count the parent's pages
# this process saw between fork and exec).
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({{"wall_s": time.time() - start, "shards_s": marks["shards_s"],
                   "main_peak_rss_mib": hwm / 1024,
                   "worker_peak_rss_mib":
                       resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                   "summary": summary}}))
"""


def write_corpus(root: str, hours: float, seed: int = 0) -> dict:
  """A MuST-C-layout corpus of `hours` of train audio and a 10-minute dev talk; returns its
  size."""
  rng = np.random.default_rng(seed)
  sizes = {}
  for split, seconds in (("train", hours * 3600), ("dev", 600)):
    base = os.path.join(root, "en-de", "data", split)
    os.makedirs(os.path.join(base, "wav"), exist_ok=True)
    os.makedirs(os.path.join(base, "txt"), exist_ok=True)
    yaml, en, de = [], [], []
    talks = max(1, int(round(seconds / TALK_SECONDS)))
    for talk in range(talks):
      length = min(TALK_SECONDS, seconds - talk * TALK_SECONDS) if talk < talks - 1 else \
          seconds - (talks - 1) * TALK_SECONDS
      t = np.arange(int(length * RATE)) / RATE
      audio = 0.2 * np.sin(2 * np.pi * rng.uniform(150, 400) * t) + \
          0.05 * rng.normal(size=t.size)
      name = f"{split}{talk}"
      soundfile.write(os.path.join(base, "wav", f"{name}.wav"), audio, RATE, subtype="PCM_16")
      for k in range(int(length // SEGMENT_SECONDS)):
        yaml.append(f"- {{duration: {SEGMENT_SECONDS}, offset: {k * SEGMENT_SECONDS}, "
                    f"speaker_id: spk_{name}, wav: {name}.wav}}\n")
        en.append(" ".join(rng.choice(WORDS, 8)) + "\n")
        de.append(" ".join(rng.choice(GERMAN, 8)) + "\n")
    for ext, lines in (("yaml", yaml), ("en", en), ("de", de)):
      with open(os.path.join(base, "txt", f"{split}.{ext}"), "w", encoding="utf-8") as f:
        f.writelines(lines)
    sizes[split] = {"talks": talks, "segments": len(yaml), "audio_s": seconds}
  return sizes


def directory_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
             for f in files)


def time_pipeline(prepared: str, workers: int, batches: int) -> dict:
  from multiformer_jax.data import input_pipeline as ip  # pylint: disable=import-outside-toplevel
  config = ip.PipelineConfig(prepared, stage="st", max_frames=20000, num_buckets=4, seed=1)
  batcher = ip.Batcher(ip.SplitData(config, "train"), True)
  with ip.TrainIterator(batcher, workers=workers, prefetch=2 * max(workers, 1)) as iterator:
    next(iterator)                                   # workers started, data source opened
    start, frames = time.perf_counter(), 0
    for _ in range(batches):
      batch = next(iterator)
      frames += int(batch["lengths"][batch["weights"] > 0].sum())
    seconds = time.perf_counter() - start
  return {"workers": workers, "batches": batches, "frames": frames, "seconds": seconds,
          "frames_per_s": frames / seconds}



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  """benchmarks/prepare.py: streaming preparation of a 1 h and a 10 h synthetic corpus."""
  meta, rows = load(directory, os.path.join("cpu", "prepare.jsonl"))
  runs = {r["hours"]: r for r in rows if r.get("kind") == "prepare"}
  if len(runs) < 2:
    return "", []
  small, large = runs[min(runs)], runs[max(runs)]
  table = markdown_table(
      ["corpus", "segments", "wall (s)", "audio s / s / worker", "main process peak (MiB)",
       "largest worker peak (MiB)", "written (MB)"],
      [[f"{r['hours']:g} h", r["segments"], r["wall_s"], r["audio_s_per_s_per_worker"],
        r["main_peak_rss_mib"], r["worker_peak_rss_mib"], round(r["prepared_bytes"] / 1e6)]
       for r in (small, large)])
  text = f"""## Preparation at scale

Machine: {machine_line(meta)}. Command: `{command_line(meta.get("command", ""))}`. Synthetic MuST-C
layout corpora (30-minute talks of 10-second segments, tones and noise at 16 kHz) prepared by
`data_prep.prepare` with {large["workers"]} workers; peak resident memory of the main process
(VmHWM) and of the largest worker.

{table}
"""
  targets = []
  for name, key in (("main process", "main_peak_rss_mib"), ("largest worker", "worker_peak_rss_mib")):
    growth = large[key] / small[key] - 1
    targets.append([f"prepare's {name}, {large['hours']:g} h corpus: peak within 10 % of the "
                    f"{small['hours']:g} h one's", f"{100 * growth:+.1f} % ({small[key]} -> "
                    f"{large[key]} MiB)", verdict(growth <= 0.10)])
  return text, targets


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--hours", default="1,10")
  parser.add_argument("--workers", type=int, default=os.cpu_count())
  parser.add_argument("--corpus_dir", default="/tmp/synthetic_mustc")
  parser.add_argument("--out", default="docs/benchmarks/prepare.jsonl")
  parser.add_argument("--pipeline_batches", type=int, default=30)
  parser.add_argument("--keep", action="store_true", help="keep the corpora and outputs")
  args = parser.parse_args(argv)
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for hours in [float(h) for h in args.hours.split(",")]:
    root = os.path.join(args.corpus_dir, f"{hours:g}h", "corpus")
    out = os.path.join(args.corpus_dir, f"{hours:g}h", "prepared")
    shutil.rmtree(os.path.dirname(root), ignore_errors=True)
    start = time.time()
    sizes = write_corpus(root, hours)
    build_s = time.time() - start
    code = MEASURE.format(repo=repo, root=root, out=out, workers=args.workers)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=repo)
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    audio_hours = (sizes["train"]["audio_s"] + sizes["dev"]["audio_s"]) / 3600
    row = {"kind": "prepare", "hours": hours, "audio_hours": round(audio_hours, 3),
           "segments": sizes["train"]["segments"] + sizes["dev"]["segments"],
           "corpus_build_s": round(build_s, 1), "workers": args.workers,
           "wall_s": round(measured["wall_s"], 1),
           "shards_s": round(measured["shards_s"], 1),
           "audio_s_per_s_per_worker": round(audio_hours * 3600 / measured["wall_s"] /
                                             args.workers, 1),
           "shards_audio_s_per_s_per_worker": round(
               audio_hours * 3600 / measured["shards_s"] / args.workers, 1),
           "main_peak_rss_mib": round(measured["main_peak_rss_mib"], 1),
           "worker_peak_rss_mib": round(measured["worker_peak_rss_mib"], 1),
           "prepared_bytes": directory_bytes(out), "wav_bytes": directory_bytes(root),
           "shards": measured["summary"]["shards"]}
    results.add(**row)
    for workers in sorted({0, 1, args.workers}):
      timing = time_pipeline(out, workers, args.pipeline_batches)
      per_worker = timing["frames_per_s"] / max(workers, 1)
      needed = THESIS_UPDATE_FRAMES / H100_UPDATE_S
      results.add(kind="pipeline", hours=hours, max_frames=20000, **timing,
                  frames_per_s_per_worker=round(per_worker),
                  workers_for_h100_update=round(needed / per_worker, 1))
    if not args.keep:
      shutil.rmtree(os.path.dirname(root), ignore_errors=True)


if __name__ == "__main__":
  main()
