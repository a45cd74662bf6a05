"""The MT stage's data: a prepared split's (source transcript, translation) pairs as token
arrays, and their batches with the speech Batcher's interface (buckets, layout, epoch_plan,
assemble), so that the MT stage trains through the same iterator, steps and loop as ASR and
ST.

A pair follows the ST batch's conventions: source = the transcript's ASR pieces + EOS (the ST
batch's ctc_targets), prev_tokens = EOS + target tokens, targets = target tokens + EOS, a
target-language tag given (PAD in targets), not predicted.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common.token_ids import EOS_ID, PAD_ID
from multiformer_jax.data import input_pipeline as ip

MAX_PAIR_LENGTH = 128        # the widest pair arrays when mt.length is 0 (automatic)


@dataclasses.dataclass
class TextPairs:
  """A split's pairs as fixed-width arrays, PAD-filled (the conventions above)."""
  source: np.ndarray          # [n, length] int32
  prev: np.ndarray            # [n, length] int32
  target: np.ndarray          # [n, length] int32
  prefix: np.ndarray | None   # [n] forced first token (a target-language tag) or None
  references: list[str]
  ids: np.ndarray             # [n] the utterance id of each pair ("text-<k>": text only)
  truncated: int              # pairs with a side cut to fit `length`

  def __len__(self):
    return len(self.references)

  @property
  def width(self) -> int:
    return self.source.shape[1]

  @property
  def lengths(self) -> np.ndarray:
    """[n] the columns each pair fills: its longer side's tokens with EOS."""
    return np.maximum((self.source != PAD_ID).sum(1), (self.target != PAD_ID).sum(1))


def pair_length(data: ip.SplitData, cap: int = MAX_PAIR_LENGTH) -> int:
  """Array width for the pairs: the longer side's 99th percentile + EOS, a multiple of 8,
  at most `cap` (longer sides are cut)."""
  longest = np.maximum(data.source_tokens.lengths, data.tokens.lengths) + 1
  return int(min(cap, 8 * math.ceil(np.percentile(longest, 99) / 8)))


def _pair_arrays(pairs, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """[(source pieces, target tokens)] -> (source, prev, target [n, length], pairs cut)."""
  source, prev, target = (np.full((len(pairs), length), PAD_ID, np.int32) for _ in range(3))
  truncated = 0
  for i, (src, tgt) in enumerate(pairs):
    truncated += len(src) > length - 1 or len(tgt) > length - 1
    src, tgt = src[:length - 1], tgt[:length - 1]
    source[i, :len(src)], source[i, len(src)] = src, EOS_ID
    prev[i, 0], prev[i, 1:len(tgt) + 1] = EOS_ID, tgt
    target[i, :len(tgt)], target[i, len(tgt)] = tgt, EOS_ID
  return source, prev, target, truncated


def text_pairs(data: ip.SplitData, length: int) -> TextPairs:
  """The pairs of `data` (an ST view with the source transcripts' pieces), `length` wide."""
  pairs = [(data.source_tokens[i], data.tokens[i]) for i in range(len(data))]
  source, prev, target, truncated = _pair_arrays(pairs, length)
  return TextPairs(source, prev, target, data.prefix, list(data.references),
                   np.asarray(data.ids).astype(str), truncated)


def with_text_only(pairs: TextPairs, data: ip.SplitData) -> TextPairs:
  """`pairs` and the prepared parallel text without speech of `data`'s pairs (ASR pieces on
  the source side, the ST vocabulary's on the target side), as more rows."""
  if pairs.prefix is not None:
    raise InvalidValue("mt.text_only: the text without speech has no target-language tags; "
                     "use it with a single-target corpus (data.target_lang_tag=false)")
  used = sorted(set(map(str, data.tag_values["pair"])))
  source_lang, target_lang = used[0].split("-")
  sources = ip.text_only_lines(data.config.prepared_dir, source_lang, used)
  targets = ip.text_only_lines(data.config.prepared_dir, target_lang, used)
  asr_vocab = ip.stage_vocabulary(data.config.prepared_dir, "asr")
  extra = [(asr_vocab.encode(s), data.vocab.encode(t)) for s, t in zip(sources, targets)]
  rows = _pair_arrays(extra, pairs.width)
  source, prev, target = (np.concatenate([a, b]) for a, b in zip(
      (pairs.source, pairs.prev, pairs.target), rows[:3]))
  ids = np.concatenate([pairs.ids, [f"text-{k}" for k in range(len(extra))]])
  return TextPairs(source, prev, target, None, pairs.references + targets, ids,
                   pairs.truncated + rows[3])


def bucket_edges(lengths: np.ndarray, num_buckets: int, width: int) -> list[int]:
  """Batch widths: the lengths' quantiles at 1/num_buckets, 2/num_buckets, ... rounded up to
  multiples of 8, the last `width` (one compiled program per width)."""
  edges = {min(width, 8 * math.ceil(np.quantile(lengths, q / num_buckets) / 8))
           for q in range(1, num_buckets)}
  return sorted(edges | {width})


@dataclasses.dataclass(frozen=True)
class PairBucket:
  width: int        # padded columns of source, prev_tokens and targets
  batch_size: int   # global batch size (pairs)


class TextPairBatcher:
  """The batch plan and assembly of a split's pairs: each pair in the narrowest of
  `num_buckets` widths that holds it, `batch_size` pairs a batch (the last of a bucket padded
  with weight-0 rows); training plans are shuffled, a function of (seed, epoch)."""

  def __init__(self, pairs: TextPairs, train: bool, batch_size: int, num_buckets: int,
               seed: int, global_batch_multiple: int = 1, process_index: int = 0,
               process_count: int = 1):
    multiple = global_batch_multiple * process_count
    if batch_size < multiple or batch_size % multiple:
      raise InvalidValue(f"mt.batch={batch_size} pairs do not split evenly over {multiple} "
                       f"device(s); valid: a multiple of {multiple}")
    self.pairs, self.train, self.seed = pairs, train, seed
    self.process_index, self.process_count = process_index, process_count
    self.too_long = []                         # pairs are cut to fit, never skipped
    lengths = pairs.lengths
    self.edges = bucket_edges(lengths, num_buckets, pairs.width)
    self.bucket_of = np.searchsorted(self.edges, lengths)              # [n]
    self.buckets = [PairBucket(width, batch_size) for width in self.edges]

  @property
  def shapes(self) -> list[tuple[int, int]]:
    return [(b.batch_size, b.width) for b in self.buckets]

  def epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """[(bucket, global indices padded with -1)] of one epoch."""
    rng = np.random.default_rng([self.seed, epoch]) if self.train else None
    plan = []
    for b, bucket in enumerate(self.buckets):
      members = np.flatnonzero(self.bucket_of == b)
      members = rng.permutation(members) if rng is not None else members
      for start in range(0, len(members), bucket.batch_size):
        chunk = members[start:start + bucket.batch_size]
        plan.append((b, np.pad(chunk, (0, bucket.batch_size - len(chunk)), constant_values=-1)))
    if rng is not None:
      plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan

  def layout(self, bucket_id: int, rows: int | None = None
             ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{field: (shape, dtype)} of this process's slice of a batch of the bucket."""
    bucket = self.buckets[bucket_id]
    n = bucket.batch_size // self.process_count if rows is None else rows
    fields = {"source": ((n, bucket.width), np.int32),
              "prev_tokens": ((n, bucket.width), np.int32),
              "targets": ((n, bucket.width), np.int32),
              "lengths": ((n,), np.int32),        # source pieces with EOS
              "weights": ((n,), np.float32),
              "index": ((n,), np.int32)}
    return {name: (shape, np.dtype(dtype)) for name, (shape, dtype) in fields.items()}

  def assemble(self, bucket_id: int, indices: np.ndarray, epoch: int) -> dict:
    """This process's slice of a global batch, as new numpy arrays."""
    return ip.assemble_new(self, bucket_id, indices, epoch)

  def assemble_into(self, batch: dict, bucket_id: int, indices: np.ndarray, epoch: int):
    """Writes this process's slice of a global batch into `batch` (arrays of `layout`), every
    element, padding rows included (PAD tokens, weight 0)."""
    del epoch                                   # pairs have no random transform
    per_process = len(indices) // self.process_count
    local = indices[self.process_index * per_process:(self.process_index + 1) * per_process]
    width, real = self.buckets[bucket_id].width, local >= 0
    rows = np.maximum(local, 0)
    pairs = self.pairs
    for name, array in (("source", pairs.source), ("prev_tokens", pairs.prev),
                        ("targets", pairs.target)):
      batch[name][:] = np.where(real[:, None], array[rows, :width], PAD_ID)
    if pairs.prefix is not None:                # the language tag is given, not predicted
      batch["targets"][:, 0] = PAD_ID
    batch["lengths"][:] = np.where(real, (batch["source"] != PAD_ID).sum(1), 1)
    batch["weights"][:] = real
    batch["index"][:] = np.where(real, local, -1)
