"""Corpus on disk -> features, TFDS dataset, SentencePiece models and a prep report.

    python -m data_prep.prepare --corpus mustc --root data/embedded --pairs en-de \
        --out data/prepared/embedded_en_de --asr-vocab 1000 --st-vocab 1000

Steps (fairseq's MuST-C recipe, REFERENCE §2):
1. per talk: read the audio once (downmix / resample if needed), cut the segments, compute
   80-dim Kaldi fbank; filter: fewer than 5 frames or empty text everywhere, more than 3000
   frames in train; unreadable audio, segments past the end, non-finite features are skipped.
   Every skip and repair is counted by reason in `prep_report.json`.
   Each talk's result is cached atomically under `features/`: a rerun redoes nothing done.
2. all splits -> one TFDS dataset (array_record) under `tfds/`, written atomically.
3. an index per split (`index/{split}.npz`: lengths, texts, tags, aligned with the data
   source), global CMVN statistics from train, SentencePiece models for ASR and ST.
`prepared.json` is written last: its presence means the preparation is complete.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os

import numpy as np

from data_prep import corpora, features, tfds_dataset, vocab
from data_prep.audio import AudioError, cut_segment, load_audio

MIN_FRAMES = 5
MAX_TRAIN_FRAMES = 3000
GCMVN_MAX_UTTERANCES = 150_000
EXAMPLES_PER_REASON = 20
META_FIELDS = ("id", "talk", "speaker", "source_text", "target_text", "source_lang",
               "target_lang", "domain")


def _atomic_json(path: str, value):
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(value, f, indent=1, ensure_ascii=False)
  os.replace(path + ".tmp", path)


def process_talk(job) -> dict:
  """Worker: features of one talk's segments -> cached npz; returns its report entries."""
  cache_path, records, is_train = job
  if os.path.exists(cache_path):
    with np.load(cache_path, allow_pickle=False) as cached:
      return json.loads(str(cached["report"]))
  kept, feats, skipped, repairs = [], [], [], []
  try:
    audio, repairs = load_audio(records[0]["audio_path"])
  except AudioError as e:
    audio, skipped = None, [(r["id"], e.reason) for r in records]
  for r in records if audio is not None else []:
    if not r["source_text"].strip() or not r["target_text"].strip():
      skipped.append((r["id"], "empty text"))
      continue
    try:
      segment = cut_segment(audio, r["offset"], r["duration"])
    except AudioError as e:
      skipped.append((r["id"], e.reason))
      continue
    if not np.all(np.isfinite(segment)):   # the fbank of NaN/inf samples is not finite
      skipped.append((r["id"], "non-finite features"))
      continue
    try:
      fb = features.fbank(segment)
    except Exception as e:  # pylint: disable=broad-except  # counted, never a crash mid-corpus
      skipped.append((r["id"], f"feature extraction failed ({type(e).__name__})"))
      continue
    if len(fb) < MIN_FRAMES:
      skipped.append((r["id"], f"fewer than {MIN_FRAMES} frames"))
    elif is_train and len(fb) > MAX_TRAIN_FRAMES:
      skipped.append((r["id"], f"more than {MAX_TRAIN_FRAMES} frames (train)"))
    elif not np.all(np.isfinite(fb)):
      skipped.append((r["id"], "non-finite features"))
    else:
      kept.append(r)
      feats.append(fb)
  report = {"kept": len(kept), "skipped": skipped, "repairs": repairs}
  arrays = {"report": json.dumps(report),
            "meta": json.dumps([{k: r[k] for k in META_FIELDS} for r in kept]),
            "lengths": np.array([len(f) for f in feats], np.int64),
            "fbank": np.concatenate(feats) if feats else np.zeros((0, 80), np.float32)}
  tmp = cache_path + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, cache_path)
  return report


def _talk_examples(paths):
  """Yields (key, example) from cached talk files."""
  for path in paths:
    with np.load(path, allow_pickle=False) as cached:
      meta = json.loads(str(cached["meta"]))
      starts = np.concatenate([[0], np.cumsum(cached["lengths"])])
      fbank = cached["fbank"]
      for i, m in enumerate(meta):
        fb = fbank[starts[i]:starts[i + 1]]
        yield f"{m['source_lang']}-{m['target_lang']}/{m['id']}", dict(
            m, fbank=fb, n_frames=len(fb))


def build_index(data_dir: str, split: str, out_path: str):
  """Lengths and texts of a split, in data-source order (the batcher needs no fbank reads)."""
  source = tfds_dataset.open_split(data_dir, split)
  columns = collections.defaultdict(list)
  for i in range(len(source)):
    example = source[i]
    columns["n_frames"].append(int(example["n_frames"]))
    for name in META_FIELDS:
      columns[name].append(example[name].decode("utf-8"))
  arrays = {k: np.array(v) for k, v in columns.items()}
  np.savez(out_path + ".tmp.npz", **arrays)
  os.replace(out_path + ".tmp.npz", out_path)


def prepare(corpus: str, root: str, pairs: list[str], out: str, splits: list[str] | None = None,
            asr_vocab: int = 5000, st_vocab: int = 8000, workers: int = 2,
            progress: bool = True) -> dict:
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  done_marker = os.path.join(out, "prepared.json")
  if os.path.exists(done_marker):
    with open(done_marker, encoding="utf-8") as f:
      return json.load(f)
  splits = splits or [s for s in corpora.SPLITS[corpus.split(",")[0]] if s != "tst-HE"]
  # Read every split's segment list first: layout errors surface before any work is done.
  records = {s: corpora.read_corpora(corpus, root, pairs, s) for s in splits}
  jobs = {}
  for split, recs in records.items():
    talks = collections.defaultdict(list)
    for r in recs:
      talks[(r.source_lang, r.target_lang, r.talk)].append(r)
    cache_dir = os.path.join(out, "features", split)
    os.makedirs(cache_dir, exist_ok=True)
    jobs[split] = [(os.path.join(cache_dir, f"{s}-{t}_{talk}.npz"),
                    [vars(r) for r in rs], split == "train")
                   for (s, t, talk), rs in sorted(talks.items())]
  report = {}
  with multiprocessing.get_context("spawn").Pool(workers) as pool:
    for split, split_jobs in jobs.items():
      results = tqdm(pool.imap(process_talk, split_jobs), total=len(split_jobs),
                     desc=f"features {split}", unit="talk", disable=not progress)
      skipped, repairs, kept = collections.Counter(), collections.Counter(), 0
      examples = collections.defaultdict(list)
      for result in results:
        kept += result["kept"]
        repairs.update(result["repairs"])
        for utt, reason in result["skipped"]:
          skipped[reason] += 1
          if len(examples[reason]) < EXAMPLES_PER_REASON:
            examples[reason].append(utt)
      report[split] = {"segments": len(records[split]), "kept": kept,
                       "skipped": dict(skipped), "skipped_examples": dict(examples),
                       "repaired_talks": dict(repairs)}
      if kept == 0:
        raise ValueError(f"no usable segment in {split} of {root} ({pairs}): "
                         f"{dict(skipped)}")
  _atomic_json(os.path.join(out, "prep_report.json"), report)

  data_dir = os.path.join(out, "tfds")
  generators = {s: (lambda paths=[j[0] for j in js]: _talk_examples(paths))
                for s, js in jobs.items()}
  tfds_dataset.write_dataset(data_dir, generators)

  index_dir = os.path.join(out, "index")
  os.makedirs(index_dir, exist_ok=True)
  for split in splits:
    path = os.path.join(index_dir, f"{split}.npz")
    if not os.path.exists(path):
      build_index(data_dir, split, path)

  stats = features.GlobalCMVNStats()
  train_paths = [j[0] for j in jobs.get("train", [])]
  for n, (_, example) in enumerate(_talk_examples(train_paths)):
    if n >= GCMVN_MAX_UTTERANCES:
      break
    stats.add(example["fbank"])
  if stats.count:
    mean, std = stats.mean_std()
    np.savez(os.path.join(out, "gcmvn.npz"), mean=mean, std=std)

  train_index = np.load(os.path.join(index_dir, f"{splits[0]}.npz"))
  # One-to-many corpora get fairseq's <lang:xx> target tags (data.target_lang_tag uses them).
  target_langs = sorted({corpora.split_pair(p)[1] for p in pairs})
  tags = tuple(vocab.lang_tag(l) for l in target_langs) if len(target_langs) > 1 else ()
  vocabularies = {
      "asr": vocab.train_sentencepiece(list(train_index["source_text"]),
                                       os.path.join(out, "spm_asr"), asr_vocab),
      "st": vocab.train_sentencepiece(list(train_index["target_text"]),
                                      os.path.join(out, "spm_st"), st_vocab, tags)}
  summary = {"corpus": corpus, "root": ",".join(map(os.path.abspath, root.split(","))),
             "pairs": pairs,
             "splits": {s: report[s]["kept"] for s in splits}, "tfds_dir": "tfds",
             "vocab": {task: {"model": os.path.basename(p), "size": vocab.Vocabulary(p).size}
                       for task, p in vocabularies.items()},
             "gcmvn": "gcmvn.npz" if stats.count else None}
  _atomic_json(done_marker, summary)
  return summary


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--corpus", default="mustc",
                      help=f"{', '.join(sorted(corpora.READERS))}; several comma-separated "
                           f"(multi-domain), with one --root each")
  parser.add_argument("--root", required=True, help="the corpus download directory (several: "
                                                    "comma-separated, as --corpus)")
  parser.add_argument("--pairs", default="en-de", help="comma-separated, e.g. en-de,en-es")
  parser.add_argument("--out", required=True)
  parser.add_argument("--splits", default="", help="comma-separated; default: all but tst-HE")
  parser.add_argument("--asr-vocab", type=int, default=5000)
  parser.add_argument("--st-vocab", type=int, default=8000)
  parser.add_argument("--workers", type=int, default=2)
  args = parser.parse_args(argv)
  summary = prepare(args.corpus, args.root, args.pairs.split(","), args.out,
                    [s for s in args.splits.split(",") if s] or None, args.asr_vocab,
                    args.st_vocab, args.workers)
  print(json.dumps(summary, indent=1))
  with open(os.path.join(args.out, "prep_report.json"), encoding="utf-8") as f:
    report = json.load(f)
  for split, r in report.items():
    print(f"{split}: kept {r['kept']} of {r['segments']}; skipped {r['skipped'] or 'none'}; "
          f"repaired talks {r['repaired_talks'] or 'none'}")


if __name__ == "__main__":
  main()
