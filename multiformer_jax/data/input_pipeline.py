"""Prepared data -> padded batches bounded by frames, in a few static shapes, with masks.

Batching follows fairseq (batches bounded by padded source frames, built over length-sorted
indices) with what XLA needs: utterances fall into a small fixed set of length buckets, each
bucket has one batch size (`max_frames // bucket_length`, a multiple of the global device
count) and one padded target length, so the train step compiles once per bucket. A batch that
is not full is filled with padding examples of weight 0.

The order is a pure function of (seed, epoch): the iterator state is (epoch, batches consumed),
so a resumed run continues with exactly the next batch. Every JAX process computes the same
global plan and takes its own contiguous slice of each batch. SpecAugment (training only)
draws from generators seeded by (seed, epoch, utterance), so a resumed run sees the same
masks.
Evaluation iterates every utterance of a split exactly once. Training batches can be assembled
ahead by background worker processes into shared memory (`TrainIterator(workers=...)`), the
same batches in the same order. Features are read in place from the prepared flat files
(data_prep.feature_store) or a fairseq root's fbank80.zip.

Batch (numpy):
  features [B, T, F] float32 (F: 80 fbank bins, or a fairseq root's feature size)
  lengths [B] int32          weights [B] float32 (0 = padding)
  prev_tokens [B, U] int32 (EOS + tokens)   targets [B, U] int32 (tokens + EOS, pad = 1)
  index [B] int32 (row of the split, -1 for padding)
  ctc_targets [B, S] int32 (ST with `source_ctc`: the source transcript's ASR pieces + EOS)
  encoder_task, decoder_task [B] int32 (multi-task models, the Batcher's `tasks`: ids into the
  task names of each stack; -1 = a value the model has no task for)

A split holds the rows of the pairs its stage uses (`PipelineConfig.pairs`; by default every
pair for ASR and every translation pair, source != target, for ST: an X-X pair such as mTEDx's
ASR data is transcription only).

With `target_lang_tag` (one-to-many ST, fairseq's prepend_tgt_lang_tag) the target starts with
the <lang:xx> symbol: prev_tokens = EOS, tag, tokens; targets = tag, tokens, EOS with the tag
position padded out of the loss (fairseq's --ignore-prefix-size 1); decoding forces it.
"""

from __future__ import annotations

import array
import collections
import copy
import dataclasses
import json
import math
import os
from typing import Iterator

import numpy as np

from data_prep import features as features_lib
from data_prep.common import settings
from data_prep.common.settings import setting
from data_prep import fairseq_data, feature_store, index_io, vocab
from multiformer_jax.data import native_cmvn
from multiformer_jax.data.workers import SlotPool, WorkerPool, batch_bytes

CMVN_MODES = ("utterance", "global", "none")
SPEECH_STAGES = ("asr", "st")   # the stages whose data this pipeline reads (not the MT
                                # stage's: data/text_pairs.py; "task" is head selection's)
TAG_NAMES = ("source_lang", "target_lang", "domain", "pair", "speaker")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """How a stage's split is read and batched. The fields marked `setting` are the config keys
  data.<field> with their defaults and meaning (`config_defaults`); the others are the stage's
  (experiment.pipeline_config)."""
  prepared_dir: str
  stage: str = "st"                # asr: source transcripts; st: target translations
  max_frames: int = setting(
      40000, "padded source frames per batch (fairseq's --max-tokens): per global batch, x "
      "{stage}.update_freq per update; with data.frames_per_update set, per device")
  num_buckets: int = setting(8, "source-length buckets: distinct batch shapes per split")
  num_token_buckets: int = setting(
      1, "training: each source bucket split by target length into this many (fewer padded "
      "target tokens, more compiled shapes; 6: 13 % padded on MuST-C-like lengths, "
      "docs/benchmarks.md)")
  max_source_frames: int = setting(3000, "longer training utterances are skipped (counted)")
  max_target_tokens: int = 1023    # tokens before EOS: experiment.pipeline_config sets
                                   # model.max_target_positions - 1
  cmvn: str = setting("utterance", "utterance | global | none")
  specaugment: bool = setting(True, "SpecAugment on the training split")
  specaugment_policy: str = setting(
      "lb", "lb | ld | sm | ss (the SpecAugment paper's, fairseq's names), then optional "
      "overrides: 'sm,time_mask_p=0.1'")
  seed: int = setting(1, "the batches' order and SpecAugment's masks: a function of (seed, "
                      "epoch, position)")
  target_lang_tag: bool = setting(
      False, "ST targets start with <lang:xx> (one-to-many; forced at decoding)")
  source_ctc: bool = False         # st: batches also carry the source transcript in the ASR
                                   # vocabulary (ctc_targets), for the source CTC loss
  pairs: tuple[str, ...] = ()      # the language pairs used ('' = as the stage uses them)

  def __post_init__(self):
    if self.stage not in SPEECH_STAGES:
      raise ValueError(f"data stage {self.stage!r}; valid: {SPEECH_STAGES}")
    for name in ("num_buckets", "num_token_buckets"):
      if getattr(self, name) < 1:
        raise ValueError(f"data.{name}={getattr(self, name)}; valid: an integer >= 1")
    if self.cmvn not in CMVN_MODES:
      raise ValueError(f"data.cmvn={self.cmvn!r}; valid: {CMVN_MODES}")
    try:
      features_lib.SpecAugment.from_policy(self.specaugment_policy)
    except ValueError as e:
      raise ValueError(f"data.specaugment_policy: {e}") from None


def config_defaults() -> dict:
  """{field: default} of PipelineConfig's settings: the data.<field> keys of an experiment."""
  return settings.config_defaults(PipelineConfig)


def batch_tasks(batch):
  """(encoder task ids, decoder task ids) [batch] each of a multi-task batch (None for a stack
  without a task key), or None for a one-task model. The model clips ids into its task range,
  so a padding row's id does not matter."""
  if "encoder_task" not in batch and "decoder_task" not in batch:
    return None
  return batch.get("encoder_task"), batch.get("decoder_task")


BUCKET_FRAMES = 16           # bucket edges are multiples of this many frames


def bucket_boundaries(lengths: np.ndarray, num_buckets: int,
                      multiple: int = BUCKET_FRAMES) -> np.ndarray:
  """The at most `num_buckets` bucket edges (multiples of `multiple`, the last one the longest
  length) that minimise the padded frames of the split: the sum over utterances of the edge of
  their bucket. The cost of a batch is that of its padded shape, so these edges give the most
  real frames per compiled shape. Exact: dynamic programming over the distinct rounded
  lengths (a few hundred at most), O(num_buckets * distinct^2)."""
  rounded = np.ceil(np.maximum(np.asarray(lengths), 1) / multiple).astype(np.int64) * multiple
  values, counts = np.unique(rounded, return_counts=True)
  before = np.concatenate([[0], np.cumsum(counts)])  # utterances shorter than values[j]
  n_values = len(values)
  buckets = max(1, min(num_buckets, n_values))
  # cost[b, j]: least padded frames of the j shortest values in b buckets, the last edge values[j-1]
  cost = np.full((buckets + 1, n_values + 1), np.inf)
  cost[0, 0] = 0.0
  split = np.zeros((buckets + 1, n_values + 1), np.int64)
  for b in range(1, buckets + 1):
    for j in range(1, n_values + 1):
      candidates = cost[b - 1, :j] + values[j - 1] * (before[j] - before[:j])  # [j]
      split[b, j] = int(np.argmin(candidates))
      cost[b, j] = candidates[split[b, j]]
  edges, j, b = [], n_values, buckets
  while j > 0:
    edges.append(values[j - 1])
    j, b = split[b, j], b - 1
  return np.asarray(edges[::-1], np.int64)


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
    raise FileNotFoundError(f"{prepared_dir} is not a prepared corpus (no prepared.json); run "
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
      raise ValueError(f"split {split!r} was not prepared in {prepared}; prepared: "
                       f"{sorted(self.summary['splits'])}")
    index = index_io.load(index_path)
    pairs = np.array([f"{s}-{t}" for s, t in zip(index["source_lang"], index["target_lang"])])
    # Rows of the split -> data-source indices.
    self.rows = np.flatnonzero(np.isin(pairs, used_pairs(sorted(set(pairs)), config, split)))
    index = {name: column[self.rows] for name, column in index.items()}
    self.n_frames = index["n_frames"].astype(np.int64)
    self.ids = index["id"]
    if config.stage not in self.summary["vocab"]:
      raise ValueError(f"{prepared} has no {config.stage.upper()} vocabulary (its data has "
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
        raise ValueError(
            f"{len(damaged)} feature shard(s) of {split} in {prepared} are shorter than the "
            f"index says: {'; '.join(damaged[:5])}. Rewrite them (the corpus's audio is read "
            f"again for those shards alone): "
            f"{feature_store.REPAIR_COMMAND.format(prepared=prepared)}")
    else:
      raise ValueError(
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
        raise ValueError(
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
      raise ValueError(f"{split} of {config.prepared_dir} has none of the pairs "
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
    raise ValueError(f"data.cmvn={config.cmvn!r} but the {yaml} normalises with "
                     f"{expected['cmvn']!r}: set --config.data.cmvn={expected['cmvn']}")
  if not config.specaugment:
    return
  if not expected["specaugment"]:
    raise ValueError(f"data.specaugment is on but the {yaml} has no specaugment transform: "
                     f"set --config.data.specaugment=False")
  if (features_lib.SpecAugment.from_policy(config.specaugment_policy) !=
      features_lib.SpecAugment.from_policy(expected["specaugment"])):
    raise ValueError(f"data.specaugment_policy={config.specaugment_policy!r} differs from the "
                     f"{yaml}'s specaugment: set --config.data.specaugment_policy="
                     f"{expected['specaugment']}")


def read_gcmvn(prepared_dir: str, summary: dict) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std) of the global CMVN statistics preparation wrote from the training split."""
  stats = np.load(os.path.join(prepared_dir, summary["gcmvn"]))
  return stats["mean"], stats["std"]


def apply_cmvn(fbank: np.ndarray, cmvn: str, gcmvn=None) -> np.ndarray:
  """fbank [frames, 80] normalised as data.cmvn says: per utterance, with the global (mean,
  std) `gcmvn`, or not at all."""
  if cmvn == "utterance":
    return features_lib.utterance_cmvn(fbank)
  if cmvn == "global":
    return features_lib.global_cmvn(fbank, *gcmvn)
  return fbank


def apply_cmvn_into(fbank: np.ndarray, out: np.ndarray, cmvn: str, gcmvn=None, scratch=None):
  """out [frames, 80] = apply_cmvn(fbank, cmvn, gcmvn), the same values, written into `out`
  (utterance CMVN by the C++ function; `scratch`: float64 room for its numpy fallback)."""
  if cmvn == "utterance":
    native_cmvn.utterance_cmvn_into(fbank, out, scratch)
  elif cmvn == "global":
    np.subtract(fbank, gcmvn[0], out=out)
    np.divide(out, gcmvn[1], out=out)
  else:
    np.copyto(out, fbank)


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


@dataclasses.dataclass(frozen=True)
class TaskKey:
  """How one stack's task ids are read: the tag column and the task names in id order."""
  field: str
  names: tuple[str, ...]

  def ids(self, data: SplitData) -> np.ndarray:
    """[rows] the task id of each row of `data` (-1: a value with no task)."""
    position = {name: i for i, name in enumerate(self.names)}
    return np.array([position.get(str(v), -1) for v in data.tag_values[self.field]], np.int32)


@dataclasses.dataclass(frozen=True)
class Bucket:
  frames: int       # padded source length
  tokens: int       # padded target length (incl. EOS)
  batch_size: int   # global batch size
  source_tokens: int = 0   # padded source-transcript length of ctc_targets (0 = none)


def balanced(count: int, size: int, multiple: int) -> int:
  """The batch size (a multiple of `multiple`, at most `size`) that puts `count` utterances
  into as few batches as `size` does, as evenly as they go: the last one is not mostly
  padding."""
  batches = max(1, math.ceil(count / size))
  return min(size, math.ceil(count / batches / multiple) * multiple)


class Batcher:
  """The batch plan and the batch assembly for one split."""

  def __init__(self, data: SplitData, train: bool, global_batch_multiple: int = 1,
               process_index: int = 0, process_count: int = 1,
               tasks: dict[str, TaskKey] | None = None, skip_unfit: bool | None = None):
    """tasks: {'encoder' | 'decoder': TaskKey} of a multi-task model (batch fields
    encoder_task / decoder_task). skip_unfit (default: `train`): skip, and count in `skipped`,
    the utterances a batch cannot take whole: in training those longer than
    data.max_source_frames (fairseq's skip_invalid_size_inputs), otherwise (the dev loss)
    those longer than a batch of data.max_frames; in both, a target longer than
    max_target_tokens (it would be cut). Evaluation keeps every utterance."""
    cfg = data.config
    self.data, self.train = data, train
    self.process_index, self.process_count = process_index, process_count
    multiple = global_batch_multiple * process_count
    skip_unfit = train if skip_unfit is None else skip_unfit
    usable = np.ones(len(data), bool)
    self.skipped: dict[str, list[str]] = {}          # reason -> ids of the skipped utterances
    if skip_unfit:
      frames = cfg.max_source_frames if train else cfg.max_frames // multiple
      # Outside training, as padded to its bucket (a multiple of BUCKET_FRAMES).
      padded = data.n_frames if train else \
          -(-data.n_frames // BUCKET_FRAMES) * BUCKET_FRAMES
      for too_long, reason in (
          (padded > frames, f"longer than data.max_source_frames={frames}" if train
           else f"longer than a batch of data.max_frames={cfg.max_frames} ({frames} frames "
                f"on each of {multiple} devices)"),
          (data.target_too_long, f"a target longer than {cfg.max_target_tokens} tokens "
                                 f"(model.max_target_positions - 1)")):
        ids = [str(data.ids[i]) for i in np.flatnonzero(too_long & usable)]
        if ids:
          self.skipped[reason] = ids
        usable &= ~too_long
    self.too_long = [str(data.ids[i]) for i in np.flatnonzero(data.n_frames >
                                                               cfg.max_source_frames)] \
        if train else []
    if not usable.any():
      raise ValueError(f"every utterance of {data.split} is skipped: "
                       f"{ {r: len(ids) for r, ids in self.skipped.items()} } (shortest: "
                       f"{int(data.n_frames.min())} frames); raise data.max_source_frames, "
                       f"data.max_frames or model.max_target_positions")
    self.edges = bucket_boundaries(data.n_frames[usable], cfg.num_buckets)
    if self.edges[-1] * multiple > cfg.max_frames:
      raise ValueError(f"data.max_frames={cfg.max_frames} cannot hold {multiple} utterances "
                       f"of {self.edges[-1]} frames (one per device, the longest bucket of "
                       f"{data.split}); raise data.max_frames to at least "
                       f"{self.edges[-1] * multiple}")
    frame_bucket = np.where(usable, np.searchsorted(self.edges, data.n_frames), -1)  # [N]
    token_lens = data.tokens.lengths + 1                                  # + EOS
    source_lens = None if data.source_tokens is None else data.source_tokens.lengths + 1
    padded = lambda lens: int(math.ceil(max(lens.max() if lens.size else 1, 1) / 8) * 8)
    self.bucket_of = np.full(len(data), -1, np.int64)                     # [N]
    self.buckets = []
    for b, frames in enumerate(self.edges):
      size = max(multiple, (cfg.max_frames // int(frames)) // multiple * multiple)
      members = np.flatnonzero(frame_bucket == b)
      if not train:
        # Evaluation: the token lengths of this bucket and the shorter ones, so that a longer
        # bucket holds any mix of utterances up to it (the analyses batch chosen utterances so).
        # Its batches balanced: as many as at the full size, none mostly padding rows (each row
        # is a whole search).
        shorter = (frame_bucket <= b) & (frame_bucket >= 0)
        self.bucket_of[members] = len(self.buckets)
        if members.size:
          size = balanced(members.size, size, multiple)
        self.buckets.append(Bucket(int(frames), padded(token_lens[shorter]), size,
                                   0 if source_lens is None else padded(source_lens[shorter])))
        continue
      # Training: the bucket's utterances split further by target length (the edges that
      # pad the fewest target tokens, data.num_token_buckets of them). Splits multiply the
      # partial batches, one per split an epoch; so split buckets balance their batches (all
      # of a split one size, at most the frames' batch size) and round targets to 4, not 8.
      splits = cfg.num_token_buckets
      token_edges = bucket_boundaries(token_lens[members], splits,
                                      multiple=8 if splits == 1 else 4)
      token_bucket = np.searchsorted(token_edges, token_lens[members])
      for k, tokens in enumerate(token_edges):
        part = members[token_bucket == k]
        if not part.size:
          continue
        self.bucket_of[part] = len(self.buckets)
        self.buckets.append(Bucket(int(frames), int(tokens),
                                   size if splits == 1 else balanced(len(part), size, multiple),
                                   0 if source_lens is None else padded(source_lens[part])))
    self.task_ids = {f"{stack}_task": key.ids(data) for stack, key in (tasks or {}).items()}
    self.spec_augment = (features_lib.SpecAugment.from_policy(cfg.specaugment_policy)
                         if (train and cfg.specaugment) else None)
    if cfg.cmvn == "utterance":
      native_cmvn.kernel()            # built here once, before any worker process needs it

  @property
  def shapes(self) -> list[tuple[int, int, int]]:
    return [(b.batch_size, b.frames, b.tokens) for b in self.buckets]

  def epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """[(bucket, global indices padded with -1)] of one epoch: a function of (seed, epoch)."""
    rng = np.random.default_rng([self.data.config.seed, epoch]) if self.train else None
    plan = []
    for b, bucket in enumerate(self.buckets):
      members = np.flatnonzero(self.bucket_of == b)
      if rng is not None:
        members = rng.permutation(members)
      else:
        members = members[np.argsort(self.data.n_frames[members], kind="stable")]
      for start in range(0, len(members), bucket.batch_size):
        chunk = members[start:start + bucket.batch_size]
        plan.append((b, np.pad(chunk, (0, bucket.batch_size - len(chunk)), constant_values=-1)))
    if rng is not None:
      order = rng.permutation(len(plan))
      plan = [plan[i] for i in order]
    return plan

  def layout(self, bucket_id: int, rows: int | None = None
             ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{field: (shape, dtype)} of this process's slice of a batch of the bucket (of `rows`
    utterances; default: the bucket's batch size over the processes)."""
    bucket = self.buckets[bucket_id]
    n = bucket.batch_size // self.process_count if rows is None else rows
    fields = {"features": ((n, bucket.frames, self.data.feature_dim), np.float32),
              "lengths": ((n,), np.int32),
              "prev_tokens": ((n, bucket.tokens), np.int32),
              "targets": ((n, bucket.tokens), np.int32),
              "weights": ((n,), np.float32),
              "index": ((n,), np.int32)}
    if bucket.source_tokens:
      fields["ctc_targets"] = ((n, bucket.source_tokens), np.int32)
    for name in self.task_ids:
      fields[name] = ((n,), np.int32)
    return {name: (shape, np.dtype(dtype)) for name, (shape, dtype) in fields.items()}

  def assemble(self, bucket_id: int, indices: np.ndarray, epoch: int) -> dict:
    """This process's slice of a global batch (of any size), as new numpy arrays."""
    return assemble_new(self, bucket_id, indices, epoch)

  def assemble_into(self, batch: dict, bucket_id: int, indices: np.ndarray, epoch: int):
    """Writes this process's slice of a global batch into `batch` (arrays of `layout`, any
    previous content): every element is written, padding included. Per utterance the one
    copy is from the prepared features into the batch; CMVN and SpecAugment work in place."""
    per_process = len(indices) // self.process_count
    local = indices[self.process_index * per_process:(self.process_index + 1) * per_process]
    cfg, data = self.data.config, self.data
    batch["lengths"][:] = 1
    batch["prev_tokens"][:] = vocab.PAD_ID
    batch["targets"][:] = vocab.PAD_ID
    batch["weights"][:] = 0.0
    batch["index"][:] = local
    batch["index"][local < 0] = -1
    if "ctc_targets" in batch:
      batch["ctc_targets"][:] = vocab.PAD_ID
    for name, ids in self.task_ids.items():
      batch[name][:] = np.where(local >= 0, ids[np.maximum(local, 0)], 0)
    features = batch["features"]
    scratch = np.empty(features.shape[1:]) if cfg.cmvn == "utterance" else None  # float64
    for row, i in enumerate(local):
      if i < 0:
        features[row] = 0.0
        continue
      source = data.fbank(i)
      n = len(source)
      out = features[row, :n]                       # [frames, dim], contiguous
      features[row, n:] = 0.0
      apply_cmvn_into(source, out, cfg.cmvn, data.gcmvn, scratch)
      if self.spec_augment is not None:
        self.spec_augment.apply_in_place(out, np.random.default_rng([cfg.seed, epoch, int(i)]))
      batch["lengths"][row] = n
      tokens = data.tokens[i]
      batch["prev_tokens"][row, 0] = vocab.EOS_ID
      batch["prev_tokens"][row, 1:len(tokens) + 1] = tokens
      batch["targets"][row, :len(tokens)] = tokens
      batch["targets"][row, len(tokens)] = vocab.EOS_ID
      if data.prefix is not None:          # the language tag is given, not predicted
        batch["targets"][row, 0] = vocab.PAD_ID
      if "ctc_targets" in batch:
        source_tokens = data.source_tokens[i]
        batch["ctc_targets"][row, :len(source_tokens)] = source_tokens
        batch["ctc_targets"][row, len(source_tokens)] = vocab.EOS_ID
      batch["weights"][row] = 1.0


def assemble_new(batcher, bucket_id: int, indices: np.ndarray, epoch: int) -> dict:
  """A batcher's (Batcher's, text_pairs.TextPairBatcher's) slice of a global batch for this
  process, in new arrays of its `layout`, written by its `assemble_into`."""
  rows = len(indices) // batcher.process_count
  batch = {name: np.empty(shape, dtype) for name, (shape, dtype) in
           batcher.layout(bucket_id, rows).items()}
  batcher.assemble_into(batch, bucket_id, indices, epoch)
  return batch


class TrainIterator:
  """Endless training batches; `state()` / `restore()` give exact resumption.

  Batches are views of reused buffers (multiformer_jax.data.workers.SlotPool): a buffer is
  written again only once nothing refers to the batch it held, so the memory is touched once,
  not allocated per batch. With `workers` > 0 the batches are assembled ahead (reading, CMVN,
  SpecAugment, padding) by that many background processes straight into shared memory (multiformer_jax.data.workers),
  up to `prefetch` batches ahead of the training loop (default: two per worker), in plan
  order. A batch is a pure function of (seed, epoch, position), so prefetching changes
  neither the batches nor `state()`: the state names the next batch the loop will receive,
  whatever has been assembled ahead. Call `close()` (or use `with`) to stop the workers.
  """

  def __init__(self, batcher: Batcher, epoch: int = 0, position: int = 0, workers: int = 0,
               prefetch: int | None = None):
    self.batcher = batcher
    self.epoch, self.position = epoch, position
    self.workers = workers
    self.prefetch = max(prefetch if prefetch is not None else 2 * workers, 1)
    self._plans = {}
    self._pool = None
    self._inline_slots = None                 # buffers reused by batches assembled here
    self._pending = collections.deque()       # (number, bucket) of the next batches, in order
    self._submitted = None                    # (epoch, position) of the next batch to submit
    self._numbers = 0

  def state(self) -> dict:
    return {"epoch": self.epoch, "position": self.position}

  def restore(self, state: dict):
    self.epoch, self.position = int(state["epoch"]), int(state["position"])
    self._drop_pending()

  def __iter__(self):
    return self

  def _plan(self, epoch: int):
    if epoch not in self._plans:
      self._plans = {e: p for e, p in self._plans.items() if e >= epoch - 1}
      self._plans[epoch] = self.batcher.epoch_plan(epoch)
    return self._plans[epoch]

  def _normalise(self, epoch: int, position: int) -> tuple[int, int]:
    while position >= len(self._plan(epoch)):
      epoch, position = epoch + 1, 0
    return epoch, position

  def __next__(self) -> dict:
    self.epoch, self.position = self._normalise(self.epoch, self.position)
    if self.workers > 0:
      batch = self._next_prefetched()
    else:
      bucket, indices = self._plan(self.epoch)[self.position]
      if self._inline_slots is None:
        self._inline_slots = SlotPool(batch_bytes(self.batcher), shared=False)
      batch = self._inline_slots.views(self._inline_slots.acquire(),
                                       self.batcher.layout(bucket))
      self.batcher.assemble_into(batch, bucket, indices, self.epoch)
    self.position += 1
    return batch

  def _next_prefetched(self) -> dict:
    if self._pool is None:
      self._pool = WorkerPool(self.batcher, self.workers)
    if self._submitted is None:
      self._submitted = (self.epoch, self.position)
    while len(self._pending) < self.prefetch:
      epoch, position = self._normalise(*self._submitted)
      bucket, indices = self._plan(epoch)[position]
      self._pool.submit(self._numbers, bucket, indices, epoch)
      self._pending.append((self._numbers, bucket))
      self._numbers += 1
      self._submitted = (epoch, position + 1)
    number, bucket = self._pending.popleft()
    return self._pool.take(number, bucket)

  def _drop_pending(self):
    if self._pool is not None:
      self._pool.cancel()
    self._pending.clear()
    self._submitted = None

  def close(self):
    self._drop_pending()
    if self._pool is not None:
      self._pool.close()
      self._pool = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False


def eval_batches(batcher: Batcher) -> Iterator[dict]:
  """Every utterance of the split exactly once (padding examples have weight 0)."""
  for bucket, indices in batcher.epoch_plan(0):
    yield batcher.assemble(bucket, indices, 0)
