"""A run: every stage of train.stages in order (ASR pre-training, the text stage where the ST
stage reads it, then ST with the encoder carried over), then evaluation.

One stage = fairseq's recipe in JAX (loop.py, steps.py, optimizer.py): Adam, inverse-sqrt or
polynomial-decay schedule with linear warmup from 0, clip-norm, exact gradient accumulation
(`update_freq`), label-smoothed cross-entropy, dev loss every `eval_every` updates with a
checkpoint, the best by dev loss kept beside the last K. Rerunning the same command resumes.
"""

from __future__ import annotations

import logging
import os

import jax

from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import evaluate, inference
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import host_memory, processes
from multiformer_jax.training import text_stage
from multiformer_jax.training.data_setup import ensure_prepared, evaluated_splits
from multiformer_jax.training.loop import run_stage
from multiformer_jax.training.parallel import DataParallel


def check_checkpoint_retention(config):
  """The checkpoint selections are known ones, and averaging N checkpoints needs N kept: each
  stage's keep_last must cover eval.average_last where evaluation, or for the ASR stage the
  ST encoder init, averages the last N ("average"); "around_best" keeps its own."""
  for key, value in (("eval.checkpoint", config.eval.checkpoint),
                     ("st.encoder_init", config.st.encoder_init)):
    if value not in ckpt_lib.SELECTIONS:
      raise ValueError(f"{key}={value!r}; valid: {', '.join(ckpt_lib.SELECTIONS)}")
  needs = []
  if config.eval.checkpoint == "average":
    needs += [(stage, config.eval.average_last, "eval.average_last")
              for stage in config.train.stages]
  if ("st" in config.train.stages and "asr" in config.train.stages and
      config.st.encoder_init == "average"):
    needs.append(("asr", config.eval.average_last, "eval.average_last (st.encoder_init)"))
  for stage, count, key in needs:
    if config[stage].keep_last < count:
      raise ValueError(f"{stage}.keep_last={config[stage].keep_last} keeps fewer checkpoints "
                       f"than {key}={count} averages; set {stage}.keep_last >= {count} or "
                       f"lower {key}")


def check_config(config):
  """Refuses what would fail later, before anything is built or trained."""
  bad_stages = [s for s in config.train.stages if s not in ip.TASKS]
  if bad_stages or not config.train.stages:
    raise ValueError(f"train.stages contains {bad_stages[0] if bad_stages else 'nothing'!r}; "
                     f"valid stages: {ip.TASKS}")
  check_checkpoint_retention(config)
  for stage in config.train.stages:         # eval.lm_* and the repeat block refused now
    evaluate.lm_settings(config, stage)
    inference.no_repeat_ngram_size(config.eval, stage)
  for stage in config.train.stages:         # resolved_eval_every reads what passes here
    if config[stage].eval_every < 1 and config[stage].eval_every != -1:
      raise ValueError(f"{stage}.eval_every={config[stage].eval_every}; valid: a number of "
                       f"updates >= 1, or -1 for once per epoch")
  text_stage.check_config(config)        # what needs no prepared data


def train_and_evaluate(config, workdir: str) -> dict:
  """All stages of `config.train.stages` in order, then (if eval.after_training) evaluation."""
  log = logging.getLogger("multiformer_jax")
  check_config(config)
  if jax.process_index() == 0:
    ckpt_lib.save_config(workdir, config)
  # Process 0 prepares (the directory is shared); the others wait, then read it.
  processes.on_first_process(lambda: ensure_prepared(config, log),
                             f"preparing {config.data.prepared_dir}")
  if jax.process_count() > 1 and not os.path.exists(
      os.path.join(config.data.prepared_dir, "prepared.json")):
    raise FileNotFoundError(
        f"process {jax.process_index()} does not see {config.data.prepared_dir}/prepared.json, "
        f"which process 0 prepared: data.prepared_dir must be on a filesystem every process "
        f"reads")
  text_stage.check_config(config, prepared=True)
  dp = DataParallel(config.train.parallel)
  log.info("devices: %d local (%s), %d processes; parallel=%s", dp.num_local,
           jax.local_devices()[0].platform, jax.process_count(), dp.mode)
  log.info("host memory: %s", host_memory.describe())
  results = {}
  for stage in config.train.stages:
    if stage == "st" and text_stage.wanted(config):
      results[text_stage.STAGE] = {"train": text_stage.run_text_stage(config, workdir, log)}
    results[stage] = {"train": run_stage(config, stage, workdir, dp)}
  if config.eval.after_training and jax.process_index() == 0:
    splits = evaluated_splits(config)
    for stage in config.train.stages:
      results[stage]["eval"] = evaluate.evaluate_stage(config, workdir, stage, splits[0])
      for split in splits[1:]:
        results[stage][f"eval_{split}"] = evaluate.evaluate_stage(config, workdir, stage, split)
  return results
