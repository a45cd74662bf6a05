"""The training input pipeline at MuST-C's size: frames/s against a plain copy of the same bytes.

    python -m benchmarks.input_pipeline --gb 24 --workers 0,1,2 \
        --out docs/benchmarks/input_pipeline.jsonl [--corpus_dir /tmp/mustc_like] [--keep]

Writes a synthetic prepared corpus of `--gb` GB of features directly (no audio): utterance
lengths drawn like MuST-C En-De's train split (log-normal, mean about 640 frames, long tail
cut at 3000, as preparation cuts it) and target lengths of about 25 pieces per 640 frames
with a long tail of their own (made-up words, one piece each); features from a random block, so that reading them costs
what reading real ones does. Then, at the thesis's update (320k padded frames per batch,
utterance CMVN, SpecAugment "lb"):
- `copy`: the ceiling: the same utterances' bytes copied from the mapped files into one
  preallocated batch, nothing else (numpy copyto, one core, page cache hot);
- `pipeline` rows for each `--workers` count (0: inline in the main process): real frames/s
  of the whole loader and per worker core, the main process's CPU time and wall time per
  batch (with workers: what it spends to receive a batch), with the page cache hot (the same
  batches read once before) and cold (the kernel's caches dropped first, where the machine
  lets this process do it; else the row says why not);
- `padding`: over a whole epoch's plan, the share of padded source frames and of padded
  target tokens, with 8 source buckets each split by target length into 1-8
  (data.num_token_buckets).
The matmul peak of the same run says which machine it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

from benchmarks.report_format import command_line, load, machine_line, markdown_table, verdict
from benchmarks.common import Results, machine, matmul_peak
from data_prep import feature_store, index_io, vocab
from multiformer_jax.data import input_pipeline as ip

# 60 made-up words, each one SentencePiece piece: a target's pieces are its words.
WORDS = ["".join(chr(97 + int(c)) for c in np.random.default_rng(k).integers(0, 26, 5))
         for k in range(60)]
SHARD_FRAMES = 1_000_000
BYTES_PER_FRAME = 80 * 4


def mustc_like_lengths(count: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """(source frames, target pieces) of `count` utterances, MuST-C En-De-like: frames
  log-normal (median 560, mean about 640), 5..3000; pieces 25 per 640 frames, log-normal
  noise of sigma 0.35 (an assumption: speaking rate and translation length vary), >= 1."""
  frames = np.exp(rng.normal(np.log(560), 0.62, size=count))
  frames = np.clip(frames, 5, 3000).astype(np.int64)
  pieces = frames / 640 * 25 * np.exp(rng.normal(-0.06, 0.35, size=count))
  return frames, np.maximum(np.round(pieces), 1).astype(np.int64)


def write_corpus(out: str, gigabytes: float, seed: int = 0, features: bool = True) -> dict:
  """A prepared corpus (current format) of about `gigabytes` of train features and a small
  dev split; -> its sizes. Without `features` only its index (the same lengths): enough to
  plan batches, not to read them."""
  rng = np.random.default_rng(seed)
  block = rng.normal(size=(1 << 20, 80)).astype(np.float32) * 4 + 10      # 320 MB
  os.makedirs(os.path.join(out, "index"), exist_ok=True)
  sizes, files = {}, {}
  text_for_vocab = [" ".join(rng.choice(WORDS, 20)) for _ in range(5000)]
  for split, target_bytes in (("train", gigabytes * 1e9), ("dev", 0.05e9)):
    count = int(target_bytes / BYTES_PER_FRAME / 640)
    frames, pieces = mustc_like_lengths(count, rng)
    shard_of = np.cumsum(frames) // SHARD_FRAMES
    num_shards = int(shard_of[-1]) + 1
    files[split] = feature_store.relative_files(out, split, num_shards)
    offsets = np.zeros(count, np.int64)
    start = 0
    for shard in range(num_shards):
      rows = np.flatnonzero(shard_of == shard)
      if not features:
        offsets[rows] = np.cumsum(frames[rows]) - frames[rows]
        continue
      with feature_store.ShardWriter(os.path.join(out, files[split][shard]), 80) as writer:
        for i in rows:
          at = int(rng.integers(0, len(block) - frames[i]))
          offsets[i] = writer.write(block[at:at + frames[i]])
      start += len(rows)
    texts = [" ".join(rng.choice(WORDS, int(p))) for p in pieces]
    index_io.save(os.path.join(out, "index", f"{split}.npz"), {
        "id": [f"{split}_{i}" for i in range(count)], "talk": ["t"] * count,
        "speaker": ["s"] * count, "source_text": texts, "target_text": texts,
        "source_lang": ["en"] * count, "target_lang": ["de"] * count,
        "domain": ["synthetic"] * count, "n_frames": frames,
        "feature_file": shard_of.astype(np.int32), "feature_offset": offsets})
    sizes[split] = {"utterances": count, "frames": int(frames.sum()),
                    "bytes": int(frames.sum()) * BYTES_PER_FRAME, "shards": num_shards}
  model = vocab.train_sentencepiece(text_for_vocab, os.path.join(out, "spm"), 100)
  entry = {"model": os.path.basename(model), "size": vocab.Vocabulary(model).size}
  summary = {"corpus": "synthetic", "pairs": ["en-de"], "splits": {
      s: v["utterances"] for s, v in sizes.items()}, "vocab": {"asr": entry, "st": entry},
      "features": feature_store.FORMAT, "feature_dim": 80, "feature_files": files,
      "gcmvn": None}
  with open(os.path.join(out, "prepared.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f)
  return sizes


def real_frames(batch) -> int:
  return int(batch["lengths"][batch["weights"] > 0].sum())


def padding(batcher: ip.Batcher) -> dict:
  """Padded shares of source frames and target tokens over epoch 0's plan."""
  data = batcher.data
  token_lens = data.tokens.lengths + 1
  frames = tokens = padded_frames = padded_tokens = 0
  for b, indices in batcher.epoch_plan(0):
    real = indices[indices >= 0]
    bucket = batcher.buckets[b]
    frames += int(data.n_frames[real].sum())
    tokens += int(token_lens[real].sum())
    padded_frames += bucket.frames * len(indices)
    padded_tokens += bucket.tokens * len(indices)
  return {"padded_frames_share": round(1 - frames / padded_frames, 4),
          "padded_tokens_share": round(1 - tokens / padded_tokens, 4),
          "batches": len(batcher.epoch_plan(0)), "shapes": batcher.shapes}


def drop_caches() -> str:
  """'' if the kernel's page cache was dropped, else why not."""
  try:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
      f.write("3\n")
    return ""
  except OSError as e:
    return f"cannot drop the page cache here ({e.strerror})"


def time_copy(batcher: ip.Batcher, plan, batches: int) -> dict:
  """The ceiling: each batch's utterances copied from the mapped files into one buffer, timed
  on the second pass (the first brings the pages into the cache and this process's map)."""
  data = batcher.data
  buffer = np.empty((max(b.batch_size for b in batcher.buckets),
                     max(b.frames for b in batcher.buckets), 80), np.float32)
  for timed in (False, True):
    frames, start = 0, time.perf_counter()
    for b, indices in plan[:batches]:
      for row, i in enumerate(indices[indices >= 0]):
        source = data.fbank(i)
        np.copyto(buffer[row, :len(source)], source)
        frames += len(source)
  seconds = time.perf_counter() - start
  return {"frames": frames, "seconds": round(seconds, 3), "frames_per_s": round(frames / seconds)}


def time_loader(batcher: ip.Batcher, workers: int, start: int, batches: int) -> dict:
  iterator = ip.TrainIterator(batcher, 0, start, workers=workers)
  with iterator:
    next(iterator)                        # workers started, files mapped
    frames, wall, cpu = 0, time.perf_counter(), time.process_time()
    main_wall = 0.0
    for _ in range(batches):
      t = time.perf_counter()
      batch = next(iterator)
      main_wall += time.perf_counter() - t
      frames += real_frames(batch)
      del batch
    seconds = time.perf_counter() - wall
    cpu = time.process_time() - cpu
  cores = max(workers, 1)
  return {"workers": workers, "batches": batches, "frames": frames,
          "seconds": round(seconds, 3), "frames_per_s": round(frames / seconds),
          "frames_per_s_per_worker_core": round(frames / seconds / cores),
          "main_cpu_s_per_batch": round(cpu / batches, 5),
          "main_wall_s_per_batch": round(main_wall / batches, 5)}



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  """benchmarks/input_pipeline.py: the loader on a MuST-C-sized synthetic corpus."""
  meta, rows = load(directory, os.path.join("cpu", "input_pipeline.jsonl"))
  loads = [r for r in rows if r.get("kind") == "pipeline" and "frames_per_s" in r]
  if not loads:
    return "", [], ""
  corpus = next(r for r in rows if r.get("kind") == "corpus")
  copies = [r for r in rows if r.get("kind") == "copy"]
  peak = next((r for r in rows if r.get("kind") == "peak"), {})
  pads = [r for r in rows if r.get("kind") == "padding"]
  pad_meta, pad_rows = load(directory, os.path.join("cpu", "input_pipeline_padding.jsonl"))
  if pad_rows:                      # a later --padding_only run of the same lengths
    pads = [r for r in pad_rows if r.get("kind") == "padding"]
  pad_source = (f"Command: `{command_line(pad_meta.get('command', ''))}` "
                f"({pad_meta.get('date', '')}; the same lengths, an index only)."
                if pad_rows else "")
  table = markdown_table(
      ["page cache", "workers", "frames/s", "per worker core", "main process CPU per batch "
       "(ms)", "main process wait per batch (ms)"],
      [[r["cache"], r["workers"] or "0 (inline)", f"{r['frames_per_s'] / 1e6:.2f} M",
        f"{r['frames_per_s_per_worker_core'] / 1e6:.2f} M",
        f"{1000 * r['main_cpu_s_per_batch']:.2f}", f"{1000 * r['main_wall_s_per_batch']:.1f}"]
       for r in loads])
  pad_table = markdown_table(["token buckets per source bucket", "shapes", "padded frames",
                      "padded target tokens"],
                     [[r["num_token_buckets"], len(r["shapes"]),
                       f"{100 * r['padded_frames_share']:.1f} %",
                       f"{100 * r['padded_tokens_share']:.1f} %"] for r in pads])
  ceiling = min(c["frames_per_s"] for c in copies)
  detail = f"""## The input pipeline at MuST-C's size

Machine: {machine_line(meta)}, matmul peak {meta.get("matmul_peak_gflops_before")} GFLOP/s before
and {peak.get("matmul_peak_gflops_after")} after. Command: `{command_line(meta.get("command", ""))}`. A
synthetic prepared corpus of {corpus["bytes"] / 1e9:.1f} GB of features ({corpus["utterances"]:,}
utterances, MuST-C En-De-like lengths: benchmarks/input_pipeline.py), read at the thesis's
batch ({meta.get("max_frames"):,} padded frames, utterance CMVN, SpecAugment lb). Real frames
per second over {loads[0]["batches"]} batches; the hot rows read batches read just before,
the cold ones batches after the kernel's page cache was dropped. A plain copy of the same
bytes from the mapped files (page cache hot) read {ceiling / 1e6:.1f}-
{max(c["frames_per_s"] for c in copies) / 1e6:.1f} M frames/s in the same run.

{table}

Padding over a whole epoch's plan, 8 source buckets (a split bucket's batches balanced).
{pad_source}

{pad_table}
"""
  hot = [r for r in loads if r["cache"] == "hot"]
  workers = [r for r in hot if r["workers"] > 0]
  per_core = min(r["frames_per_s_per_worker_core"] for r in hot)
  main_cpu = max(r["main_cpu_s_per_batch"] for r in workers) if workers else float("nan")
  configured = next((r for r in pads if r["num_token_buckets"] == 1), pads[0]) if pads else {}
  cold = [r for r in loads if r["cache"] == "cold"]
  inline = min(r["frames_per_s"] for r in hot if r["workers"] == 0)
  cold_text = (f" With the page cache dropped first the disk bounds it: "
               f"{min(r['frames_per_s'] for r in cold) / 1e6:.2f}-"
               f"{max(r['frames_per_s'] for r in cold) / 1e6:.2f} M frames/s." if cold else "")
  text = f"""## The input pipeline at MuST-C's size

On {corpus["bytes"] / 1e9:.1f} GB of MuST-C-like features at the thesis's 320k-frame batch, page
cache hot: {inline / 1e6:.2f} M frames/s inline, at least {per_core / 1e6:.2f} M per worker core,
the main process's share {1000 * main_cpu:.2f} ms of CPU per batch.{cold_text} Tables and padding:
[benchmarks/details.md](benchmarks/details.md#the-input-pipeline-at-must-cs-size).
"""
  targets = [
      ["input pipeline per worker core (320k frames, utterance CMVN, SpecAugment, MuST-C "
       "lengths, page cache hot): >= 2 M frames/s", f"{per_core / 1e6:.2f} M (copy ceiling "
       f"{ceiling / 1e6:.1f} M)", verdict(per_core >= 2e6)],
      ["input pipeline, main process's CPU per batch: <= 6 ms (10 % of a 0.06 s update)",
       f"{1000 * main_cpu:.2f} ms", verdict(main_cpu <= 0.006)]]
  by_workers = {r["workers"]: r["frames_per_s"] for r in hot}
  most = max(by_workers)
  if most > 1 and 1 in by_workers:
    scaling = by_workers[most] / by_workers[1]
    targets.append([f"input pipeline scales with its workers: {most} workers >= "
                    f"{0.8 * most:.1f}x one worker's frames/s (the host's {meta.get('cpu_count')}"
                    f" cores)", f"{scaling:.2f}x", verdict(scaling >= 0.8 * most)])
  if configured:
    meeting = [r for r in pads if r["padded_tokens_share"] <= 0.15]
    best = (min(meeting, key=lambda r: len(r["shapes"])) if meeting else
            min(pads, key=lambda r: r["padded_tokens_share"]))     # the fewest shapes that do
    targets.append(["padded target tokens on MuST-C-like lengths: <= 15 %",
                    f"{100 * configured['padded_tokens_share']:.1f} % with 8 shapes; "
                    f"{100 * best['padded_tokens_share']:.1f} % with "
                    f"{len(best['shapes'])} (data.num_token_buckets="
                    f"{best['num_token_buckets']})",
                    verdict(best["padded_tokens_share"] <= 0.15)])
  return text, targets, detail


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gb", type=float, default=24.0)
  parser.add_argument("--workers", default="0,1,2")
  parser.add_argument("--batches", type=int, default=40)
  parser.add_argument("--max_frames", type=int, default=320_000)
  parser.add_argument("--corpus_dir", default="/tmp/mustc_like")
  parser.add_argument("--out", default="docs/benchmarks/input_pipeline.jsonl")
  parser.add_argument("--keep", action="store_true", help="keep the corpus")
  parser.add_argument("--reuse", action="store_true", help="use the corpus already there")
  parser.add_argument("--padding_only", action="store_true",
                      help="only the padding rows, from an index-only corpus of the same "
                           "lengths (seconds, not the minutes the features take)")
  args = parser.parse_args(argv)
  peak_before = matmul_peak()
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv),
                               "matmul_peak_gflops_before": round(peak_before / 1e9, 1)})
  if args.padding_only or not (
      args.reuse and os.path.exists(os.path.join(args.corpus_dir, "prepared.json"))):
    shutil.rmtree(args.corpus_dir, ignore_errors=True)
    start = time.time()
    sizes = write_corpus(args.corpus_dir, args.gb, features=not args.padding_only)
    results.add(kind="corpus", **sizes["train"], write_s=round(time.time() - start, 1),
                features_written=not args.padding_only)
  for token_buckets in (1, 2, 4, 6, 8):
    config = ip.PipelineConfig(args.corpus_dir, stage="st", max_frames=args.max_frames,
                               num_buckets=8, num_token_buckets=token_buckets, seed=1)
    results.add(kind="padding", num_buckets=8, num_token_buckets=token_buckets,
                **padding(ip.Batcher(ip.SplitData(config, "train"), True)))
  if args.padding_only:
    shutil.rmtree(args.corpus_dir, ignore_errors=True)
    return
  config = ip.PipelineConfig(args.corpus_dir, stage="st", max_frames=args.max_frames,
                             num_buckets=8, seed=1, cmvn="utterance", specaugment=True)
  batcher = ip.Batcher(ip.SplitData(config, "train"), True)
  plan = batcher.epoch_plan(0)
  worker_counts = [int(w) for w in args.workers.split(",")]
  # Hot: each measurement reads batches the copy read just before (the page cache holds
  # them); every measurement gets batches of its own.
  span = args.batches + 1
  for k, workers in enumerate(worker_counts):
    first = k * span
    copy = time_copy(batcher, plan[first:], span)
    results.add(kind="copy", cache="hot", **copy)
    results.add(kind="pipeline", cache="hot", **time_loader(batcher, workers, first,
                                                             args.batches),
                copy_frames_per_s=copy["frames_per_s"])
  for k, workers in enumerate(worker_counts):
    first = (len(worker_counts) + k) * span
    why_not = drop_caches()
    if why_not:
      results.add(kind="pipeline", cache="cold", workers=workers, skipped=why_not)
      continue
    results.add(kind="pipeline", cache="cold", **time_loader(batcher, workers, first,
                                                              args.batches))
  results.add(kind="peak", matmul_peak_gflops_after=round(matmul_peak() / 1e9, 1))
  if not args.keep:
    shutil.rmtree(args.corpus_dir, ignore_errors=True)


if __name__ == "__main__":
  main()
