"""Readers of speech-translation corpora laid out on disk -> segment records.

Layouts (as distributed; the embedded corpus uses MuST-C's):

  MuST-C v1/v2   {root}/{src}-{tgt}/data/{split}/wav/{talk}.wav
                 {root}/{src}-{tgt}/data/{split}/txt/{split}.yaml|.{src}|.{tgt}
                 splits: train, dev, tst-COMMON, tst-HE
  mTEDx          {root}/{src}-{tgt}/data/{split}/wav/{talk}.flac, txt/ as MuST-C
                 splits: train, valid, test
  Europarl-ST    {root}/{src}/{tgt}/{split}/segments.lst ("speech_id start end" seconds),
                 segments.{src}, segments.{tgt}; audio {root}/{src}/audios/{speech_id}.wav|flac
                 (the distributed .m4a must be converted first); splits: train, dev, test
  CoVoST 2       {root}/{src}/validated.tsv and clips/{path} (Common Voice 4.0 for the source
                 language), {root}/{src}/covost_v2.{src}_{tgt}.tsv (the CoVoST release,
                 extracted); as fairseq's prep_covost_data.py: clips joined on `path`, train =
                 the tsv's train + train_covost rows; splits: train, dev, test

`root` may also be the `{src}-{tgt}` directory itself. A missing or wrongly laid out corpus
raises CorpusLayoutError naming the directory, the expected layout and where to get it.
"""

from __future__ import annotations

import csv
import logging
import dataclasses
import os

import yaml

from multiformer_common.errors import InvalidValue, MissingInput

try:
  _YAML_LOADER = yaml.CSafeLoader
except AttributeError:  # PyYAML without libyaml
  _YAML_LOADER = yaml.SafeLoader


class CorpusLayoutError(MissingInput):
  pass


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentRecord:
  id: str
  talk: str
  speaker: str
  audio_path: str
  offset: float          # seconds into the talk's audio
  duration: float        # seconds
  source_text: str
  target_text: str
  source_lang: str
  target_lang: str
  domain: str
  whole_file: bool = False   # the segment is the whole audio file (offset and duration unused
                             # but for planning: the duration is then an estimate)
  speed: float = 1.0         # speed perturbation: the audio played this many times as fast


_OBTAIN = {
    "mustc": "MuST-C is downloaded by hand from https://ict.fbk.eu/must-c/ (accept the licence, "
             "then untar, e.g. MUSTC_v1.0_en-de.tar.gz). Or build the embedded corpus: "
             "python -m data_prep.embedded --out data/embedded",
    "mtedx": "mTEDx is downloaded from https://www.openslr.org/100 (e.g. mtedx_es-en.tgz).",
    "europarl_st": "Europarl-ST is downloaded from https://www.mllp.upv.es/europarl-st/ "
                   "(v1.1); convert audios/*.m4a to 16 kHz wav or flac first.",
    "covost2": "CoVoST 2 needs Common Voice 4.0 for the source language "
               "(https://commonvoice.mozilla.org/datasets, untarred into {root}/{src}) and the "
               "translations, https://dl.fbaipublicfiles.com/covost/covost_v2.{src}_{tgt}.tsv"
               ".tar.gz, extracted into the same directory.",
}
SPLITS = {"mustc": ("train", "dev", "tst-COMMON", "tst-HE"),
          "mtedx": ("train", "valid", "test"),
          "europarl_st": ("train", "dev", "test"),
          "covost2": ("train", "dev", "test")}
# Common Voice clips last 5 s on average (at most 10 s); CoVoST lists no durations, and
# reading every clip's header only to plan the feature shards is not worth it.
COVOST_NOMINAL_CLIP_S = 5.0


def split_pair(pair: str) -> tuple[str, str]:
  parts = pair.split("-")
  if len(parts) != 2 or not all(parts):
    raise InvalidValue(f"language pair {pair!r} must look like 'en-de'")
  return parts[0], parts[1]


def _layout_error(corpus: str, directory: str, expected: str, problem: str):
  return CorpusLayoutError(
      f"{problem}: {directory}\nExpected layout ({corpus}):\n{expected}\n{_OBTAIN[corpus]}")


def _read_lines(path: str) -> list[str]:
  """The file's lines, stripped. Bytes that are not UTF-8 are kept as lone surrogates
  (`surrogateescape`): their segments are skipped as "text not UTF-8" (`is_utf8`), and a
  warning names the file and the first such line."""
  with open(path, encoding="utf-8", errors="surrogateescape") as f:
    lines = [line.rstrip("\n").strip() for line in f]
  _warn_not_utf8(path, lines)
  return lines


def is_utf8(text: str) -> bool:
  """Whether a text read by this module was valid UTF-8 (no byte escaped as a surrogate)."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def _warn_not_utf8(path: str, lines: list[str]):
  bad = [n for n, line in enumerate(lines, 1) if not is_utf8(line)]
  if bad:
    logging.getLogger("data_prep").warning(
        "%s: %d lines are not UTF-8 (the first: line %d); their segments are skipped as "
        "'text not UTF-8' (prep_report.json)", path, len(bad), bad[0])


def _ted_style(corpus: str, root: str, pair: str, split: str, audio_ext: str):
  src, tgt = split_pair(pair)
  base = root if os.path.basename(os.path.normpath(root)) == pair else os.path.join(root, pair)
  split_dir = os.path.join(base, "data", split)
  # MuST-C's layout holds more test sets than MuST-C's own (the embedded corpus's
  # tst-unseen-synth, dev-real, ...): a split folder that is there is read.
  if split not in SPLITS[corpus] and not (corpus == "mustc" and os.path.isdir(split_dir)):
    raise InvalidValue(f"unknown {corpus} split {split!r}; valid: {SPLITS[corpus]}" + (
        f" or a split folder under {base}/data" if corpus == "mustc" else ""))
  expected = (f"  {base}/data/{split}/wav/<talk>{audio_ext}\n"
              f"  {base}/data/{split}/txt/{split}.yaml, {split}.{src}, {split}.{tgt}")
  if not os.path.isdir(root):
    raise _layout_error(corpus, root, expected, "corpus directory does not exist")
  if not os.path.isdir(split_dir):
    raise _layout_error(corpus, split_dir, expected, f"no {pair} {split} split")
  txt = os.path.join(split_dir, "txt")
  paths = [os.path.join(txt, f"{split}.{ext}") for ext in ("yaml", src, tgt)]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise _layout_error(corpus, txt, expected, f"missing {', '.join(missing)}")
  sources, targets = _read_lines(paths[1]), _read_lines(paths[2])
  records, index_in_talk, shared = [], {}, {}
  # The strings a talk's segments repeat (talk, wav path, speaker, tags) are stored once.
  one = lambda value: shared.setdefault(value, value)
  segments = 0
  for n, seg in enumerate(yaml_segments(paths[0])):
    segments += 1
    if n >= min(len(sources), len(targets)):
      continue                                     # counted for the message below
    source, target = sources[n], targets[n]
    wav = str(seg["wav"])
    talk = one(os.path.splitext(wav)[0])
    i = index_in_talk.get(talk, 0)
    index_in_talk[talk] = i + 1
    records.append(SegmentRecord(
        id=f"{talk}_{i}", talk=talk, speaker=one(str(seg.get("speaker_id", talk))),
        audio_path=one(os.path.join(split_dir, "wav", wav)), offset=float(seg["offset"]),
        duration=float(seg["duration"]), source_text=source, target_text=target,
        source_lang=one(str(seg.get("lang", src))), target_lang=tgt,
        domain=one(str(seg.get("domain", corpus)))))
  if not segments == len(sources) == len(targets):
    raise CorpusLayoutError(f"{txt}: {segments} yaml segments but {len(sources)} lines in "
                            f"{split}.{src} and {len(targets)} in {split}.{tgt}; they must match")
  return records


YAML_CHUNK = 2000    # segments parsed per yaml.load call


def yaml_segments(path: str, chunk: int = YAML_CHUNK):
  """The segment list of a MuST-C-style yaml (a top-level sequence of mappings), streamed:
  entries are parsed `chunk` at a time, never the whole file at once (PyYAML composes a whole
  document's node tree first: about 4 KB a segment, a gigabyte at MuST-C's size). An entry
  starts at a line beginning with '-'; any other top-level form is parsed whole."""
  with open(path, encoding="utf-8") as f:
    first = ""
    for first in f:
      if first.strip() and not first.lstrip().startswith(("#", "---")):
        break
    if not first.startswith("-"):
      f.seek(0)
      yield from yaml.load(f, Loader=_YAML_LOADER) or []
      return
    lines, entries = [first], 1
    for line in f:
      if line.startswith("-"):
        if entries == chunk:
          yield from yaml.load("".join(lines), Loader=_YAML_LOADER)
          lines, entries = [], 0
        entries += 1
      lines.append(line)
    yield from yaml.load("".join(lines), Loader=_YAML_LOADER) or []


def read_mustc(root: str, pair: str = "en-de", split: str = "train") -> list[SegmentRecord]:
  return _ted_style("mustc", root, pair, split, ".wav")


def read_mtedx(root: str, pair: str = "es-en", split: str = "train") -> list[SegmentRecord]:
  return _ted_style("mtedx", root, pair, split, ".flac")


def read_europarl_st(root: str, pair: str = "de-en", split: str = "train"):
  src, tgt = split_pair(pair)
  if split not in SPLITS["europarl_st"]:
    raise InvalidValue(f"unknown europarl_st split {split!r}; valid: {SPLITS['europarl_st']}")
  split_dir = os.path.join(root, src, tgt, split)
  audio_dir = os.path.join(root, src, "audios")
  expected = (f"  {split_dir}/segments.lst, segments.{src}, segments.{tgt}\n"
              f"  {audio_dir}/<speech_id>.wav|.flac")
  if not os.path.isdir(root):
    raise _layout_error("europarl_st", root, expected, "corpus directory does not exist")
  paths = [os.path.join(split_dir, f"segments.{ext}") for ext in ("lst", src, tgt)]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise _layout_error("europarl_st", split_dir, expected, f"missing {', '.join(missing)}")
  lines, sources, targets = (_read_lines(p) for p in paths)
  if not len(lines) == len(sources) == len(targets):
    raise CorpusLayoutError(f"{split_dir}: {len(lines)} segments but {len(sources)} / "
                            f"{len(targets)} text lines; they must match")
  records, index_in_talk = [], {}
  for line, source, target in zip(lines, sources, targets):
    speech_id, start, end = line.split()[:3]
    audio = next((os.path.join(audio_dir, speech_id + ext) for ext in (".wav", ".flac")
                  if os.path.exists(os.path.join(audio_dir, speech_id + ext))),
                 os.path.join(audio_dir, speech_id + ".m4a"))
    i = index_in_talk.get(speech_id, 0)
    index_in_talk[speech_id] = i + 1
    records.append(SegmentRecord(
        id=f"{speech_id}_{i}", talk=speech_id, speaker=speech_id, audio_path=audio,
        offset=float(start), duration=float(end) - float(start), source_text=source,
        target_text=target, source_lang=src, target_lang=tgt, domain="europarl"))
  return records


def _read_tsv(path: str) -> list[dict]:
  """A Common Voice / CoVoST tsv (header row, tab-separated, no quoting) -> rows as dicts."""
  with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  _warn_not_utf8(path, ["\t".join(str(v) for v in row.values()) for row in rows])
  return rows


def read_covost2(root: str, pair: str = "fr-en", split: str = "train"):
  src, tgt = split_pair(pair)
  if split not in SPLITS["covost2"]:
    raise InvalidValue(f"unknown covost2 split {split!r}; valid: {SPLITS['covost2']}")
  base = root if os.path.basename(os.path.normpath(root)) == src else os.path.join(root, src)
  cv_tsv = os.path.join(base, "validated.tsv")
  covost_tsv = os.path.join(base, f"covost_v2.{src}_{tgt}.tsv")
  expected = (f"  {base}/validated.tsv, {base}/clips/<path>.mp3 (Common Voice 4.0, {src})\n"
              f"  {covost_tsv}")
  if not os.path.isdir(root):
    raise _layout_error("covost2", root, expected, "corpus directory does not exist")
  missing = [p for p in (cv_tsv, covost_tsv) if not os.path.isfile(p)]
  if missing:
    raise _layout_error("covost2", base, expected, f"missing {', '.join(missing)}")
  clips = {}
  for row in _read_tsv(cv_tsv):
    if "path" not in row or "sentence" not in row:
      raise CorpusLayoutError(f"{cv_tsv}: expected the columns path, sentence, client_id; "
                              f"found {sorted(row)}")
    clips[row["path"]] = row
  wanted = {split, f"{split}_covost"} if split == "train" else {split}
  records = []
  for row in _read_tsv(covost_tsv):
    if "translation" not in row or "split" not in row:
      raise CorpusLayoutError(f"{covost_tsv}: expected the columns path, translation, split; "
                              f"found {sorted(row)}")
    if row["split"] not in wanted or row["path"] not in clips:
      continue                                   # fairseq's inner join on path
    clip = clips[row["path"]]
    name = os.path.splitext(row["path"])[0]
    records.append(SegmentRecord(
        id=name, talk=name, speaker=clip.get("client_id", "") or name,
        audio_path=os.path.join(base, "clips", row["path"]), offset=0.0,
        duration=COVOST_NOMINAL_CLIP_S, source_text=clip["sentence"],
        target_text=row["translation"], source_lang=src, target_lang=tgt, domain="covost",
        whole_file=True))
  return records


READERS = {"mustc": read_mustc, "mtedx": read_mtedx, "europarl_st": read_europarl_st,
           "covost2": read_covost2}
# Another corpus's name for a split, so one split name serves corpora prepared together
# (e.g. dev = mTEDx's valid, test = MuST-C's tst-COMMON).
SPLIT_ALIASES = {"mustc": {"valid": "dev", "test": "tst-COMMON"},
                 "mtedx": {"dev": "valid", "tst-COMMON": "test"},
                 "europarl_st": {"valid": "dev", "tst-COMMON": "test"},
                 "covost2": {"valid": "dev", "tst-COMMON": "test"}}


def read_corpus(corpus: str, root: str, pair: str, split: str) -> list[SegmentRecord]:
  if corpus not in READERS:
    raise InvalidValue(f"unknown corpus {corpus!r}; valid: {sorted(READERS)} (the embedded "
                     f"corpus is read as mustc)")
  if split not in SPLITS[corpus]:
    split = SPLIT_ALIASES[corpus].get(split, split)
  return READERS[corpus](root, pair, split)


def read_corpora(corpus: str, root: str, pairs: list[str], split: str) -> list[SegmentRecord]:
  """Several corpora prepared as one dataset (multi-domain): `corpus` and `root` are
  comma-separated and aligned (e.g. 'mtedx,europarl_st' and '/data/mtedx,/data/ep'); each is
  read for every pair. With several corpora ids and talks are prefixed by the corpus name, so
  they stay unique, and each record's domain is its corpus (unless its segment list names one)."""
  corpora, roots = corpus.split(","), root.split(",")
  if len(corpora) != len(roots):
    raise InvalidValue(f"{len(corpora)} corpora ({corpus!r}) but {len(roots)} roots ({root!r}); "
                     f"give one root per corpus, comma-separated, in the same order")
  records = []
  for name, directory in zip(corpora, roots):
    for pair in pairs:
      for r in read_corpus(name, directory, pair, split):
        if len(corpora) > 1:
          r = dataclasses.replace(r, id=f"{name}_{r.id}", talk=f"{name}_{r.talk}")
        records.append(r)
  return records
