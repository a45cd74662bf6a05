"""Memory and load time of a corpus index at MuST-C's size, in both forms it comes in.

    python -m benchmarks.index_scale --segments 250000 --out docs/benchmarks/cpu/index_scale.jsonl

Writes a synthetic fairseq data root (MuST-C En-De's shape: 250k segments, transcripts and
translations of MuST-C-like lengths; the manifest's rows point at a few hundred short .npy
entries of one fbank80.zip, since the index is what grows with the corpus, not the audio),
then measures, each in a fresh process, the peak resident memory (VmHWM) and wall time of:
  fairseq_index   data_prep.fairseq_data.write_index (the TSVs -> index/*.npz)
  fairseq_st      the ST training split loaded (SplitData) and its batch plan (Batcher)
  fairseq_asr     the same for ASR
  prepare_st      the same index in data_prep.prepare's form (a prepared dir whose index the
                  prepare run would write; its features are never read here)
  prepare_main    data_prep.prepare's main process on the same segments in MuST-C's layout
                  (yaml + text files, talks of 120 segments, no audio): reading and planning
                  the shards (`plan_jobs`), then the split's index from the shards' sidecars
                  (`write_split_index`; the sidecars are written here as the workers would)
and one line per measurement (JSON) with the machine. Targets (issue #52): every process
<= 1.5 GiB together, a load <= 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.report_format import command_line, load, machine_line, markdown_table, verdict
from benchmarks.common import machine

WORDS = ("the of and to a in that is it we you this for are on with was so they have be not "
         "what can about there our but people like all just one do more from at think know "
         "world how very because these when really time would which thing up who").split()
GERMAN = ("die der und das ist zu in ich wir es sie nicht ein eine mit auf für sind was "
          "auch dass man so wenn aber wie von den dem haben sehr können dies welt menschen "
          "zeit wirklich weil etwas").split()
ENTRIES = 200


def sentence(rng, vocabulary, words: int) -> str:
  return " ".join(rng.choice(vocabulary, size=words)).capitalize() + "."


def write_root(root: str, segments: int, seed: int = 0):
  """The synthetic fairseq root: fbank80.zip of ENTRIES short matrices, train/dev manifests,
  SentencePiece models with their dictionaries, yamls."""
  from data_prep import vocab  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  os.makedirs(root, exist_ok=True)
  zip_path = os.path.join(root, "fbank80.zip")
  with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_STORED) as z:
    for i in range(ENTRIES):
      path = os.path.join(root, f"e{i}.npy")
      np.save(path, rng.normal(size=(int(rng.integers(20, 60)), 80)).astype(np.float32))
      z.write(path, arcname=f"e{i}.npy")
      os.remove(path)
  with zipfile.ZipFile(zip_path) as z:
    entries = [(i.header_offset + 30 + len(i.filename), i.file_size) for i in z.infolist()]
  texts = {}
  for split, count in (("train", segments), ("dev", 1400)):
    # MuST-C En-De: about 17 words a segment, a long tail to a few hundred.
    lengths = np.minimum(rng.lognormal(2.7, 0.6, count).astype(int) + 1, 400)
    en = [sentence(rng, WORDS, n) for n in lengths]
    de = [sentence(rng, GERMAN, max(1, int(n * 1.05))) for n in lengths]
    texts[split] = (en, de)
    frames = np.clip((lengths * 40 * rng.uniform(0.7, 1.3, count)).astype(int), 5, 3000)
    for task, column in (("asr", en), ("st", de)):
      with open(os.path.join(root, f"{split}_{task}.tsv"), "w", encoding="utf-8") as f:
        f.write("id\taudio\tn_frames\ttgt_text\tspeaker\n")
        for i in range(count):
          offset, length = entries[i % ENTRIES]
          f.write(f"ted_{i // 120}_{i % 120}\tfbank80.zip:{offset}:{length}\t{frames[i]}\t"
                  f"{column[i]}\tspk{i // 120 % 2000}\n")
  for task, side in (("asr", 0), ("st", 1)):
    model = vocab.train_sentencepiece(texts["train"][side][:20000],
                                      os.path.join(root, f"spm_unigram_{task}"), 200)
    sp = vocab.Vocabulary(model).sp
    with open(os.path.join(root, f"spm_unigram_{task}.txt"), "w", encoding="utf-8") as f:
      f.writelines(f"{sp.id_to_piece(i)} 1\n" for i in range(4, sp.get_piece_size()))
    with open(os.path.join(root, f"config_{task}.yaml"), "w", encoding="utf-8") as f:
      f.write(f"bpe_tokenizer:\n  bpe: sentencepiece\n  sentencepiece_model: "
              f"spm_unigram_{task}.model\ntransforms:\n  '*':\n  - utterance_cmvn\n"
              f"vocab_filename: spm_unigram_{task}.txt\n")


def prepare_form(fairseq_index: str, out: str):
  """The same rows as data_prep.prepare's output: its index columns and vocabularies, a
  prepared.json of its form (no feature files: the features are not read)."""
  from data_prep import index_io  # pylint: disable=import-outside-toplevel
  os.makedirs(os.path.join(out, "index"), exist_ok=True)
  with open(os.path.join(fairseq_index, "prepared.json"), encoding="utf-8") as f:
    summary = json.load(f)
  for split in summary["splits"]:
    index = index_io.load(os.path.join(fairseq_index, "index", f"{split}.npz"))
    for name in ("audio_file", "audio_offset", "audio_length"):
      index.pop(name)
    rows = len(index["n_frames"])
    index.update(feature_file=np.zeros(rows, np.int32), feature_offset=np.zeros(rows, np.int64))
    index_io.save(os.path.join(out, "index", f"{split}.npz"), index)
  vocabularies = {}
  for task, entry in summary["vocab"].items():
    shutil.copy(entry["model"], os.path.join(out, f"spm_{task}.model"))
    vocabularies[task] = {"model": f"spm_{task}.model", "size": 0}
  with open(os.path.join(out, "prepared.json"), "w", encoding="utf-8") as f:
    json.dump({"corpus": "mustc", "root": "", "pairs": summary["pairs"], "eval_only_pairs": [],
               "splits": summary["splits"], "features": "frames", "feature_dim": 80,
               "feature_files": {split: [f"frames/{split}/00000-of-00001.f32"]
                                 for split in summary["splits"]},
               "vocab": vocabularies, "gcmvn": None}, f)


def mustc_form(root: str, out: str) -> str:
  """The synthetic root's train split in MuST-C's layout (txt only) -> the corpus root."""
  base = os.path.join(out, "en-de", "data", "train", "txt")
  os.makedirs(base, exist_ok=True)
  files = {ext: open(os.path.join(base, f"train.{ext}"), "w", encoding="utf-8")
           for ext in ("yaml", "en", "de")}
  with open(os.path.join(root, "train_asr.tsv"), encoding="utf-8") as asr, \
       open(os.path.join(root, "train_st.tsv"), encoding="utf-8") as st:
    next(asr), next(st)
    offsets = {}
    for asr_row, st_row in zip(asr, st):
      utt, _, frames, en, speaker = asr_row.rstrip("\n").split("\t")
      de = st_row.rstrip("\n").split("\t")[3]
      talk = utt.rsplit("_", 1)[0]
      offset = offsets.get(talk, 0.0)
      offsets[talk] = offset + int(frames) / 100 + 0.5
      files["yaml"].write(f"- {{duration: {int(frames) / 100}, offset: {offset:.2f}, "
                          f"speaker_id: {speaker}, wav: {talk}.wav}}\n")
      files["en"].write(en + "\n")
      files["de"].write(de + "\n")
  for f in files.values():
    f.close()
  return out


MEASURE = r"""
import json, sys, time
start = time.perf_counter()
what, directory, task = {what!r}, {directory!r}, {task!r}
if what == "prepare_main":
  import os
  from data_prep import prepare
  jobs, _ = prepare.plan_jobs("mustc", {root!r}, ["en-de"], directory, ["train"], 2,
                              prepare.DEFAULT_SHARD_FRAMES)
  for _, sidecar, talks, _, _ in jobs["train"]:     # as the workers write them
    columns = {{name: [getattr(r, name) for _, records, _ in talks for r in records]
               for name in prepare.META_FIELDS}}
    columns["n_frames"] = [int(r.duration * 100) for _, records, _ in talks for r in records]
    prepare._atomic_json(sidecar, {{"index": columns}})
  os.makedirs(os.path.join(directory, "index"), exist_ok=True)
  prepare.write_split_index(os.path.join(directory, "index", "train.npz"),
                            [job[1] for job in jobs["train"]])
elif what == "index":
  from data_prep import fairseq_data
  fairseq_data.write_index({root!r}, directory)
else:
  from multiformer_jax.data import input_pipeline as ip
  data = ip.SplitData(ip.PipelineConfig(directory, stage=task, specaugment=False,
                                        max_frames=40000), "train")
  batcher = ip.Batcher(data, train=True)
  plan = batcher.epoch_plan(0)
  batch = batcher.assemble(*plan[0], 0) if what == "fairseq" else None
seconds = time.perf_counter() - start
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({{"seconds": round(seconds, 1), "peak_rss_mib": round(peak / 1024, 1)}}))
"""


def measure(what: str, directory: str, task: str = "", root: str = "") -> dict:
  code = MEASURE.format(repo=os.path.dirname(HERE), what=what, directory=directory, stage=task,
                        root=root)
  out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                       text=True, cwd=os.path.dirname(HERE)).stdout
  return json.loads(out.strip().split("\n")[-1])



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  """benchmarks/index_scale.py: a 250k-segment index in fairseq's form and prepare's."""
  meta, rows = load(directory, os.path.join("cpu", "index_scale.jsonl"))
  if not rows:
    return "", []
  segments = rows[-1]["segments"]
  rows = [r for r in rows if r["segments"] == segments]
  by = {r["measure"]: r for r in rows}
  if not meta:                        # each row carries its machine and command
    meta = {**rows[-1].get("machine", {}), "command": rows[-1].get("command", "")}
  what = {"fairseq_index": "fairseq root -> index (data_prep.fairseq_data.write_index)",
          "fairseq_st": "ST training split loaded + batch plan, fairseq root",
          "fairseq_asr": "ASR training split loaded + batch plan, fairseq root",
          "prepare_st": "ST training split loaded + batch plan, prepare's index",
          "prepare_main": "data_prep.prepare's main process: segment lists read, shards "
                          "planned, the index built from the shards' sidecars"}
  table = markdown_table(["process", "peak resident memory (MiB)", "wall (s)"],
                 [[what[m], by[m]["peak_rss_mib"], by[m]["seconds"]] for m in what if m in by])
  loads = [m for m in ("fairseq_st", "fairseq_asr", "prepare_st") if m in by]
  together = sum(by[m]["peak_rss_mib"] for m in by)
  slowest = max(by[m]["seconds"] for m in loads)
  text = f"""## Index at MuST-C's size

Machine: {machine_line(meta)}. Command: `{command_line(meta.get("command", ""))}`. A synthetic fairseq
root of {segments:,} training segments (MuST-C En-De has 229k; transcripts of MuST-C-like
lengths) whose rows point at a few hundred short entries of one fbank80.zip: the index is what
grows with the corpus. Each process is measured alone (peak resident memory, VmHWM); they
run one at a time, and the target adds them all.

{table}
"""
  return text, [
      [f"every index process together at {segments:,} segments: <= 1.5 GiB",
       f"{together / 1024:.2f} GiB", verdict(together <= 1.5 * 1024)],
      [f"a split's load at {segments:,} segments: <= 30 s on 2 cores", f"{slowest:.1f} s",
       verdict(slowest <= 30)]]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--segments", type=int, default=250000)
  parser.add_argument("--workdir", default=None, help="default: a temporary directory")
  parser.add_argument("--out", default="docs/benchmarks/cpu/index_scale.jsonl")
  args = parser.parse_args(argv)
  workdir = args.workdir or tempfile.mkdtemp(prefix="index_scale_")
  root = os.path.join(workdir, "en-de")
  start = time.perf_counter()
  if not os.path.exists(os.path.join(root, "train_st.tsv")):
    write_root(root, args.segments)
  print(f"synthetic root: {time.perf_counter() - start:.0f} s", flush=True)
  fairseq_index, prepared = os.path.join(workdir, "fairseq_index"), os.path.join(workdir, "prep")
  shutil.rmtree(fairseq_index, ignore_errors=True)
  shutil.rmtree(prepared, ignore_errors=True)
  rows = [{"measure": "fairseq_index", **measure("index", fairseq_index, root=root)}]
  prepare_form(fairseq_index, prepared)
  rows += [{"measure": f"fairseq_{task}", **measure("fairseq", fairseq_index, task)}
           for task in ("st", "asr")]
  rows.append({"measure": "prepare_st", **measure("prepare", prepared, "st")})
  mustc_root = mustc_form(root, os.path.join(workdir, "mustc"))
  main_out = os.path.join(workdir, "prepare_main")
  shutil.rmtree(main_out, ignore_errors=True)
  rows.append({"measure": "prepare_main", **measure("prepare_main", main_out, root=mustc_root)})
  info = machine()
  with open(args.out, "a", encoding="utf-8") as f:
    for row in rows:
      row = {"benchmark": "index_scale", "segments": args.segments, **row, "machine": info,
             "command": " ".join(["python", "-m", "benchmarks.index_scale"] + (argv or sys.argv[1:]))}
      print(json.dumps(row))
      f.write(json.dumps(row) + "\n")
  if not args.workdir:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  main()
