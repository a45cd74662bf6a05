"""A prepared split read in place: the summary, vocabularies and parallel text of a prepared
directory, and `SplitData` (a split's data source, lengths, token ids and tags, loaded once;
its token rows as `Ragged` arrays). The features stay in the prepared flat files
(data_prep.feature_store) or a fairseq root's fbank80.zip.
"""

from __future__ import annotations

import array
import copy
import json
import os

import numpy as np

from multiformer_common.errors import InvalidValue, MissingInput
from data_prep import features as features_lib
from data_prep import fairseq_data, feature_store, index_io, vocab
from multiformer_jax.data.cmvn import read_gcmvn
from multiformer_jax.data.pipeline_config import PipelineConfig, TAG_NAMES


class Ragged:
  """Rows of token ids of different lengths as two arrays (the ids joined, the row starts),
  not one array object per row: a MuST-C split holds 229k of them."""

  def __init__(self, rows=(), values: np.ndarray | None = None,
               starts: np.ndarray | None = None):
    """`rows`: any iterable of int sequences (a generator: never all held as lists at once),
    or the two arrays themselves."""
    if values is None:
      flat, lengths = array.array("i"), array.array("q", [0])
      for row in rows:
        flat.extend(row)
        lengths.append(len(row))
      values = np.frombuffer(flat, np.int32).copy() if flat else np.zeros(0, np.int32)
      starts = np.cumsum(np.frombuffer(lengths, np.int64))
    self.values, self.starts = values, starts

  def __len__(self) -> int:
    return len(self.starts) - 1

  def __getitem__(self, i: int) -> np.ndarray:
    return self.values[self.starts[i]:self.starts[i + 1]]

  def __iter__(self):
    return (self[i] for i in range(len(self)))

  @property
  def lengths(self) -> np.ndarray:
    return np.diff(self.starts)

  def take(self, keep: np.ndarray) -> "Ragged":
    """The rows where the boolean `keep` is true."""
    keep = np.asarray(keep, bool)
    starts = np.zeros(int(keep.sum()) + 1, np.int64)
    np.cumsum(self.lengths[keep], out=starts[1:])
    return Ragged(values=self.values[np.repeat(keep, self.lengths)], starts=starts)


def stage_vocabulary(prepared_dir: str, stage: str):
  """The prepared vocabulary of `stage` (asr: the transcripts' pieces; st: the targets')."""
  return vocab.load(prepared_dir, read_summary(prepared_dir)["vocab"][stage])


def text_only_lines(prepared_dir: str, language: str, pairs=None) -> list[str]:
  """The `language` side of the prepared parallel text without speech (prepare's text_only),
  of `pairs` (None: every pair)."""
  lines = []
  for pair, names in sorted(read_summary(prepared_dir).get("text_only", {}).items()):
    if pairs is not None and pair not in pairs or language not in pair.split("-"):
      continue
    for name in names:
      with open(os.path.join(prepared_dir, "text", pair, f"{name}.{language}"),
                encoding="utf-8") as f:
        lines += [line.rstrip("\n") for line in f]
  return lines


def read_summary(prepared_dir: str) -> dict:
  """A prepared dataset's prepared.json (splits, vocabularies, features); refused with the
  command that makes one."""
  marker = os.path.join(prepared_dir, "prepared.json")
  if not os.path.exists(marker):
    raise MissingInput(f"{prepared_dir} is not a prepared corpus (no prepared.json); run "
                            f"python -m data_prep.prepare --out {prepared_dir} ...")
  with open(marker, encoding="utf-8") as f:
    return json.load(f)


class SplitData:
  """A prepared split: its data source, lengths, token ids and tags (loaded once)."""

  def __init__(self, config: PipelineConfig, split: str):
    prepared = config.prepared_dir
    self.summary = read_summary(prepared)
    self.config = config
    self.split = split
    index_path = os.path.join(prepared, "index", f"{split}.npz")
    if not os.path.exists(index_path):
      raise InvalidValue(f"split {split!r} was not prepared in {prepared}; prepared: "
                       f"{sorted(self.summary['splits'])}")
    index = index_io.load(index_path)
    pairs = np.array([f"{s}-{t}" for s, t in zip(index["source_lang"], index["target_lang"])])
    # Rows of the split -> data-source indices.
    self.rows = np.flatnonzero(np.isin(pairs, used_pairs(sorted(set(pairs)), config, split)))
    index = {name: column[self.rows] for name, column in index.items()}
    self.n_frames = index["n_frames"].astype(np.int64)
    self.ids = index["id"]
    if config.stage not in self.summary["vocab"]:
      raise InvalidValue(f"{prepared} has no {config.stage.upper()} vocabulary (its data has "
                       f"{sorted(self.summary['vocab'])} only): train.stages cannot include "
                       f"{config.stage}")
    self.vocab = vocab.load(prepared, self.summary["vocab"][config.stage])
    check_transforms(self.summary, config)
    texts = index["source_text" if config.stage == "asr" else "target_text"]
    self.prefix = self._lang_tag_ids(index["target_lang"]) if (
        config.target_lang_tag and config.stage == "st") else None
    self.tokens = self._target_tokens(texts)
    self.references = [str(t) for t in texts]
    # The source transcript's ASR pieces (+ EOS in the batch) for ST's source-transcript CTC.
    self.source_tokens = None
    if config.source_ctc and config.stage == "st":
      asr_vocab = vocab.load(prepared, self.summary["vocab"]["asr"])
      self.source_tokens = Ragged(asr_vocab.encode(str(t))[:config.max_target_tokens]
                                  for t in index["source_text"])
    self.tag_values = {name: pairs[self.rows] if name == "pair" else index[name]
                       for name in TAG_NAMES}
    self.feature_dim = int(self.summary.get("feature_dim", features_lib.NUM_MEL_BINS))
    self.zip_features = self.store = None
    kind = self.summary.get("features")
    if kind == "fairseq_zip":                   # data_prep.fairseq_data's index
      self.zip_features = fairseq_data.ZipFeatures(
          self.summary["zips"], index["audio_file"], index["audio_offset"],
          index["audio_length"], self.feature_dim)
    elif kind == feature_store.FORMAT:
      self.store = feature_store.FeatureStore(
          [os.path.join(prepared, f) for f in self.summary["feature_files"][split]],
          index["feature_file"], index["feature_offset"], self.n_frames, self.feature_dim)
      damaged = self.store.damaged_files()
      if damaged:
        raise InvalidValue(
            f"{len(damaged)} feature shard(s) of {split} in {prepared} are shorter than the "
            f"index says: {'; '.join(damaged[:5])}. Rewrite them (the corpus's audio is read "
            f"again for those shards alone): "
            f"{feature_store.REPAIR_COMMAND.format(prepared=prepared)}")
    else:
      raise InvalidValue(
          f"{prepared} was prepared in an earlier format (features inside TFDS ArrayRecord "
          f"records, decompressed and decoded one by one); convert it once with "
          f"{feature_store.CONVERT_COMMAND.format(prepared=prepared)}")
    self.gcmvn = read_gcmvn(prepared, self.summary) if config.cmvn == "global" else None

  def subset(self, keep: np.ndarray) -> "SplitData":
    """The same split restricted to the rows where `keep` [rows] is true."""
    part = copy.copy(self)
    part.rows = self.rows[keep]
    part.n_frames, part.ids = self.n_frames[keep], self.ids[keep]
    part.tokens = self.tokens.take(keep)
    part.target_too_long = self.target_too_long[keep]
    if self.source_tokens is not None:
      part.source_tokens = self.source_tokens.take(keep)
    part.references = [r for r, k in zip(self.references, keep) if k]
    part.prefix = None if self.prefix is None else self.prefix[keep]
    part.tag_values = {name: values[keep] for name, values in self.tag_values.items()}
    if self.store is not None:
      part.store = self.store.take(keep)
    if self.zip_features is not None:
      z = self.zip_features
      part.zip_features = fairseq_data.ZipFeatures(z.zips, z.file_ids[keep], z.offsets[keep],
                                                   z.lengths[keep], z.feature_dim)
    return part

  def _target_tokens(self, texts) -> Ragged:
    """Each row's target pieces, after its language tag where there is one, cut to
    max_target_tokens; `target_too_long` [rows] marks the rows that were cut (training and dev
    batches skip them, counted: Batcher)."""
    limit = self.config.max_target_tokens - (self.prefix is not None)
    prefixes = [()] * len(texts) if self.prefix is None else [(p,) for p in self.prefix]
    too_long = []

    def rows():                      # one row at a time: never every encoding at once
      for prefix, text in zip(prefixes, texts):
        pieces = self.vocab.encode(str(text))
        too_long.append(len(pieces) > limit)
        yield list(prefix) + pieces[:limit]
    tokens = Ragged(rows())
    self.target_too_long = np.array(too_long, bool)
    return tokens

  def _lang_tag_ids(self, target_langs) -> np.ndarray:
    ids = {}
    for lang in sorted(set(map(str, target_langs))):
      ids[lang] = self.vocab.symbol_id(vocab.lang_tag(lang))
      if ids[lang] is None:
        raise InvalidValue(
            f"data.target_lang_tag is set but the ST vocabulary {self.vocab.path} has no "
            f"{vocab.lang_tag(lang)} symbol: data_prep.prepare adds the tags when the corpus "
            f"has several target languages (pairs {self.summary.get('pairs')}); set "
            f"data.target_lang_tag=false for a single target language")
    return np.array([ids[str(l)] for l in target_langs], np.int32)

  def __len__(self):
    return len(self.n_frames)

  def fbank(self, i: int) -> np.ndarray:
    """Row i's [frames, dim] float32 features (a read-only view of the prepared files)."""
    if self.zip_features is not None:
      return self.zip_features.read(i, str(self.ids[i]))
    return self.store.view(i)


def used_pairs(present: list[str], config: PipelineConfig, split: str) -> list[str]:
  """Of the pairs `present` in a split, those its stage uses: PipelineConfig.pairs, or by
  default all (ASR) or the translation pairs (ST; all if the split has none)."""
  if config.pairs:
    used = [p for p in config.pairs if p in present]
    if not used:
      raise InvalidValue(f"{split} of {config.prepared_dir} has none of the pairs "
                       f"{list(config.pairs)} (the {config.stage} stage's pairs); it has "
                       f"{present}")
    return used
  if config.stage == "st":
    translation = [p for p in present if p.split("-")[0] != p.split("-")[1]]
    return translation or list(present)
  return list(present)


def check_transforms(summary: dict, config: PipelineConfig):
  """A fairseq data root's yaml says how its features are normalised and augmented (the
  model was trained so): a config that disagrees is refused with the setting that agrees."""
  expected = summary.get("transforms", {}).get(config.stage)
  if not expected:
    return
  yaml = f"config_{config.stage}.yaml of {summary.get('root')}"
  if config.cmvn != expected["cmvn"]:
    raise InvalidValue(f"data.cmvn={config.cmvn!r} but the {yaml} normalises with "
                     f"{expected['cmvn']!r}: set --config.data.cmvn={expected['cmvn']}")
  if not config.specaugment:
    return
  if not expected["specaugment"]:
    raise InvalidValue(f"data.specaugment is on but the {yaml} has no specaugment transform: "
                     f"set --config.data.specaugment=False")
  if (features_lib.SpecAugment.from_policy(config.specaugment_policy) !=
      features_lib.SpecAugment.from_policy(expected["specaugment"])):
    raise InvalidValue(f"data.specaugment_policy={config.specaugment_policy!r} differs from the "
                     f"{yaml}'s specaugment: set --config.data.specaugment_policy="
                     f"{expected['specaugment']}")


def split_tags(data: SplitData) -> dict[str, list[str]]:
  """{tag name: sorted distinct values} of the rows of `data`."""
  return {name: sorted(set(map(str, values))) for name, values in data.tag_values.items()}


def tag_inventory(prepared_dir: str, split: str) -> dict[str, list[str]]:
  """{tag name: sorted distinct values} over every pair of a prepared split (its index only):
  with the training split, the task names of a multi-task model, the same for every stage."""
  index = index_io.load(os.path.join(prepared_dir, "index", f"{split}.npz"))
  sources, targets = index["source_lang"].astype(str), index["target_lang"].astype(str)
  return {"source_lang": sorted(set(sources)), "target_lang": sorted(set(targets)),
          "domain": sorted(set(index["domain"].astype(str))),
          "pair": sorted({f"{s}-{t}" for s, t in zip(sources, targets)})}
