"""A fairseq-prepared speech-to-text root, read in place as a prepared dataset.

fairseq's `examples/speech_to_text/prep_mustc_data.py` (and the CoVoST / mTEDx ones) leave in
the data root:
  fbank80.zip                    .npy feature matrices [frames, 80], stored uncompressed
  {split}_{asr,st}.tsv           id, audio (fbank80.zip:OFFSET:LENGTH), n_frames, tgt_text,
                                 speaker (optional: src_text, src_lang, tgt_lang)
  config_{asr,st}.yaml           vocab_filename, bpe_tokenizer.sentencepiece_model, transforms
  spm_unigram*_{asr,st}.model    + the .txt dictionary: fairseq's ids are <s> <pad> </s> <unk>
                                 and then the .txt's lines in order
A multilingual or multi-domain root of fairseq's examples/attention_head_selection has one
manifest per subset instead, {split}_{src}_{tgt}_{domain}.tsv (train_de_de_tedx.tsv): its
split is the union of its subsets, and each row's source_lang, target_lang and domain are its
file name's, as that task reads them (src == tgt: a transcript, an ASR row).

`write_index` turns the TSVs into this project's index (`index/{split}.npz`, `prepared.json`,
`prep_report.json`) and copies nothing else: the features are read from the zip by each row's
byte offset (`ZipFeatures`), the vocabularies are fairseq's own files with their dictionary ids
(data_prep.vocab.DictionaryVocabulary), so the output layer of an imported fairseq checkpoint
lines up. The yaml's feature transforms are recorded (`transforms`) and the input pipeline
refuses a config that disagrees with them.

Rows that cannot be used (a malformed audio entry, offsets past the end of the zip, no frames,
empty text, no translation for a transcript) are skipped and counted with their reason, as
data_prep.prepare does; a missing zip, TSV column or vocabulary file refuses the whole root.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import os
import re

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep import features as features_lib
from data_prep import index_io, vocab
from multiformer_common import atomic

TSV_COLUMNS = ("id", "audio", "n_frames", "tgt_text")   # fairseq's required manifest columns
TASKS = ("asr", "st")
SUPPORTED_TRANSFORMS = ("utterance_cmvn", "global_cmvn", "specaugment")
EXAMPLES_PER_REASON = 5
NPY_MAGIC = b"\x93NUMPY"
SPLIT_ORDER = ("train", "dev", "tst-COMMON", "tst-HE")   # the training split first


class FairseqDataError(InvalidValue):
  """A fairseq data root that cannot be read: names the file, the value and what was expected."""


def tsv_columns(path: str) -> list[str]:
  """A manifest's header; refused without fairseq's required columns."""
  with open(path, encoding="utf-8", newline="") as f:
    columns = f.readline().rstrip("\r\n").split("\t")
  missing = [c for c in TSV_COLUMNS if c not in columns]
  if missing:
    raise FairseqDataError(f"{path}: no column {', '.join(missing)}; a fairseq manifest has "
                           f"{', '.join(TSV_COLUMNS)} (and speaker, src_text, src_lang, "
                           f"tgt_lang where present); its header is {columns}")
  return columns


def tsv_rows(path: str):
  """A manifest's rows one at a time, read as fairseq reads them (speech_to_text_dataset's
  csv.DictReader: tab-separated, no quoting)."""
  with open(path, encoding="utf-8", newline="") as f:
    yield from csv.DictReader(f, delimiter="\t", quotechar=None, doublequote=False,
                              lineterminator="\n", quoting=csv.QUOTE_NONE)


# fairseq's head-selection subsets: `split_src_tgt_domain`, four fields split on "_".
SUBSET = re.compile(r"([^_]+)_([^_]+)_([^_]+)_([^_]+)\.tsv")


def subset_manifests(root: str) -> dict[str, list[tuple[str, tuple[str, str, str]]]]:
  """{split: [(manifest path, (src, tgt, domain))]} of a head-selection root, subsets sorted;
  {} for a root with {split}_{asr,st}.tsv manifests (those come first)."""
  names = sorted(os.listdir(root))
  if any(re.fullmatch(r"(.+)_(asr|st)\.tsv", name) for name in names):
    return {}
  subsets = collections.defaultdict(list)
  for name in names:
    match = SUBSET.fullmatch(name)
    if match:
      subsets[match.group(1)].append((os.path.join(root, name), match.groups()[1:]))
  return dict(subsets)


def find_splits(root: str) -> list[str]:
  """The splits with a manifest in `root`, the training split first."""
  found = set(subset_manifests(root))
  for name in os.listdir(root):
    match = re.fullmatch(r"(.+)_(asr|st)\.tsv", name)
    if match:
      found.add(match.group(1))
  if not found:
    raise FairseqDataError(f"{root} has no fairseq manifest ({{split}}_asr.tsv or "
                           f"{{split}}_st.tsv, or head selection's {{split}}_SRC_TGT_DOMAIN.tsv): "
                           f"is it the directory fairseq's prep script wrote (e.g. "
                           f"MUSTC_ROOT/en-de)?")
  rank = {s: i for i, s in enumerate(SPLIT_ORDER)}
  return sorted(found, key=lambda s: (rank.get(s, len(rank)), s))


def _resolve(root: str, path: str, what: str, yaml_path: str) -> str:
  """A file a yaml names: as written (fairseq writes absolute paths), else beside the yaml."""
  for candidate in (path, os.path.join(root, path), os.path.join(root, os.path.basename(path))):
    if candidate and os.path.isfile(candidate):
      return os.path.abspath(candidate)
  raise FairseqDataError(f"{yaml_path}: {what} {path!r} not found (looked as written and in "
                         f"{root})")


def read_yaml(root: str, task: str, path: str | None = None) -> dict | None:
  """The task's yaml (`path`, default ROOT/config_{task}.yaml), None if there is none."""
  if path is not None and not os.path.isfile(path):
    raise FairseqDataError(f"{path} not found (the {task} yaml of the fairseq data root)")
  path = path or os.path.join(root, f"config_{task}.yaml")
  if not os.path.isfile(path):
    return None
  import yaml  # pylint: disable=import-outside-toplevel
  with open(path, encoding="utf-8") as f:
    config = yaml.safe_load(f) or {}
  config["_path"] = path
  return config


def yaml_vocabulary(root: str, config: dict) -> dict:
  """{"model": the SentencePiece model, "dictionary": the .txt, "size": ids} of a task yaml."""
  path = config["_path"]
  tokenizer = config.get("bpe_tokenizer") or {}
  if tokenizer.get("bpe", "sentencepiece") != "sentencepiece" or \
      "sentencepiece_model" not in tokenizer:
    raise FairseqDataError(f"{path}: bpe_tokenizer {tokenizer!r}; supported: bpe: "
                           f"sentencepiece with a sentencepiece_model")
  if "vocab_filename" not in config:
    raise FairseqDataError(f"{path}: no vocab_filename (the .txt dictionary)")
  model = _resolve(root, tokenizer["sentencepiece_model"], "sentencepiece_model", path)
  dictionary = _resolve(root, config["vocab_filename"], "vocab_filename", path)
  return {"model": model, "dictionary": dictionary,
          "size": vocab.DictionaryVocabulary(model, dictionary).size}


def yaml_transforms(root: str, config: dict) -> dict:
  """What the yaml's feature transforms mean here: {"cmvn": utterance | global | none,
  "specaugment": a features.SpecAugment policy string or "" (training split only),
  "gcmvn": the global statistics file or None, "prepend_tgt_lang_tag": whether targets start
  with their <lang:xx> tag}."""
  path = config["_path"]
  transforms = config.get("transforms") or config.get("feature_transforms") or {}
  general = list(transforms.get("*", []))
  train = list(transforms.get("_train", general))
  unknown = sorted(set(general + train) - set(SUPPORTED_TRANSFORMS))
  if unknown:
    raise FairseqDataError(f"{path}: transforms {unknown} are not supported; supported: "
                           f"{', '.join(SUPPORTED_TRANSFORMS)}")
  cmvn = "global" if "global_cmvn" in general else (
      "utterance" if "utterance_cmvn" in general else "none")
  gcmvn = None
  if cmvn == "global":
    stats = (config.get("global_cmvn") or {}).get("stats_npz_path")
    if not stats:
      raise FairseqDataError(f"{path}: global_cmvn without global_cmvn.stats_npz_path")
    gcmvn = _resolve(root, stats, "global_cmvn.stats_npz_path", path)
  policy = ""
  if "specaugment" in train:
    spec = config.get("specaugment") or {}
    if spec.get("time_wrap_W", 0):
      raise FairseqDataError(f"{path}: specaugment time_wrap_W={spec['time_wrap_W']}; time "
                             f"warping is not implemented here (valid: 0)")
    fields = {"freq_mask_n": int(spec.get("freq_mask_N", 0)),
              "freq_mask_f": int(spec.get("freq_mask_F", 0)),
              "time_mask_n": int(spec.get("time_mask_N", 0)),
              "time_mask_t": int(spec.get("time_mask_T", 0)),
              "time_mask_p": float(spec.get("time_mask_p", 1.0))}
    policy = "lb," + ",".join(f"{k}={v}" for k, v in fields.items())
    features_lib.SpecAugment.from_policy(policy)        # validates the values
  return {"cmvn": cmvn, "specaugment": policy, "gcmvn": gcmvn,
          "prepend_tgt_lang_tag": bool(config.get("prepend_tgt_lang_tag", False))}


def parse_audio(value: str) -> tuple[str, int, int] | None:
  """'fbank80.zip:OFFSET:LENGTH' -> (zip path, offset, length), or None if malformed."""
  parts = value.rsplit(":", 2)
  if len(parts) != 3 or not parts[0]:
    return None
  try:
    offset, length = int(parts[1]), int(parts[2])
  except ValueError:
    return None
  return (parts[0], offset, length) if offset >= 0 and length > 0 else None


def default_pair(root: str) -> tuple[str, str] | None:
  """The pair a root's directory name spells (MUSTC_ROOT/en-de), or None."""
  name = os.path.basename(os.path.normpath(root))
  match = re.fullmatch(r"([a-z]{2,3})-([a-z]{2,3})", name)
  return (match.group(1), match.group(2)) if match else None


FLUSH_ROWS = 20000     # index rows converted to arrays at a time


def _manifests(root: str, split: str, pair: tuple[str, str] | None):
  """-> [(manifest path, its columns, "st" | "asr", {id: transcript}, (src, tgt, domain) or
  None)] of one split: its ST (else ASR) manifest with the ASR manifest's transcripts, or each
  of its head-selection subsets with the languages and domain of its name."""
  subsets = subset_manifests(root).get(split)
  if subsets:
    return [(path, tsv_columns(path), "asr" if tags[0] == tags[1] else "st", {}, tags)
            for path, tags in subsets]
  manifests = {}
  for task in TASKS:
    path = os.path.join(root, f"{split}_{task}.tsv")
    if os.path.isfile(path):
      manifests[task] = (path, tsv_columns(path))
  lead = "st" if "st" in manifests else "asr"
  lead_path, lead_columns = manifests[lead]
  transcripts = {}
  if "asr" in manifests and lead == "st":
    transcripts = {row["id"]: row["tgt_text"] for row in tsv_rows(manifests["asr"][0])}
  if pair is None and not {"src_lang", "tgt_lang"} <= set(lead_columns):
    raise FairseqDataError(f"{lead_path}: no src_lang / tgt_lang columns and the root's name "
                           f"{os.path.basename(os.path.normpath(root))!r} is not a pair like "
                           f"en-de: pass the pair (--pairs en-de)")
  return [(lead_path, lead_columns, lead, transcripts, None)]


def _split_rows(root: str, split: str, pair: tuple[str, str] | None, zips: list[str],
                zip_sizes: dict[str, int]):
  """-> (index columns of the usable rows, report) of one split: the ST manifest's rows with
  the ASR manifest's transcripts (an ASR-only root: the transcripts as X-X pairs), or the rows
  of every head-selection subset of the split."""
  manifests = _manifests(root, split, pair)
  skipped, examples = collections.Counter(), collections.defaultdict(list)
  columns = collections.defaultdict(list)
  rows = index_io.ColumnsBuilder()      # the columns as arrays, FLUSH_ROWS rows at a time
  rows.first, rows.pairs, kept = None, set(), 0

  def flush():
    for name, dtype in (("n_frames", np.int64), ("audio_offset", np.int64),
                        ("audio_length", np.int64), ("audio_file", np.int32)):
      columns[name] = np.asarray(columns[name], dtype)
    rows.add(columns)
    columns.clear()

  def skip(row_id, reason):
    skipped[reason] += 1
    if len(examples[reason]) < EXAMPLES_PER_REASON:
      examples[reason].append(row_id)

  segments = 0
  for lead_path, lead_columns, lead, transcripts, tags in manifests:
    for row in tsv_rows(lead_path):
      segments += 1
      row_id = row["id"]
      audio = parse_audio(row["audio"] or "")
      if audio is None:
        skip(row_id, "audio is not ZIP:OFFSET:LENGTH")
        continue
      zip_path = os.path.abspath(os.path.join(root, audio[0]))
      if zip_path not in zip_sizes:
        if not os.path.isfile(zip_path):
          raise FairseqDataError(f"{lead_path}: row {row_id} names {audio[0]}, which is not "
                                 f"in {root} (the features fairseq's prep script zipped)")
        zip_sizes[zip_path] = os.path.getsize(zip_path)
        zips.append(zip_path)
      if audio[1] + audio[2] > zip_sizes[zip_path]:
        skip(row_id, "offset past the end of the zip")
        continue
      try:
        n_frames = int(row["n_frames"])
      except (TypeError, ValueError):
        n_frames = 0
      if n_frames < 1:
        skip(row_id, "n_frames is not a positive integer")
        continue
      target = (row["tgt_text"] or "").strip()
      if lead == "st":
        source = (transcripts.get(row_id) if transcripts else row.get("src_text")) or ""
        if transcripts and row_id not in transcripts:
          skip(row_id, f"no transcript in {split}_asr.tsv")
          continue
      else:
        source = target
      source = source.strip()
      has_source = lead == "asr" or bool(transcripts) or "src_text" in lead_columns
      if not target or (has_source and not source):
        skip(row_id, "empty text")
        continue
      if tags:
        src_lang, tgt_lang, domain = tags
      else:
        src_lang = row.get("src_lang") or (pair[0] if pair else "")
        tgt_lang = row.get("tgt_lang") or (pair[1] if pair else "")
        domain = "fairseq"
      if lead == "asr":
        tgt_lang = src_lang
      columns["id"].append(row_id)
      columns["n_frames"].append(n_frames)
      columns["talk"].append(row_id.rsplit("_", 1)[0])
      columns["speaker"].append(row.get("speaker") or "")
      columns["source_text"].append(source)
      columns["target_text"].append(target)
      columns["source_lang"].append(src_lang)
      columns["target_lang"].append(tgt_lang)
      columns["domain"].append(domain)
      columns["audio_file"].append(zips.index(zip_path))
      columns["audio_offset"].append(audio[1])
      columns["audio_length"].append(audio[2])
      if rows.first is None:
        rows.first = {"id": row_id, "audio_file": zips.index(zip_path),
                      "audio_offset": audio[1], "audio_length": audio[2]}
      rows.pairs.add(f"{src_lang}-{tgt_lang}")
      kept += 1
      if len(columns["id"]) == FLUSH_ROWS:
        flush()
  if columns:
    flush()
  report = {"segments": segments, "kept": kept, "skipped": dict(skipped),
            "skipped_examples": dict(examples), "repaired_talks": {},
            "manifests": [os.path.basename(m[0]) for m in manifests]}
  return rows, report


def write_index(root: str, out: str, splits: list[str] | None = None,
                pairs: list[str] | None = None, yaml_paths: dict | None = None) -> dict:
  """Writes `out`/prepared.json, index/{split}.npz and prep_report.json from a fairseq data
  root (no features are copied). `yaml_paths`: {task: yaml} where not ROOT/config_{task}.yaml.
  Returns the summary; an existing one is returned as it is."""
  marker = os.path.join(out, "prepared.json")
  if os.path.exists(marker):
    with open(marker, encoding="utf-8") as f:
      return json.load(f)
  if not os.path.isdir(root):
    raise FairseqDataError(f"fairseq data root {root!r} is not a directory")
  root = os.path.abspath(root)
  available = find_splits(root)
  splits = splits or available
  missing = [s for s in splits if s not in available]
  if missing:
    raise FairseqDataError(f"{root}: no manifest for split(s) {missing}; found: {available}")
  pair = None
  if pairs:
    if len(pairs) != 1 or "-" not in pairs[0]:
      raise FairseqDataError(f"pairs {pairs}: a fairseq root holds one pair (e.g. en-de); "
                             f"several target languages come from its tgt_lang column")
    pair = tuple(pairs[0].split("-", 1))
  pair = pair or default_pair(root)

  yamls = {task: read_yaml(root, task, (yaml_paths or {}).get(task)) for task in TASKS}
  vocabularies, transforms = {}, {}
  for task, config in yamls.items():
    if config is not None:
      vocabularies[task] = yaml_vocabulary(root, config)
      transforms[task] = yaml_transforms(root, config)
  if "st" not in vocabularies and "asr" not in vocabularies:
    raise FairseqDataError(f"{root} has neither config_st.yaml nor config_asr.yaml: the "
                           f"vocabulary and transforms come from them")
  if len({t["cmvn"] for t in transforms.values()}) > 1:
    raise FairseqDataError(f"{root}: config_asr.yaml and config_st.yaml normalise the features "
                           f"differently ({ {k: v['cmvn'] for k, v in transforms.items()} }); "
                           f"one prepared dataset has one normalisation")

  zips, zip_sizes = [], {}
  indexes, report = {}, {}
  for split in splits:
    indexes[split], report[split] = _split_rows(root, split, pair, zips, zip_sizes)
    if report[split]["kept"] == 0:
      raise FairseqDataError(f"no usable row in {split} of {root}: {report[split]['skipped']}")
  feature_dim = _feature_dim(zips, indexes)

  os.makedirs(os.path.join(out, "index"), exist_ok=True)
  for split, rows in indexes.items():
    rows.save(os.path.join(out, "index", f"{split}.npz"))
  with open(os.path.join(out, "prep_report.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  gcmvn = next((t["gcmvn"] for t in transforms.values() if t["gcmvn"]), None)
  first = indexes[splits[0]]
  summary = {
      "corpus": "fairseq", "root": root,
      "pairs": sorted(first.pairs),
      "eval_only_pairs": [], "splits": {s: report[s]["kept"] for s in splits},
      "features": "fairseq_zip", "zips": zips, "feature_dim": feature_dim,
      "vocab": vocabularies, "gcmvn": gcmvn,
      "transforms": {task: {"cmvn": t["cmvn"], "specaugment": t["specaugment"],
                            "prepend_tgt_lang_tag": t["prepend_tgt_lang_tag"]}
                     for task, t in transforms.items()},
      "speed_perturb": []}
  atomic.write_json(marker, summary, indent=1)
  return summary


def _feature_dim(zips: list[str], indexes: dict) -> int:
  """The feature size of each split's first row (fbank80: 80): a zip of something else than
  .npy feature matrices, or splits of different sizes, are refused before anything is
  written."""
  dims = {}
  for split, rows in indexes.items():
    first = rows.first
    reader = ZipFeatures(zips, [first["audio_file"]], [first["audio_offset"]],
                         [first["audio_length"]])
    features = reader.read(0, first["id"])
    reader.close()
    if features.ndim != 2:
      raise FairseqDataError(f"{zips[first['audio_file']]}: row {first['id']} of "
                             f"{split} holds an array of shape {features.shape}; expected "
                             f"[frames, features] (fbank80: [frames, 80])")
    dims[split] = int(features.shape[1])
  if len(set(dims.values())) != 1:
    raise FairseqDataError(f"the splits' features differ in size: {dims}")
  return next(iter(dims.values()))


class ZipFeatures:
  """Feature matrices read from fairseq zips by byte offset (no zip directory is parsed: the
  manifest's offsets point at each .npy's bytes). Opens its files lazily, so it pickles to
  loader worker processes without them. With `feature_dim`, a matrix of another width is
  refused with its row."""

  def __init__(self, zips, file_ids, offsets, lengths, feature_dim: int | None = None):
    self.zips = list(zips)
    self.feature_dim = feature_dim
    self.file_ids = np.asarray(file_ids, np.int32)
    self.offsets = np.asarray(offsets, np.int64)
    self.lengths = np.asarray(lengths, np.int64)
    self._files = {}

  def __getstate__(self):
    return {**self.__dict__, "_files": {}}

  def read(self, i: int, row_id: str = "") -> np.ndarray:
    file_id = int(self.file_ids[i])
    handle = self._files.get(file_id)
    if handle is None:
      handle = self._files[file_id] = open(self.zips[file_id], "rb")  # pylint: disable=consider-using-with
    handle.seek(int(self.offsets[i]))
    data = handle.read(int(self.lengths[i]))
    where = f"{self.zips[file_id]} at offset {int(self.offsets[i])}" + (
        f" (row {row_id})" if row_id else "")
    if not data.startswith(NPY_MAGIC):
      raise FairseqDataError(f"{where}: not a .npy matrix (fairseq's fbank80.zip stores .npy "
                             f"files uncompressed; a waveform zip is not supported)")
    try:
      features = np.load(io.BytesIO(data), allow_pickle=False).astype(np.float32, copy=False)
    except ValueError as e:
      raise FairseqDataError(f"{where}: unreadable .npy: {e}") from None
    if self.feature_dim is not None and (features.ndim != 2 or
                                         features.shape[1] != self.feature_dim):
      raise FairseqDataError(f"{where}: features of shape {features.shape}; the data's are "
                             f"[frames, {self.feature_dim}]")
    return features

  def close(self):
    for handle in self._files.values():
      handle.close()
    self._files = {}
