"""Batches of a split: the bucket plan (source-length buckets with one batch size and one
padded target length each, so the train step compiles once per bucket), the Batcher that
assembles a batch (features, CMVN, SpecAugment, targets, task ids, padding rows), and the
evaluation order (every utterance once).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep import features as features_lib
from data_prep import vocab
from multiformer_jax.data import native_cmvn
from multiformer_jax.data.cmvn import apply_cmvn_into
from multiformer_jax.data.prepared import SplitData
from multiformer_jax.data.task_keys import TaskKey


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
      raise InvalidValue(f"every utterance of {data.split} is skipped: "
                       f"{ {r: len(ids) for r, ids in self.skipped.items()} } (shortest: "
                       f"{int(data.n_frames.min())} frames); raise data.max_source_frames, "
                       f"data.max_frames or model.max_target_positions")
    self.edges = bucket_boundaries(data.n_frames[usable], cfg.num_buckets)
    if self.edges[-1] * multiple > cfg.max_frames:
      raise InvalidValue(f"data.max_frames={cfg.max_frames} cannot hold {multiple} utterances "
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


def eval_batches(batcher: Batcher) -> Iterator[dict]:
  """Every utterance of the split exactly once (padding examples have weight 0)."""
  for bucket, indices in batcher.epoch_plan(0):
    yield batcher.assemble(bucket, indices, 0)
