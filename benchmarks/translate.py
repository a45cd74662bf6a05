"""`translate` on a folder of recordings against evaluation of the same split, warm; its memory
over 1000 files; long recordings cut at pauses against their sentences decoded one by one.

    python -m benchmarks.translate --workdir runs/quickstart \
        --out docs/benchmarks/cpu/translate.jsonl

1. The split's utterances (default tst-COMMON of the run's corpus) are written as 16-bit wav
   files, one per utterance, as a user's recordings would be.
2. Evaluation decodes the split with both stages (`evaluate_stage`), twice: the second, warm
   decode time is the reference (it reads prepared features).
3. `FileDecoder` decodes the wav files (reading, fbank, CMVN and both stages), a warm-up
   pass and then a timed one; target: at most 1.5x evaluation's time.
4. The same decoder decodes 1000 files (the wav files over and over); resident memory over
   the first 100 and over the last 100 files (each window's floor: it swings by a few hundred
   MiB with the bucket of the batch just decoded), and its peak; target: within 10 %.
5. Long recordings: consecutive utterances joined with pauses of 0.3-0.8 s into files of about
   `--long_seconds`, cut at their pauses (default limit 20 s); the ASR WER of each long file's
   transcript against its sentences' references joined, beside the WER of the same sentences
   decoded one by one and joined; target: within 2 points. ST BLEU likewise (a sentence's
   translation is not aligned to its reference when two share a segment).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


import numpy as np
import soundfile

from benchmarks.report_format import command_line, load, machine_line, markdown_table, verdict
from benchmarks import common
from data_prep import corpora
from data_prep.audio import SAMPLE_RATE, cut_segment, load_audio
from multiformer_jax.evaluation import scoring, audio_files
from multiformer_jax.evaluation.metrics import corpus_bleu, corpus_wer
from multiformer_jax import schema
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags


def rss_mib() -> float:
  with open("/proc/self/status", encoding="utf-8") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def write_utterances(config, split: str, out_dir: str):
  """-> (wav paths, records) of the split's utterances, one 16-bit file each."""
  d = config.data
  records = []
  for pair in d.pairs.split(","):
    records += corpora.read_corpora(d.corpus, d.root, [pair.strip()], split)
  talks, paths = {}, []
  for r in records:
    if r.audio_path not in talks:
      talks[r.audio_path] = load_audio(r.audio_path)[0]
    path = os.path.join(out_dir, f"{r.id}.wav")
    soundfile.write(path, cut_segment(talks[r.audio_path], r.offset, r.duration), SAMPLE_RATE,
                    subtype="PCM_16")
    paths.append(path)
  return paths, records


def long_recordings(paths, seconds: float, out_dir: str, seed: int = 0):
  """Consecutive utterances joined with pauses into files of about `seconds` -> [(path,
  [utterance indices])]."""
  rng = np.random.default_rng(seed)
  groups, current, length = [], [], 0.0
  for i, path in enumerate(paths):
    current.append(i)
    length += soundfile.info(path).duration + 0.55
    if length >= seconds:
      groups.append(current)
      current, length = [], 0.0
  if current:
    groups.append(current)
  out = []
  for g, members in enumerate(groups):
    pieces = []
    for i in members:
      audio, _ = soundfile.read(paths[i], dtype="float32")
      pause = rng.normal(0, 3e-4, int(rng.uniform(0.3, 0.8) * SAMPLE_RATE)).astype(np.float32)
      pieces += [audio, pause]
    path = os.path.join(out_dir, f"long_{g:03d}.wav")
    soundfile.write(path, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    out.append((path, members))
  return out



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  """benchmarks/translate.py: a folder of recordings against evaluation of the same split."""
  meta, rows = load(directory, os.path.join("cpu", "translate.jsonl"))
  if not rows:
    return "", []
  by = {r["measure"]: r for r in rows if r["measure"] != "evaluate"}
  speed, memory, long = by["translate_vs_evaluate"], by["memory"], by["long_recordings"]
  command = meta.get("command", "python -m benchmarks.translate --workdir runs/quickstart "
                                "--out docs/benchmarks/cpu/translate.jsonl")
  table = markdown_table(["measure", "value"], [
      ["evaluation of the split, both stages, warm (s)", speed["evaluate_warm_s"]],
      [f"translate, {speed['files']} wav files, both stages, warm (s)",
       speed["translate_warm_s"]],
      ["translate, the same, cold: compiling included (s)", speed["translate_cold_s"]],
      ["search programs compiled per stage", speed["compiled_programs"]],
      ["frame buckets / batch sizes", f"{speed['buckets']} / {speed['batch_sizes']}"],
      ["files decoded to evaluation's very text (asr, st)",
       speed["same_text_as_evaluation"]],
      [f"resident memory floor, files 1-100 / last 100 of {memory['files']} (MiB)",
       f"{memory['rss_floor_mib_files_1_100']} / {memory['rss_floor_mib_last_100']}"],
      ["resident memory peak (MiB)", memory["rss_peak_mib"]],
      [f"{long['files']} recordings of ~{long['seconds_each']:.0f} s ({long['sentences']} "
       f"sentences): segments cut", long["segments"]],
      ["ASR WER: long recordings cut at pauses / the sentences one by one",
       f"{long['wer_at_pauses']} / {long['wer_one_by_one']}"],
      ["ST BLEU: the same", f"{long['bleu_at_pauses']} / {long['bleu_one_by_one']}"]])
  text = f"""## translate on a folder of recordings

Machine: {machine_line(meta)}. Command: `{command_line(command)}` (a run of the README's main
command on the date above, an older recipe than today's whose ST model read BLEU about 1-3;
{meta['split']}'s utterances written as 16-bit wav files; float32 matmul peak
{meta.get('matmul_peak_gflops', '?')} GFLOP/s in the same run). The table measures speed,
memory and agreement with evaluation, not the model's quality. Every file is cut at its
pauses, so an utterance of two sentences is decoded as two segments: those are the files whose
text differs from evaluation's. The BLEU of whole recordings is a document-level figure (the
sentence-level BLEU is the evaluation's).

{table}
"""
  growth = memory["growth"]
  difference = long["wer_at_pauses"] - long["wer_one_by_one"]
  return text, [
      ["translate a folder vs evaluation of the same split (warm): <= 1.5x",
       f"{speed['ratio']:.2f}x", verdict(speed["ratio"] <= 1.5)],
      ["translate's resident memory after 1000 files within 10 % of after 100",
       f"{100 * growth:+.1f} %", verdict(abs(growth) <= 0.10)],
      ["long recordings cut at pauses: WER within 2 points of the sentences one by one",
       f"{difference:+.2f}", verdict(abs(difference) <= 2.0)]]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="runs/quickstart")
  parser.add_argument("--split", default=None, help="default: the run's data.test_split")
  parser.add_argument("--files", type=int, default=1000, help="files of the memory run")
  parser.add_argument("--long_seconds", type=float, default=60.0)
  parser.add_argument("--out", default="docs/benchmarks/cpu/translate.jsonl")
  args = parser.parse_args()
  config = schema.load_config(args.workdir)
  split = args.split or config.data.test_split
  results = common.Results(args.out, {**common.machine(), "workdir": args.workdir,
                                      "command": "python " + " ".join(sys.argv),
                                      "split": split, "matmul_peak_gflops": round(
                                          common.matmul_peak() / 1e9, 1)})
  stages = ("asr", "st")
  evaluation = {}
  for attempt in ("cold", "warm"):
    for stage in stages:
      result = scoring.evaluate_stage(config, args.workdir, stage, split, progress=False)
      evaluation[stage] = result
      results.add(measure="evaluate", pass_=attempt, stage=stage, decode_s=result["decode_s"],
                  score=result.get("bleu", result.get("wer")))
  eval_s = sum(evaluation[s]["decode_s"] for s in stages)

  with tempfile.TemporaryDirectory(prefix="translate_bench_") as tmp:
    paths, records = write_utterances(config, split, tmp)
    decoder = audio_files.FileDecoder(args.workdir, stages, max_batch=1024)
    timings = {}
    for attempt in ("cold", "warm"):
      start = time.perf_counter()
      out = {r["index"]: r for r in decoder.decode(paths)}
      timings[attempt] = time.perf_counter() - start
    hyps = {s: [out[i][s] for i in range(len(paths))] for s in stages}
    same = {s: sum(h == e for h, e in zip(hyps[s], _eval_hyps(evaluation[s]["directory"],
                                                               records))) for s in stages}
    wer = corpus_wer(hyps["asr"], [r.source_text for r in records])["wer"]
    bleu = corpus_bleu(hyps["st"], [r.target_text for r in records])["bleu"]
    results.add(measure="translate_vs_evaluate", files=len(paths), translate_cold_s=round(
        timings["cold"], 1), translate_warm_s=round(timings["warm"], 1),
                evaluate_warm_s=round(eval_s, 1), ratio=round(timings["warm"] / eval_s, 2),
                target_ratio=1.5, compiled_programs=decoder.compiled_programs(),
                buckets=decoder.edges, batch_sizes=decoder.batch_sizes,
                same_text_as_evaluation=same, wer=wer, bleu=bleu)

    many = [paths[i % len(paths)] for i in range(args.files)]
    rss, start = [], time.perf_counter()
    for _ in decoder.decode(many):
      rss.append(rss_mib())
    # Resident memory swings by 250-400 MiB with the bucket of the batch just decoded (the
    # allocator keeps its temporaries a while), so what stays is each window's floor: the least
    # resident memory over the first and over the last 100 files. The peak is reported too.
    first, last = min(rss[:100]), min(rss[-100:])
    results.add(measure="memory", files=args.files, rss_floor_mib_files_1_100=round(first, 1),
                rss_floor_mib_last_100=round(last, 1), growth=round(last / first - 1, 3),
                target_growth=0.10, rss_peak_mib=round(max(rss), 1),
                seconds=round(time.perf_counter() - start, 1))

    groups = long_recordings(paths, args.long_seconds, tmp)
    long_out = {r["index"]: r for r in decoder.decode([p for p, _ in groups])}
    joined = lambda texts: " ".join(t for t in texts if t)
    refs = {"asr": [joined(records[i].source_text for i in m) for _, m in groups],
            "st": [joined(records[i].target_text for i in m) for _, m in groups]}
    one_by_one = {s: [joined(hyps[s][i] for i in m) for _, m in groups] for s in stages}
    at_pauses = {s: [long_out[g][s] for g in range(len(groups))] for s in stages}
    results.add(measure="long_recordings", files=len(groups), seconds_each=args.long_seconds,
                segments=int(sum(r["segments"] for r in long_out.values())),
                sentences=len(paths),
                wer_at_pauses=corpus_wer(at_pauses["asr"], refs["asr"])["wer"],
                wer_one_by_one=corpus_wer(one_by_one["asr"], refs["asr"])["wer"],
                bleu_at_pauses=corpus_bleu(at_pauses["st"], refs["st"])["bleu"],
                bleu_one_by_one=corpus_bleu(one_by_one["st"], refs["st"])["bleu"],
                target_wer_difference=2.0)


def _eval_hyps(directory: str, records) -> list[str]:
  """The hypotheses of the evaluation written to `directory`, in the order of `records`."""
  with open(os.path.join(directory, "ids.txt"), encoding="utf-8") as f:
    ids = f.read().split("\n")[:-1]
  with open(os.path.join(directory, "hyp.txt"), encoding="utf-8") as f:
    hyps = dict(zip(ids, f.read().split("\n")[:-1]))
  return [hyps.get(r.id) for r in records]


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
