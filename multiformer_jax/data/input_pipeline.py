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

The pipeline's modules, by responsibility (none imports JAX): pipeline_config (PipelineConfig:
the data.* settings), prepared (a prepared split read in place: SplitData, Ragged, summaries,
vocabularies, tags), cmvn, task_keys (TaskKey, batch_tasks), batching (bucket plan, Batcher,
eval_batches), train_iterator (TrainIterator) and workers (the worker processes). This module
gathers their names, so that `from multiformer_jax.data import input_pipeline as ip` reads as
one interface.
"""

from __future__ import annotations

from multiformer_jax.data.batching import (BUCKET_FRAMES, Batcher, Bucket, assemble_new,
                                           balanced, bucket_boundaries, eval_batches)
from multiformer_jax.data.cmvn import apply_cmvn, apply_cmvn_into, read_gcmvn
from multiformer_jax.data.pipeline_config import (CMVN_MODES, SPEECH_STAGES, TAG_NAMES,
                                                  PipelineConfig, config_defaults)
from multiformer_jax.data.prepared import (Ragged, SplitData, check_transforms, read_summary,
                                           split_tags, stage_vocabulary, tag_inventory,
                                           text_only_lines, used_pairs)
from multiformer_jax.data.task_keys import TaskKey, batch_tasks
from multiformer_jax.data.train_iterator import TrainIterator

__all__ = ["BUCKET_FRAMES", "Batcher", "Bucket", "CMVN_MODES", "PipelineConfig", "Ragged",
           "SPEECH_STAGES", "SplitData", "TAG_NAMES", "TaskKey", "TrainIterator",
           "apply_cmvn", "apply_cmvn_into", "assemble_new", "balanced", "batch_tasks",
           "bucket_boundaries", "check_transforms", "config_defaults", "eval_batches",
           "read_gcmvn", "read_summary", "split_tags", "stage_vocabulary", "tag_inventory",
           "text_only_lines", "used_pairs"]
