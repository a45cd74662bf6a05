"""Transcribe and translate audio files with a trained run: the library of the `translate`
command (multiformer_jax/translate.py, where its options are).

For each file: the transcript (ASR stage) and the translation (ST stage), decoded with the
run's evaluation settings from its saved config (checkpoint selection, beam, length limits,
joint CTC weight, word-LM rescoring, speaking-rate normalisation).
Audio is read as preparation reads it (any rate and channel count: downmixed and resampled to
16 kHz mono), turned into the same Kaldi fbank features and normalised as training normalised
them (data.cmvn). A file longer than --segment_seconds is cut at its pauses (`pauses`) into
segments of at most that length, decoded separately and joined; silent segments are left out.

Files are decoded in batches, as evaluation decodes a split: each segment is padded to the
smallest of a fixed ladder of frame buckets (`frame_buckets`: 2.56 s, then x1.5, up to
--segment_seconds), and each bucket's batches have one size, so each stage compiles at most
one search program per bucket whatever the number and lengths of the files. A file's result
is written (and flushed) as soon as its last segment is decoded, so results come in the order
files finish, not the order given; `--output` keeps them in a TSV or JSONL file and a rerun
with the same `--output` skips the files already in it. A file that cannot be used
(unreadable, empty, silent, non-finite samples, shorter than one 25 ms window) is reported on
stderr with the reason and the others go on; the exit status is then 1.

`decode_files` (a list, in the order given) and `FileDecoder.decode` (a generator, in
the order decoded) are the same for notebooks.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_common.errors import InvalidValue, MissingInput
from data_prep import features as features_lib
from data_prep import vocab as vocab_lib
from data_prep.audio import SAMPLE_RATE, AudioError, load_audio
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import pauses
from multiformer_jax.evaluation.scoring import lm_rescorer
from multiformer_jax.evaluation.trained_stage import load_trained_stage
from multiformer_jax.evaluation.results import averaged_count, lm_settings
from multiformer_jax.evaluation.inference import make_beam_search_for, picked
from multiformer_jax import schema

DEFAULT_SEGMENT_SECONDS = 20.0
SMALLEST_BUCKET_FRAMES = 256     # 2.56 s
BUCKET_GROWTH = 1.5              # each bucket's frames x this, rounded up to a multiple of 16


def frame_buckets(segment_seconds: float) -> list[int]:
  """The padded lengths in frames that segments of at most segment_seconds are decoded at:
  SMALLEST_BUCKET_FRAMES, then each BUCKET_GROWTH times the last (multiples of 16), the last
  one the frames of a whole segment. 20 s: [256, 384, 576, 864, 1296, 2000]; 4 s: [256, 400]."""
  most = max(1, features_lib.num_frames(int(round(segment_seconds * SAMPLE_RATE))))
  edges, edge = [], SMALLEST_BUCKET_FRAMES
  while edge * BUCKET_GROWTH <= most:        # the last one is at least BUCKET_GROWTH x this
    edges.append(edge)
    edge = int(math.ceil(edge * BUCKET_GROWTH / 16) * 16)
  return edges + [int(math.ceil(most / 16) * 16)]


class UnusableAudio(InvalidValue):
  """A file that cannot be decoded; the message names it and says why."""


def audio_segments(path: str, segment_seconds: float) -> list[np.ndarray]:
  """The file's 16 kHz mono samples, cut at its pauses into segments of at most
  segment_seconds (`pauses.pause_cuts`), its silent segments left out. A file that cannot be
  used raises UnusableAudio naming it and the reason."""
  if segment_seconds <= 0:
    raise InvalidValue(f"segment_seconds={segment_seconds}; give a positive number of seconds")
  try:
    samples, _ = load_audio(path)
  except AudioError as error:     # its detail names the file too: once is enough
    detail = str(error)[len(error.reason) + 2:]
    detail = "" if detail == path else detail.replace(f"{path}: ", "")
    raise UnusableAudio(f"{path}: {error.reason}" + (f": {detail}" if detail else "")) \
        from error
  if not np.all(np.isfinite(samples)):
    raise UnusableAudio(f"{path}: non-finite samples (NaN or infinity) in the audio")
  if len(samples) < pauses.FRAME_LENGTH:
    raise UnusableAudio(f"{path}: shorter than one 25 ms analysis window "
                        f"({len(samples)} samples at {SAMPLE_RATE} Hz)")
  pieces = [samples[start:end] for start, end in pauses.pause_cuts(samples, segment_seconds)]
  spoken = [p for p in pieces if not pauses.is_silent(p)]
  if not spoken:
    raise UnusableAudio(f"{path}: silent (no stretch of it reaches {pauses.SILENCE_DBFS:g} "
                        f"dB of full scale)")
  return spoken


class StageDecoder:
  """One stage of a run, ready to decode feature matrices: its model, parameters (the run's
  eval.checkpoint selection unless `checkpoint` is given), vocabulary and search."""

  def __init__(self, workdir: str, config, stage: str, checkpoint: str | None = None,
               beam: int | None = None, task: str | None = None,
               target_lang: str | None = None):
    e, d = config.eval, config.data
    self.stage, self.config = stage, config
    summary = _prepared_summary(d.prepared_dir)
    self.vocab = vocab_lib.load(d.prepared_dir, summary["vocab"][stage])
    which = checkpoint or e.checkpoint
    trained = load_trained_stage(workdir, config, stage, self.vocab.size, which,
                                 averaged_count(config, which))
    self.model, self.params, self.checkpoint = trained.model, trained.params, trained.checkpoint
    keys = trained.tasks
    if self.model.config.input_dim != features_lib.NUM_MEL_BINS:
      raise InvalidValue(f"this model reads {self.model.config.input_dim} features a frame; "
                       f"translate computes {features_lib.NUM_MEL_BINS}-bin fbank from audio")
    self.tasks = None
    if keys:
      self.tasks = {side: stack_task_id(key, stage, task, target_lang)
                    for side, key in keys.items()}
    self.prefix = None
    if stage == "st" and d.target_lang_tag:
      symbol = self.vocab.symbol_id(vocab_lib.lang_tag(target_lang or ""))
      if symbol is None:
        langs = sorted(self.vocab.sp.id_to_piece(i)[6:-1] for i in self.vocab.lang_tag_ids)
        raise InvalidValue(f"this model translates into several languages: pass --target_lang, "
                         f"one of {langs}" + (f" (got {target_lang!r})" if target_lang else ""))
      self.prefix = symbol
    self.gcmvn = ip.read_gcmvn(d.prepared_dir, summary) if d.cmvn == "global" else None
    lm = lm_settings(config, stage)
    self.pick = lm_rescorer(config, stage, lm, beam or e.beam, e.length_penalty) if lm else None
    self.search = make_beam_search_for(self.model, e, beam, nbest=self.pick is not None,
                                        stage=stage)
    self.batch_shapes = set()              # (rows, frames, mel bins) decoded

  def __call__(self, feature_list: list[np.ndarray], frames: int | None = None,
               rows: int | None = None) -> list[str]:
    """Raw fbank matrices [frames_i, 80] -> one text each, normalised as in training and
    decoded in one batch of `rows` rows padded to `frames` frames (default: as many as given,
    the longest one's frames). Padding rows are one frame of zeros, as evaluation's."""
    frames = frames or max(len(f) for f in feature_list)
    rows = rows or len(feature_list)
    batch = np.zeros((rows, frames, features_lib.NUM_MEL_BINS), np.float32)
    lengths = np.ones(rows, np.int32)
    for row, f in enumerate(feature_list):
      batch[row, :len(f)] = ip.apply_cmvn(f, self.config.data.cmvn, self.gcmvn)
      lengths[row] = len(f)
    tasks = None if self.tasks is None else tuple(
        jnp.full((rows,), self.tasks[side], jnp.int32) if side in self.tasks else None
        for side in ("encoder", "decoder"))
    prefix = None if self.prefix is None else jnp.full((rows,), self.prefix, jnp.int32)
    self.batch_shapes.add(batch.shape)
    out = self.search(self.params, jnp.asarray(batch), jnp.asarray(lengths), tasks, prefix,
                         jax.random.PRNGKey(self.config.train.seed))
    forced, n = (0 if prefix is None else 1), len(feature_list)
    if self.pick is None:
      tokens = np.asarray(out)[:n]
    else:                                       # the padding rows' n-best lists are not read
      tokens = picked(tuple(np.asarray(x)[:n] for x in out), self.vocab, forced, self.pick)
    return [self.vocab.decode(row[forced:]) for row in tokens]

  def compiled_programs(self) -> int:
    """How many search programs this stage has run: one per batch shape it has decoded
    (compiled on its first use in the process)."""
    return len(self.batch_shapes)


def stack_task_id(key: ip.TaskKey, stage: str, task: str | None, target_lang: str | None
                  ) -> int:
  """The task id of one keyed stack: a stack keyed by the target language (ST) takes
  --target_lang (else --task), every other one --task."""
  by_target = key.field == "target_lang" and stage == "st"
  value = (target_lang or task) if by_target else task
  if value not in key.names:
    option = "--target_lang" if by_target else "--task"
    raise InvalidValue(f"this model selects heads by {key.field}: pass {option}, one of "
                     f"{list(key.names)}" + (f" (got {value!r})" if value else ""))
  return key.names.index(value)


def _prepared_summary(prepared_dir: str) -> dict:
  import json  # pylint: disable=import-outside-toplevel
  path = os.path.join(prepared_dir, "prepared.json")
  if not os.path.exists(path):
    raise MissingInput(f"{path} not found: the run's vocabulary lives in its prepared "
                            f"data (data.prepared_dir); run from the directory the run was "
                            f"trained in, or pass a workdir whose config names it")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


@dataclasses.dataclass
class _OpenFile:
  """A file whose segments are queued or being decoded."""
  index: int
  path: str
  segments: int
  texts: dict[str, list]           # stage -> [segments] decoded texts (None until decoded)
  left: int                        # segments not decoded yet


class FileDecoder:
  """Audio files -> their transcripts and translations, decoded in batches of a fixed set of
  shapes (module docstring). Holds at most `max_open_files` files' features at a time: when
  more are open, the bucket holding the oldest one's next segment is decoded, full or not."""

  def __init__(self, workdir: str, stages=("asr", "st"), checkpoint: str | None = None,
               beam: int | None = None, segment_seconds: float = DEFAULT_SEGMENT_SECONDS,
               task: str | None = None, target_lang: str | None = None,
               batch_frames: int | None = None, max_batch: int | None = None,
               rate_norm_target: float | None = None):
    """batch_frames: padded frames per batch (default: the run's eval.batch_frames); max_batch:
    the most segments a batch holds (e.g. the number of files, so that one file is not padded
    to a batch of dozens); rate_norm_target: speaking-rate normalisation's density target
    (default: the run's eval.rate_norm_target; 0 = off)."""
    if segment_seconds <= 0:
      raise InvalidValue(f"segment_seconds={segment_seconds}; give a positive number of seconds")
    for stage in stages:
      if stage not in ip.SPEECH_STAGES:
        raise InvalidValue(f"stage {stage!r}; valid: {ip.SPEECH_STAGES}")
    self.config = schema.load_config(workdir)
    if rate_norm_target is not None:
      with self.config.unlocked():
        self.config.eval.rate_norm_target = rate_norm_target
    self.stages, self.segment_seconds = tuple(stages), segment_seconds
    self.decoders = {stage: StageDecoder(workdir, self.config, stage, checkpoint, beam,
                                               task, target_lang) for stage in self.stages}
    self.edges = frame_buckets(segment_seconds)
    batch_frames = batch_frames or self.config.eval.batch_frames
    if batch_frames <= 0 or (max_batch is not None and max_batch <= 0):
      raise InvalidValue(f"batch_frames={batch_frames}, max_batch={max_batch}: give positive "
                       f"numbers")
    self.batch_sizes = [max(1, min(batch_frames // edge, max_batch or batch_frames))
                        for edge in self.edges]
    self.max_open_files = 2 * max(self.batch_sizes)

  def compiled_programs(self) -> dict[str, int]:
    """{stage: search programs compiled so far}: at most len(self.edges) each."""
    return {stage: t.compiled_programs() for stage, t in self.decoders.items()}

  def decode(self, paths: Iterable[str]) -> Iterator[dict]:
    """Yields, for each file, as soon as it is decoded: {'index' (its position in `paths`),
    'path', 'segments', and per stage its text}, or {'index', 'path', 'error'} for a file that
    cannot be used."""
    queues = [collections.deque() for _ in self.edges]   # per bucket: (file, segment, fbank)
    open_files: dict[int, _OpenFile] = {}                 # in the order they were read
    for index, path in enumerate(paths):
      try:
        features = [features_lib.fbank(s) for s in audio_segments(path, self.segment_seconds)]
      except UnusableAudio as error:
        yield {"index": index, "path": path, "error": str(error)}
        continue
      open_files[index] = _OpenFile(index, path, len(features),
                                    {stage: [None] * len(features) for stage in self.stages},
                                    len(features))
      for number, f in enumerate(features):
        queues[self._bucket(len(f))].append((index, number, f))
      for bucket, queue in enumerate(queues):
        while len(queue) >= self.batch_sizes[bucket]:
          yield from self._decode(bucket, queues, open_files)
      while len(open_files) > self.max_open_files:
        oldest = next(iter(open_files))
        bucket = next(b for b, q in enumerate(queues) if any(i == oldest for i, _, _ in q))
        yield from self._decode(bucket, queues, open_files)
    for bucket, queue in enumerate(queues):
      while queue:
        yield from self._decode(bucket, queues, open_files)

  def _bucket(self, frames: int) -> int:
    return min(int(np.searchsorted(self.edges, frames)), len(self.edges) - 1)

  def _decode(self, bucket: int, queues, open_files) -> Iterator[dict]:
    """Decodes one batch of `bucket` (its first segments, padded to the bucket's shape) with
    every stage; yields the files it completes."""
    queue, size = queues[bucket], self.batch_sizes[bucket]
    items = [queue.popleft() for _ in range(min(size, len(queue)))]
    features = [f for _, _, f in items]
    for stage, decoder in self.decoders.items():
      for (index, number, _), text in zip(items, decoder(features, self.edges[bucket], size)):
        open_files[index].texts[stage][number] = text
    for index, _, _ in items:
      entry = open_files[index]
      entry.left -= 1
      if entry.left == 0:
        del open_files[index]
        yield {"index": index, "path": entry.path, "segments": entry.segments,
               **{stage: " ".join(t for t in texts if t) for stage, texts in entry.texts.items()}}


def decode_files(workdir: str, paths, stages=("asr", "st"), checkpoint: str | None = None,
                    beam: int | None = None, segment_seconds: float = DEFAULT_SEGMENT_SECONDS,
                    task: str | None = None, target_lang: str | None = None,
                    on_result=None) -> list[dict]:
  """-> [{'path', 'segments', and per stage its text}] for each audio file, in the order given;
  a file that cannot be used has {'path', 'error'} instead. on_result(result) is called with
  each as soon as it is decoded (in the order decoded)."""
  paths = list(paths)
  decoder = FileDecoder(workdir, stages, checkpoint, beam, segment_seconds, task,
                              target_lang, max_batch=batch_cap(len(paths)))
  results = [None] * len(paths)
  for result in decoder.decode(paths):
    index = result.pop("index")
    results[index] = result
    if on_result is not None:
      on_result(result)
  return results


def batch_cap(files: int) -> int:
  """The largest batch worth compiling for this many files: the next power of two."""
  return 1 << max(0, files - 1).bit_length()
