"""Corpus on disk -> sharded flat feature files, index, SentencePiece models and a prep report.

    python -m data_prep.prepare --corpus mustc --root data/embedded --pairs en-de \
        --out data/prepared/embedded_en_de --asr-vocab 1000 --st-vocab 1000

Steps (fairseq's MuST-C recipe, REFERENCE §2):
1. The talks of each split, sorted, are cut into shards of about `shard_frames` frames
   (estimated from the segment durations; at least one shard per worker). The plan is saved
   (`shards/plan.json`) so that a rerun writes the same shards.
2. Workers (default: the machine's cores) each write whole shards. Per talk: read the audio
   once (downmix / resample if needed), cut the segments, compute 80-dim Kaldi fbank; filter:
   fewer than 5 frames, empty text or text that is not UTF-8 everywhere, more than 3000 frames
   in train; unreadable
   audio, segments past the end and non-finite features are skipped, every skip and repair
   counted by reason. A talk's features are cached atomically under `features/` until its
   shard is complete, then the talk is streamed into the shard's flat float32 file
   (`frames/{split}/`, data_prep.feature_store: read in place by offset, no decoding), which
   appears (a rename) after its sidecar `shards/{split}/*.json` (index columns, talk reports,
   CMVN sums). Memory per worker is one talk, whatever the corpus size; a kill loses at most
   the talks in flight, and a rerun finishes the rest.
3. An index per split (`index/{split}.npz`: lengths, texts, tags, each row's shard file and
   offset, in shard order), global CMVN statistics from the train shards and the SentencePiece
   models come from the sidecars, without reading the features again.
`prepared.json` is written last: its presence means the preparation is complete. The records
and their order depend only on the corpus, not on the number of workers.

`--corpus fairseq --root MUSTC_ROOT/en-de` reads what fairseq's prep script wrote in place
(data_prep.fairseq_data): only the index and prepared.json are written.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import errno
import json
import multiprocessing
import os
import signal

import numpy as np

from multiformer_common.errors import InvalidValue, MissingInput, ResourceError, UserError
from data_prep import corpora, fairseq_data, feature_store, features, index_io, vocab
from multiformer_common import atomic, cli_errors, locks, signals
from data_prep.audio import AudioError, cut_segment, load_audio
from multiformer_common.progress import progress_bar

MIN_FRAMES = 5
MAX_TRAIN_FRAMES = 3000
GCMVN_MAX_UTTERANCES = 150_000
EXAMPLES_PER_REASON = 20
META_FIELDS = ("id", "talk", "speaker", "source_text", "target_text", "source_lang",
               "target_lang", "domain")
FRAMES_PER_SECOND = 100
FAULT_ENV = "MULTIFORMER_JAX_FAULT"            # as multiformer_jax.runtime.faults (tests only)
# About 320 MB of float32 features per shard: MuST-C En-De train (~400 h) is ~150 shards.
DEFAULT_SHARD_FRAMES = 1_000_000
WORKER_POLL_S = 5.0                            # how often the shards in progress are checked


def _atomic_json(path: str, value):
  atomic.write_json(path, value, indent=1, ensure_ascii=False)


def _read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def process_talk(job) -> dict:
  """Features of one talk's segments -> cached npz; returns its report entries."""
  cache_path, records, is_train = job
  if os.path.exists(cache_path):
    with np.load(cache_path, allow_pickle=False) as cached:
      return json.loads(str(cached["report"]))
  kept, feats, skipped, repairs = [], [], [], []
  try:
    audio, repairs = load_audio(records[0].audio_path)
  except AudioError as e:
    audio, skipped = None, [(r.id, e.reason) for r in records]
  for r in records if audio is not None else []:
    if not corpora.is_utf8(r.source_text) or not corpora.is_utf8(r.target_text):
      skipped.append((r.id, "text not UTF-8"))
      continue
    if not r.source_text.strip() or not r.target_text.strip():
      skipped.append((r.id, "empty text"))
      continue
    try:
      segment = audio if r.whole_file else cut_segment(audio, r.offset, r.duration)
    except AudioError as e:
      skipped.append((r.id, e.reason))
      continue
    if not np.all(np.isfinite(segment)):   # the fbank of NaN/inf samples is not finite
      skipped.append((r.id, "non-finite features"))
      continue
    segment = features.speed_perturb(segment, r.speed)
    try:
      fb = features.fbank(segment)
    except Exception as e:  # pylint: disable=broad-except  # counted, never a crash mid-corpus
      skipped.append((r.id, f"feature extraction failed ({type(e).__name__})"))
      continue
    if len(fb) < MIN_FRAMES:
      skipped.append((r.id, f"fewer than {MIN_FRAMES} frames"))
    elif is_train and len(fb) > MAX_TRAIN_FRAMES:
      skipped.append((r.id, f"more than {MAX_TRAIN_FRAMES} frames (train)"))
    elif not np.all(np.isfinite(fb)):
      skipped.append((r.id, "non-finite features"))
    else:
      kept.append(r)
      feats.append(fb)
  del audio                                 # a talk's audio is the worker's largest array
  report = {"kept": len(kept), "skipped": skipped, "repairs": repairs}
  arrays = {"report": json.dumps(report),
            "meta": json.dumps([{k: getattr(r, k) for k in META_FIELDS} for r in kept]),
            "lengths": np.array([len(f) for f in feats], np.int64),
            "fbank": np.concatenate(feats) if feats else np.zeros((0, 80), np.float32)}
  tmp = cache_path + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, cache_path)
  return report


def _talk_examples(path):
  """Yields the examples of one cached talk."""
  with np.load(path, allow_pickle=False) as cached:
    meta = json.loads(str(cached["meta"]))
    starts = np.concatenate([[0], np.cumsum(cached["lengths"])])
    fbank = cached["fbank"]
    for i, m in enumerate(meta):
      fb = fbank[starts[i]:starts[i + 1]]
      yield dict(m, fbank=fb, n_frames=len(fb))


def plan_shards(talk_jobs: list, shard_frames: int, min_shards: int) -> list[list[int]]:
  """Consecutive groups of talks (indices into talk_jobs) of about `shard_frames` estimated
  frames each (a group closes once it reaches them), split further until there are
  `min_shards` groups where the talks allow it (so that every worker has a shard)."""
  estimated = [sum(max(r.duration, 0.0) for r in records) * FRAMES_PER_SECOND
               for _, records, _ in talk_jobs]
  shards, current, frames = [], [], 0.0
  for i, talk_frames in enumerate(estimated):
    current.append(i)
    frames += talk_frames
    if frames >= shard_frames:
      shards.append(current)
      current, frames = [], 0.0
  if current or not shards:
    shards.append(current)
  size = lambda shard: sum(estimated[i] for i in shard)
  while len(shards) < min_shards and any(len(shard) > 1 for shard in shards):
    k = max((k for k, shard in enumerate(shards) if len(shard) > 1),
            key=lambda k: size(shards[k]))
    shard, half = shards[k], size(shards[k]) / 2
    cut = next(j for j in range(1, len(shard)) if size(shard[:j]) >= half or
               j == len(shard) - 1)
    shards[k:k + 1] = [shard[:cut], shard[cut:]]
  return shards


def parse_speeds(text: str) -> tuple[float, ...]:
  """'0.9,1.0,1.1' -> (0.9, 1.0, 1.1); '' -> (). Refuses what is not positive numbers."""
  try:
    speeds = tuple(float(x) for x in text.split(",") if x.strip())
  except ValueError:
    speeds = (-1.0,)
  if any(s <= 0 for s in speeds):
    raise InvalidValue(f"speed perturbation {text!r}; valid: comma-separated positive factors, "
                     f"e.g. 0.9,1.0,1.1 (Kaldi's)")
  return speeds


def speed_perturbed(records, factors, domains=()) -> list:
  """The records at every speed of `factors`, in the same talks (a talk's audio is read once):
  the ids of the copies at a speed other than 1 start with `sp{factor}-`. A copy is cut from
  the talk as its original is, then perturbed. With `domains`, only the records of those
  domains get copies (e.g. the recorded speech among synthetic)."""
  factors = tuple(float(f) for f in factors)
  if any(f <= 0 for f in factors):
    raise InvalidValue(f"speed perturbation {factors}; valid: positive factors, e.g. 0.9,1.0,1.1")
  if not factors or factors == (1.0,):
    return records
  out = []
  for r in records:
    for f in (factors if not domains or r.domain in domains else (1.0,)):
      out.append(r if f == 1.0 else dataclasses.replace(
          r, id=f"sp{f:g}-{r.id}", speed=f, duration=r.duration / f if r.whole_file else
          r.duration))
  return out


def _fault_point(name: str, whole_group: bool = True):
  """Tests: `MULTIFORMER_JAX_FAULT=prepare.train.shard:3` SIGKILLs the whole preparation (this
  process group: the main process and every worker) once shard 3 of train is written;
  `prepare.train.worker:3` SIGKILLs the worker alone as it starts shard 3."""
  points = {p.strip() for p in os.environ.get(FAULT_ENV, "").split(",")} - {""}
  if name in points:
    if whole_group:
      os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _running_marker(sidecar_path: str) -> str:
  """The file that names the worker writing a shard (beside its sidecar)."""
  return f"{sidecar_path}.worker"


def write_shard(job) -> dict:
  """Worker: the talks of one shard -> its feature file and sidecar; returns the sidecar.
  A shard already written is not redone."""
  shard_path, sidecar_path, talk_jobs, is_train, fault_name = job
  if os.path.exists(shard_path) and os.path.exists(sidecar_path):
    return without_index(_read_json(sidecar_path))
  with open(_running_marker(sidecar_path), "w", encoding="utf-8") as f:  # which worker has it
    f.write(str(os.getpid()))
  _fault_point(fault_name.replace(".shard:", ".worker:"), whole_group=False)
  try:
    reports = [process_talk(talk) for talk in talk_jobs]
    columns = collections.defaultdict(list)
    stats = features.GlobalCMVNStats()
    count = 0
    with feature_store.ShardWriter(shard_path, features.NUM_MEL_BINS) as writer:
      for cache_path, _, _ in talk_jobs:
        for example in _talk_examples(cache_path):
          columns["feature_offset"].append(writer.write(example["fbank"]))
          columns["n_frames"].append(int(example["n_frames"]))
          for name in META_FIELDS:
            columns[name].append(example[name])
          if is_train:
            stats.add(example["fbank"])
          count += 1
      sidecar = {"count": count, "num_bytes": writer.rows * 4 * features.NUM_MEL_BINS,
                 "talks": reports,
                 "index": columns,
                 "cmvn": None if not stats.count else {
                     "utterances": count, "frames": stats.count,
                     "sum": stats.total.tolist(), "sum_sq": stats.total_sq.tolist()}}
      _atomic_json(sidecar_path, sidecar)          # before the shard appears (on close)
  except OSError as error:
    if error.errno == errno.ENOSPC:
      raise ResourceError(error.errno, f"disk full while writing {shard_path}: the shards and talk "
                    f"features already written are kept; free space on that disk and rerun "
                    f"the same command to finish") from error
    raise
  _fault_point(fault_name)
  for cache_path, _, _ in talk_jobs:               # the shard holds them now
    if os.path.exists(cache_path):
      os.remove(cache_path)
  os.remove(_running_marker(sidecar_path))
  return without_index(sidecar)


class WorkerDied(UserError, ChildProcessError):
  """A preparation worker died (killed, often for lack of memory) while writing a shard."""


def write_shards(jobs: list, workers: int, progress: bool):
  """Runs write_shard over `jobs` in `workers` processes, a fresh one per shard
  (maxtasksperchild=1: a worker's peak is one shard's, not one shard's plus what earlier shards
  left in its heap). Workers ignore Ctrl-C and SIGUSR1 sent to the process group (SIGTERM
  ends them: the shard they write is written again on the rerun). A worker that dies would
  leave its shard's result missing for ever (the pool replaces the worker, not its task):
  every WORKER_POLL_S the shards in progress are checked, each naming the pid that took it,
  and a dead one stops the preparation with WorkerDied, naming the shard; every shard
  finished before is kept, so the same command resumes from there."""
  for _, sidecar, *_ in jobs:            # left by workers of an earlier, killed run
    if os.path.exists(_running_marker(sidecar)):
      os.remove(_running_marker(sidecar))
  signals.start_resource_tracker()
  with signals.stop_signals_blocked():        # the workers start ignoring Ctrl-C and SIGUSR1
    pool = multiprocessing.get_context("spawn").Pool(
        min(workers, len(jobs)), maxtasksperchild=1, initializer=signals.ignore_interrupts)
  with pool:
    results = pool.imap_unordered(write_shard, jobs)
    bar = progress_bar(total=len(jobs), desc="features -> shards", unit="shard",
                       disable=not progress)
    try:
      for _ in range(len(jobs)):
        while True:
          try:
            results.next(timeout=WORKER_POLL_S)
            break
          except multiprocessing.TimeoutError:
            died = _dead_workers(jobs)
            if died:
              raise WorkerDied(_dead_worker_message(died)) from None
        bar.update(1)
    finally:
      bar.close()


def _dead_workers(jobs: list) -> list[str]:
  """'shard (pid P)' of each shard in progress whose worker is dead."""
  died = []
  for shard, sidecar, *_ in jobs:
    marker = _running_marker(sidecar)
    try:
      with open(marker, encoding="utf-8") as f:
        pid = int(f.read() or 0)
    except (FileNotFoundError, ValueError):
      continue
    if pid and not _alive(pid) and not os.path.exists(sidecar):
      died.append(f"{shard} (pid {pid})")
  return died


def _dead_worker_message(died: list[str]) -> str:
  return (f"a preparation worker died while writing {', '.join(died)}: killed (often for "
          f"lack of memory: fewer --workers, or a smaller --shard-frames, lower each worker's "
          f"peak). The shards finished before are kept; rerun the same command to resume from "
          f"there")


def _alive(pid: int) -> bool:
  """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False
  except OSError:                       # no /proc: ask the kernel
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    return True


def without_index(sidecar: dict) -> dict:
  """A sidecar as the main process keeps it: its index columns stay in the file (one Python
  object per segment would add up to gigabytes at MuST-C's size); `write_split_index` reads
  them one sidecar at a time."""
  return {key: value for key, value in sidecar.items() if key != "index"}


def write_split_index(path: str, sidecar_paths: list[str]):
  """index/{split}.npz from the shards' sidecars (in shard order), read one at a time into
  arrays; `feature_file` is the row's shard."""
  builder = index_io.ColumnsBuilder()
  for shard, sidecar_path in enumerate(sidecar_paths):
    columns = _read_json(sidecar_path)["index"]
    if columns:                                   # a shard of talks without usable segments
      builder.add({**columns,
                   "feature_file": np.full(len(columns["n_frames"]), shard, np.int32)})
  builder.save(path)


def _split_report(segments: int, sidecars) -> dict:
  skipped, repairs, kept = collections.Counter(), collections.Counter(), 0
  examples = collections.defaultdict(list)
  for sidecar in sidecars:
    for talk in sidecar["talks"]:
      kept += talk["kept"]
      repairs.update(talk["repairs"])
      for utt, reason in talk["skipped"]:
        skipped[reason] += 1
        if len(examples[reason]) < EXAMPLES_PER_REASON:
          examples[reason].append(utt)
  return {"segments": segments, "kept": kept, "skipped": dict(skipped),
          "skipped_examples": dict(examples), "repaired_talks": dict(repairs)}


def _global_cmvn(train_sidecars):
  """fairseq's global CMVN statistics over the first GCMVN_MAX_UTTERANCES training utterances,
  taken in whole shards (the last shard used may go past the limit)."""
  stats, utterances = features.GlobalCMVNStats(), 0
  for sidecar in train_sidecars:
    if utterances >= GCMVN_MAX_UTTERANCES or not sidecar["cmvn"]:
      continue
    cmvn = sidecar["cmvn"]
    stats.add_sums(cmvn["frames"], np.array(cmvn["sum"]), np.array(cmvn["sum_sq"]))
    utterances += cmvn["utterances"]
  return stats


TEXT_ONLY_DIR = "text"


def copy_text_only(root: str, pairs: list[str], out: str) -> dict[str, list[str]]:
  """Parallel text without speech that a MuST-C-style root holds beside a pair's splits
  ({root}/{pair}/text/{name}.{src} and .{tgt}, line by line) -> copied to
  {out}/text/{pair}/; returns {pair: [names]}. Nothing trains on it unless a setting asks
  (mt.text_only: the MT stage)."""
  found = {}
  for pair in pairs:
    src, tgt = corpora.split_pair(pair)
    folder = os.path.join(root, pair, TEXT_ONLY_DIR)
    if "," in root or not os.path.isdir(folder):
      continue
    names = sorted({f.rsplit(".", 1)[0] for f in os.listdir(folder)})
    for name in names:
      sides = [_read_lines(os.path.join(folder, f"{name}.{lang}")) for lang in (src, tgt)]
      if len(sides[0]) != len(sides[1]):
        raise InvalidValue(f"{folder}/{name}: {len(sides[0])} {src} lines but {len(sides[1])} "
                         f"{tgt} lines; text without speech is parallel, line by line")
      target_dir = os.path.join(out, TEXT_ONLY_DIR, pair)
      os.makedirs(target_dir, exist_ok=True)
      for lang, lines in zip((src, tgt), sides):
        with open(os.path.join(target_dir, f"{name}.{lang}"), "w", encoding="utf-8") as f:
          f.writelines(line + "\n" for line in lines)
    found[pair] = names
  return found


def _read_lines(path: str) -> list[str]:
  if not os.path.isfile(path):
    raise MissingInput(f"{path}: text without speech needs both languages' files")
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def plan_jobs(corpus: str, root: str, pairs: list[str], out: str, splits: list[str],
              workers: int, shard_frames: int, eval_only_pairs=(), speed_perturb=(),
              train_only_pairs=(), speed_perturb_domains=()) -> tuple[dict, dict]:
  """Reads every split's segment list first (layout errors surface before any work is done)
  and plans its shards (kept in shards/plan.json: a rerun writes the same shards) -> ({split:
  [write_shard jobs]}, {split: segments listed}). The jobs hold the records."""
  records = {s: corpora.read_corpora(corpus, root, pairs + list(eval_only_pairs) if i else
                                     pairs + list(train_only_pairs), s)
             for i, s in enumerate(splits)}
  records[splits[0]] = speed_perturbed(records[splits[0]], speed_perturb, speed_perturb_domains)
  plan_path = os.path.join(out, "shards", "plan.json")
  os.makedirs(os.path.dirname(plan_path), exist_ok=True)
  plan = _read_json(plan_path) if os.path.exists(plan_path) else {}
  jobs = {}
  for split, recs in records.items():
    talks = collections.defaultdict(list)
    for r in recs:
      talks[(r.source_lang, r.target_lang, r.talk)].append(r)
    cache_dir = os.path.join(out, "features", split)
    os.makedirs(cache_dir, exist_ok=True)
    os.makedirs(os.path.join(out, "shards", split), exist_ok=True)
    talk_jobs = [(os.path.join(cache_dir, f"{s}-{t}_{talk}.npz"), rs,
                  split == "train") for (s, t, talk), rs in sorted(talks.items())]
    if split not in plan or sum(map(len, plan[split])) != len(talk_jobs):
      plan[split] = plan_shards(talk_jobs, shard_frames, workers)
    n = len(plan[split])
    jobs[split] = [
        (feature_store.shard_path(out, split, k, n),
         os.path.join(out, "shards", split, f"{k:05d}-of-{n:05d}.json"),
         [talk_jobs[i] for i in talk_ids], split == "train", f"prepare.{split}.shard:{k}")
        for k, talk_ids in enumerate(plan[split])]
  _atomic_json(plan_path, plan)
  return jobs, {split: len(recs) for split, recs in records.items()}


def prepare(corpus: str, root: str, pairs: list[str], out: str, splits: list[str] | None = None,
            asr_vocab: int = 5000, st_vocab: int = 8000, workers: int | None = None,
            progress: bool = True, shard_frames: int = DEFAULT_SHARD_FRAMES,
            eval_only_pairs: list[str] = (), speed_perturb: tuple[float, ...] = (),
            train_only_pairs: list[str] = (), speed_perturb_domains: tuple[str, ...] = ()
            ) -> dict:
  """`pairs` are prepared for every split, `eval_only_pairs` (directions without training
  data: zero-shot) for every split but the first (the training split), `train_only_pairs`
  (transcribed speech without held-out splits) for the first only. A pair X-X (mTEDx's ASR
  data) is transcription: its text trains the ASR vocabulary only. speed_perturb: the
  training split holds each utterance at each of these speeds (Kaldi's 0.9, 1.0, 1.1; the
  copies' ids start with `sp{factor}-`); () = as recorded. speed_perturb_domains: only these
  domains' utterances are perturbed; () = every one. One preparation writes into `out` at a
  time: another one (ablate --jobs starts several) waits for it, then reads its result."""
  done_marker = os.path.join(out, "prepared.json")
  if os.path.exists(done_marker):
    return _read_json(done_marker)
  with locks.DirectoryLock(out, "preparation").acquire(wait=True):
    if os.path.exists(done_marker):          # prepared by the one this one waited for
      return _read_json(done_marker)
    return _prepare(corpus, root, pairs, out, splits, asr_vocab, st_vocab, workers, progress,
                    shard_frames, eval_only_pairs, speed_perturb, train_only_pairs,
                    speed_perturb_domains)


def _prepare(corpus, root, pairs, out, splits, asr_vocab, st_vocab, workers, progress,
             shard_frames, eval_only_pairs, speed_perturb, train_only_pairs,
             speed_perturb_domains) -> dict:
  done_marker = os.path.join(out, "prepared.json")
  if corpus == "fairseq":     # fairseq's prepared root, read in place: an index only
    return fairseq_data.write_index(root, out, splits, [p for p in pairs if p] or None)
  workers = workers or os.cpu_count() or 1
  splits = splits or [s for s in corpora.SPLITS[corpus.split(",")[0]] if s != "tst-HE"]
  eval_only_pairs = [p for p in eval_only_pairs if p not in pairs]
  train_only_pairs = [p for p in train_only_pairs if p not in pairs]
  jobs, segments = plan_jobs(corpus, root, pairs, out, splits, workers, shard_frames,
                             eval_only_pairs, speed_perturb, train_only_pairs,
                             speed_perturb_domains)
  sidecars = {}
  all_jobs = [job for split in splits for job in jobs[split]
              if not (os.path.exists(job[0]) and os.path.exists(job[1]))]
  if all_jobs:
    write_shards(all_jobs, workers, progress)
  for split in splits:                  # every shard and its sidecar are written now
    sidecars[split] = [without_index(_read_json(job[1])) for job in jobs[split]]

  report = {split: _split_report(segments[split], sidecars[split]) for split in splits}
  for split, r in report.items():
    if r["kept"] == 0:
      raise InvalidValue(f"no usable segment in {split} of {root} ({pairs}): {r['skipped']}")
  _atomic_json(os.path.join(out, "prep_report.json"), report)

  index_dir = os.path.join(out, "index")
  os.makedirs(index_dir, exist_ok=True)
  for split in splits:
    write_split_index(os.path.join(index_dir, f"{split}.npz"), [job[1] for job in jobs[split]])

  text_only = copy_text_only(root, pairs + list(train_only_pairs), out)
  stats = _global_cmvn(sidecars.get("train", []))
  if stats.count:
    mean, std = stats.mean_std()
    np.savez(os.path.join(out, "gcmvn.npz"), mean=mean, std=std)

  train_index = index_io.load(os.path.join(index_dir, f"{splits[0]}.npz"))
  translations = [p for p in pairs + eval_only_pairs if len(set(corpora.split_pair(p))) == 2]
  # One-to-many corpora get fairseq's <lang:xx> target tags (data.target_lang_tag uses them).
  target_langs = sorted({corpora.split_pair(p)[1] for p in translations or pairs})
  tags = tuple(vocab.lang_tag(l) for l in target_langs) if len(target_langs) > 1 else ()
  translated = train_index["source_lang"] != train_index["target_lang"]
  st_texts = train_index["target_text"][translated] if translated.any() else \
      train_index["target_text"]
  vocabularies = {
      "asr": vocab.train_sentencepiece(list(train_index["source_text"]),
                                       os.path.join(out, "spm_asr"), asr_vocab),
      "st": vocab.train_sentencepiece(list(st_texts), os.path.join(out, "spm_st"), st_vocab,
                                      tags)}
  summary = {"corpus": corpus, "root": ",".join(map(os.path.abspath, root.split(","))),
             "pairs": pairs, "eval_only_pairs": eval_only_pairs,
             "train_only_pairs": train_only_pairs, "text_only": text_only,
             "splits": {s: report[s]["kept"] for s in splits},
             "features": feature_store.FORMAT, "feature_dim": features.NUM_MEL_BINS,
             "feature_files": {s: feature_store.relative_files(out, s, len(jobs[s]))
                               for s in splits},
             "shards": {s: len(jobs[s]) for s in splits},
             "vocab": {task: {"model": os.path.basename(p), "size": vocab.Vocabulary(p).size}
                       for task, p in vocabularies.items()},
             "gcmvn": "gcmvn.npz" if stats.count else None,
             "speed_perturb": list(speed_perturb),
             "speed_perturb_domains": list(speed_perturb_domains)}
  _atomic_json(done_marker, summary)
  return summary


def repair(out: str, workers: int | None = None, progress: bool = True) -> list[str]:
  """Rewrites the feature shards of a prepared corpus that are not the size their sidecars
  recorded (cut short by a full disk or a copy that stopped), from the corpus's audio, each
  as first written (the saved shard plan: the same talks, rows and offsets); the index,
  vocabularies and statistics stay as they are. -> the shards rewritten."""
  summary = _read_json(os.path.join(out, "prepared.json"))
  if summary.get("features") != feature_store.FORMAT:
    raise InvalidValue(f"{out} holds no feature shards of its own to repair "
                     f"({summary.get('features')})")
  splits = list(summary["splits"])
  with locks.DirectoryLock(out, "preparation").acquire(wait=True):
    jobs, _ = plan_jobs(summary["corpus"], summary["root"], summary["pairs"], out, splits,
                        workers or os.cpu_count() or 1, DEFAULT_SHARD_FRAMES,
                        summary["eval_only_pairs"], tuple(summary["speed_perturb"]),
                        summary["train_only_pairs"], tuple(summary["speed_perturb_domains"]))
    damaged, recorded = [], {}
    for job in (job for split in splits for job in jobs[split]):
      shard, sidecar = job[0], job[1]
      written = _read_json(sidecar)
      if not os.path.exists(shard) or os.path.getsize(shard) != written["num_bytes"]:
        damaged.append(job)
        recorded[shard] = written["index"]
        os.remove(sidecar)                 # write_shard skips a shard with both
    if damaged:
      write_shards(damaged, workers or os.cpu_count() or 1, progress)
    for shard, sidecar, *_ in damaged:
      if _read_json(sidecar)["index"] != recorded[shard]:
        raise InvalidValue(f"{shard} was rewritten, but its rows differ from the index's: the "
                         f"corpus in {summary['root']} changed since it was prepared; prepare "
                         f"it into a new directory")
  return [job[0] for job in damaged]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--corpus", default="mustc",
                      help=f"{', '.join(sorted(corpora.READERS))}; several comma-separated "
                           f"(multi-domain), with one --root each; or fairseq: the directory "
                           f"fairseq's prep script wrote (fbank80.zip, *_st.tsv, config_st.yaml"
                           f"), indexed in place")
  parser.add_argument("--root", help="the corpus download directory (several: "
                                     "comma-separated, as --corpus)")
  parser.add_argument("--pairs", default="", help="comma-separated, e.g. en-de,en-es "
                      "(default: en-de; for a fairseq root, its directory's name)")
  parser.add_argument("--eval-only-pairs", default="",
                      help="comma-separated pairs without training data, prepared for the "
                           "other splits only (zero-shot directions, e.g. mTEDx's it-en)")
  parser.add_argument("--train-only-pairs", default="",
                      help="comma-separated pairs prepared for the training split only "
                           "(transcribed speech without held-out splits, e.g. en-en)")
  parser.add_argument("--out", required=True)
  parser.add_argument("--splits", default="", help="comma-separated; default: all but tst-HE")
  parser.add_argument("--asr-vocab", type=int, default=5000)
  parser.add_argument("--st-vocab", type=int, default=8000)
  parser.add_argument("--workers", type=int, default=None,
                      help="feature workers (default: the machine's cores)")
  parser.add_argument("--shard-frames", type=int, default=DEFAULT_SHARD_FRAMES,
                      help="frames per ArrayRecord shard (about 320 bytes each)")
  parser.add_argument("--speed-perturb", default="",
                      help="training utterances at each of these speeds, e.g. 0.9,1.0,1.1 "
                           "(Kaldi's speed perturbation); default: as recorded")
  parser.add_argument("--speed-perturb-domains", default="",
                      help="comma-separated: perturb only these domains' utterances (the "
                           "segment lists' domain, e.g. queen); default: every one")
  parser.add_argument("--repair", action="store_true",
                      help="rewrite the feature shards of the prepared corpus in --out that "
                           "are cut short, from its audio (the rest stays as it is)")
  args = parser.parse_args(argv)
  if args.repair:
    rewritten = repair(args.out, args.workers)
    print(f"{args.out}: {len(rewritten)} shard(s) rewritten{': ' if rewritten else ''}"
          f"{', '.join(rewritten)}")
    return
  if not args.root:
    parser.error("--root is required (the corpus download directory), but with --repair")
  pairs = args.pairs or ("" if args.corpus == "fairseq" else "en-de")
  summary = prepare(args.corpus, args.root, pairs.split(","), args.out,
                    [s for s in args.splits.split(",") if s] or None, args.asr_vocab,
                    args.st_vocab, args.workers, shard_frames=args.shard_frames,
                    eval_only_pairs=[p for p in args.eval_only_pairs.split(",") if p],
                    train_only_pairs=[p for p in args.train_only_pairs.split(",") if p],
                    speed_perturb=parse_speeds(args.speed_perturb),
                    speed_perturb_domains=tuple(
                        d for d in args.speed_perturb_domains.split(",") if d))
  print(json.dumps(summary, indent=1))
  with open(os.path.join(args.out, "prep_report.json"), encoding="utf-8") as f:
    report = json.load(f)
  for split, r in report.items():
    print(f"{split}: kept {r['kept']} of {r['segments']}; skipped {r['skipped'] or 'none'}; "
          f"repaired talks {r['repaired_talks'] or 'none'}")


# The command line and console script: user errors -> their message and exit status 2.
cli = cli_errors.command_line_entry(main)


if __name__ == "__main__":
  cli()
