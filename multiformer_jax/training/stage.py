"""What one stage trains with, built before its first update: its data (training iterator, dev
batches), model, optimizer and compiled steps, its checkpoints, the state it starts from
(fresh, resumed from its latest checkpoint with the data position, or carried from another
run or stage) and every program compiled ahead (`compile_programs`). The loop that runs it is
train.py's."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from typing import Any, Callable

import jax

from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import inference, results
from multiformer_jax.experiment import (UpdatePlan, known_task_rows, model_config_for,
                                         pipeline_config, st_decoder_from_mt,
                                         st_encoder_from_mt, stage_ctc_weight, stage_key,
                                         task_keys, update_plan)
from multiformer_jax.model import S2TModel
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime.train_log import StageLogger
from multiformer_jax.training import transfer
from multiformer_jax.training.optimizer import (freezes, make_optimizer, trained_predicate,
                                                trained_values)
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.training.steps import TrainState, create_state, make_steps


def loader_workers(config) -> int:
  """data.loader_workers, with -1 resolved by backend: on a CPU the step uses every core and
  batches are assembled between steps (dispatch is asynchronous, so that overlaps the step);
  with an accelerator, background processes keep up with a fast step: every core but one
  (the training loop's) of those this process may run on."""
  workers = config.data.loader_workers
  if workers >= 0:
    return workers
  if jax.default_backend() == "cpu":
    return 0
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, (cores or 2) - 1)


@dataclasses.dataclass
class StageRun:
  """What one stage's training loop works with, built by `prepare_stage`."""
  config: Any
  stage: str
  model: Any                 # S2TModel; the MT stage's MTModel
  dp: DataParallel
  train_data: Any            # ip.SplitData; the MT stage's TextPairs (both have `ids`)
  iterator: ip.TrainIterator
  dev_batcher: Any           # ip.Batcher; the MT stage's TextPairBatcher
  checkpoints: ckpt_lib.StageCheckpoints
  logger: StageLogger
  train_step: Callable
  eval_step: Callable
  dev_scorer: "DevScorer | None"
  update: UpdatePlan
  evaluation_due: bool = False   # resumed where a stop cut the dev evaluation short
  scores_dev: bool = False       # the dev split is decoded at evaluations (process 0's scorer)

  @property
  def stage_cfg(self):
    return self.config[self.stage]

  def _meta(self, step: int, **values) -> dict:
    return {"stage": self.stage, "step": step, "iterator": self.iterator.state(), **values,
            "model": self.model.config.to_dict()}

  def save(self, step: int, state: TrainState, dev: dict):
    """An evaluation checkpoint of `state` with the data position, the dev figures and the
    model config."""
    self.checkpoints.save(step, self.dp.unreplicate(state), self._meta(step, **dev))

  def save_progress(self, step: int, state: TrainState, saved_on: str,
                    evaluation_due: bool = False) -> bool:
    """A progress checkpoint (see StageCheckpoints): `saved_on` says why (the period or a
    signal's name); `evaluation_due`: the dev evaluation of this update is still to do (a stop
    cut it short), the resumed run does it first. -> whether one was written."""
    return self.checkpoints.save_progress(step, self.dp.unreplicate(state), self._meta(
        step, saved_on=saved_on, evaluation_due=evaluation_due))


def _stage_data(config, stage: str, dp: DataParallel, log: logging.Logger):
  """-> (training data, dev data, task keys, training batcher, dev batcher, update plan) of a
  stage."""
  train_data = ip.SplitData(pipeline_config(config, stage), config.data.train_split)
  dev_data = ip.SplitData(pipeline_config(config, stage, "dev"), config.data.dev_split)
  tasks = task_keys(config, stage)
  dev_data, unknown = known_task_rows(dev_data, tasks)
  if unknown:
    log.warning("stage %s: %d dev utterances have no task in the model and are left out of "
                "the dev loss and score: %s", stage, sum(unknown.values()), unknown)
  train_batcher = ip.Batcher(train_data, True, dp.global_batch_multiple, jax.process_index(),
                             jax.process_count(), tasks=tasks)
  dev_batcher = ip.Batcher(dev_data, False, dp.global_batch_multiple, jax.process_index(),
                           jax.process_count(), tasks=tasks, skip_unfit=True)
  for batcher, split in ((train_batcher, "training"), (dev_batcher, "dev")):
    for reason, ids in batcher.skipped.items():
      log.warning("stage %s: %d %s utterances %s are skipped (e.g. %s)", stage, len(ids),
                  split, reason, ", ".join(ids[:5]))
  plan = update_plan(config, stage)
  log.info("stage %s: %d train / %d dev utterances, vocabulary %d, batch shapes "
           "(batch, frames, tokens) %s; an update is %d batch(es) of <= %d padded frames "
           "(%d per device, %d device(s)): %d frames", stage, len(train_data), len(dev_data),
           train_data.vocab.size, train_batcher.shapes, plan.update_freq, plan.batch_frames,
           plan.device_frames, plan.devices, plan.frames_per_update)
  return train_data, dev_data, tasks, train_batcher, dev_batcher, plan


def stage_checkpoints(config, stage: str, workdir: str) -> ckpt_lib.StageCheckpoints:
  """The stage's evaluation checkpoints ({workdir}/{stage}/checkpoints) and progress
  checkpoints ({workdir}/{stage}/progress)."""
  return ckpt_lib.StageCheckpoints(
      os.path.join(workdir, stage, "checkpoints"), config[stage].keep_last, stage,
      kept_around_best(config, stage), os.path.join(workdir, stage, "progress"))


def starting_state(config, stage: str, workdir: str, state: TrainState,
                   checkpoints: ckpt_lib.StageCheckpoints, iterator: ip.TrainIterator,
                   log: logging.Logger) -> tuple[TrainState, bool]:
  """The state training continues from: the latest valid checkpoint (the data iterator moved to
  its position), else the fresh state with {stage}.init_from's parameters, or for the ST stage
  the ASR encoder and the MT stage's parameters carried in. -> (state, whether the resumed
  update's dev evaluation is still to do)."""
  resumed = checkpoints.restore_latest_valid(state, log)
  if resumed is not None:
    state, meta, latest = resumed
    iterator.restore(meta["iterator"])
    log.info("resumed stage %s from step %d (%s), data position %s", stage, latest,
             f"{checkpoints.progress_directory}, saved on {meta['saved_on']}"
             if "saved_on" in meta else checkpoints.directory, meta["iterator"])
    return state, bool(meta.get("evaluation_due"))
  scfg = config[stage]
  if scfg.init_from:
    return state.replace(params=transfer.init_from_run(state.params, config, stage, log)), False
  if stage != "st":
    return state, False
  if "asr" in config.train.stages:
    asr = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"))
    asr_params, which = asr.select_params(
        scfg.encoder_init, results.averaged_count(config, scfg.encoder_init))
    log.info("ST encoder from the ASR stage: %s", which)
    state = state.replace(params=transfer.carry_from_asr(state.params, asr_params, log))
  decoder, encoder = st_decoder_from_mt(config), st_encoder_from_mt(config)
  if decoder or encoder:
    state = state.replace(params=transfer.carry_from_mt_stage(
        state.params, workdir, log, decoder, encoder))
  return state, False


def prepare_stage(config, stage: str, workdir: str, dp: DataParallel, logger: StageLogger
                  ) -> tuple[StageRun, TrainState]:
  """The stage's data, model, optimizer, steps and checkpoints, and the state it starts from."""
  log, scfg = logger.log, config[stage]
  train_data, dev_data, tasks, train_batcher, dev_batcher, plan = _stage_data(config, stage,
                                                                              dp, log)
  model = S2TModel(model_config_for(config, train_data.vocab.size, tasks, stage))
  for side, key in (tasks or {}).items():
    log.info("stage %s: %s heads keyed by %s, %d tasks: %s", stage, side, key.field,
             len(key.names), ", ".join(key.names))
  log.info("stage %s: pairs %s", stage, ", ".join(ip.split_tags(train_data)["pair"]))
  trained = trained_predicate(scfg) if freezes(scfg) else None
  tx, schedule = make_optimizer(config.train, scfg)
  checkpoints = stage_checkpoints(config, stage, workdir)
  state = create_state(model, tx, stage_key(config, stage))
  iterator = ip.TrainIterator(train_batcher, workers=loader_workers(config))
  log.info("%s: training batches assembled %s; log.jsonl's data_wait_s is the time the loop "
           "waited for them", stage, f"ahead by {iterator.workers} worker processes into "
           f"shared memory, {iterator.prefetch} batches ahead" if iterator.workers
           else "in the training loop")
  state, evaluation_due = starting_state(config, stage, workdir, state, checkpoints, iterator,
                                         log)
  if trained is not None:
    values, total = trained_values(state.params, scfg, stage)
    log.info("%s: training %d of %d values (train_only %r, frozen %r); the rest stay fixed",
             stage, values, total, scfg.train_only, scfg.frozen)
  log.info("%s: %d parameters; encoder key block %d, FFN token chunk %d (0 = dense; "
           "model.key_block_size / ffn_token_chunk, -1 = by backend)", stage,
           sum(x.size for x in jax.tree_util.tree_leaves(state.params)),
           model.config.resolved_key_block_size, model.config.resolved_ffn_token_chunk)
  train_step, eval_step = make_steps(model, tx, schedule, dp, config.train.label_smoothing,
                                     config.train, stage_ctc_weight(config, stage), trained)
  dev_scorer = DevScorer(config, stage, model, dev_data, tasks) if (
      jax.process_index() == 0 and config.eval.score_dev) else None
  return StageRun(config, stage, model, dp, train_data, iterator, dev_batcher, checkpoints,
                  logger, train_step, eval_step, dev_scorer, plan, evaluation_due,
                  config.eval.score_dev), state


class DevScorer:
  """Decodes the whole dev split with the current parameters and scores it (WER for ASR, BLEU
  for ST): eval.score_dev, at every evaluation during training. The search is the evaluation's
  (fairseq's beam search, eval.max_len_*, eval.min_len) with beam eval.score_dev_beam; it
  compiles once per dev batch shape, on the first evaluation."""

  def __init__(self, config, stage: str, model: S2TModel, dev_data: ip.SplitData, tasks):
    e = config.eval
    self.stage, self.seed = stage, config.train.seed
    self.data = dev_data
    self.batcher = ip.Batcher(dev_data, False, tasks=tasks)   # every utterance, this process
    self.beam = e.score_dev_beam
    self.translate = inference.make_beam_search_for(model, e, self.beam, stage=stage)

  @property
  def metric(self) -> str:
    return "bleu" if self.stage == "st" else "wer"

  def __call__(self, params, cancelled=None) -> dict | None:
    """-> {'dev_wer' or 'dev_bleu': score, 'dev_decode_s': seconds}; None if `cancelled()`
    (asked before each batch) turned true."""
    start = time.perf_counter()
    hypotheses = inference.decode_split(params, self.batcher, self.translate, False,
                                        self.seed, cancelled=cancelled)
    if hypotheses is None:
      return None
    result = inference.score(self.stage, hypotheses, self.data.references)
    return {f"dev_{self.metric}": result[self.metric],
            "dev_decode_s": round(time.perf_counter() - start, 1)}


def kept_around_best(config, stage: str) -> int:
  """How many checkpoints around the best a stage keeps (1: the best alone): as many as
  evaluation by "around_best" averages (eval.average_around_best), where evaluation or, for the
  ASR stage, the ST encoder init selects by it."""
  if config.eval.checkpoint == "around_best" or (
      stage == "asr" and "st" in config.train.stages and config.st.encoder_init == "around_best"):
    return results.averaged_count(config, "around_best")
  return 1


def compile_threads() -> int:
  """Programs compiled at once before a stage's first update: one per core this process may
  run on, at most 8 (lowering is Python and runs one at a time; XLA's compilation of each
  then runs in its own thread)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, min(8, cores or 1))


def compile_programs(run: StageRun, state: TrainState) -> int:
  """Compiles every program the stage's updates and dev loss run, before the first update,
  several at once (compile_threads; the persistent cache, train.compilation_cache, serves a
  rerun); -> how many compiled."""
  log, dp = run.logger.log, run.dp
  batcher = run.iterator.batcher
  wanted = run.train_step.programs(
      [dp.batch_spec(batcher.layout(b)) for b in range(len(batcher.buckets))],
      run.update.update_freq, state.params)
  wanted += [(run.eval_step, (dp.batch_spec(run.dev_batcher.layout(b)),))
             for b in range(len(run.dev_batcher.buckets))]
  threads = compile_threads()
  log.info("stage %s: compiling %d programs before the first update (%d batch shapes, an "
           "update of %d micro-batch(es), %d dev shapes), %d at a time", run.stage,
           len(wanted), len(batcher.buckets), run.update.update_freq,
           len(run.dev_batcher.buckets), threads)
  start, compiled, done = time.perf_counter(), 0, 0

  def describe(programs, specs) -> str:
    batch = next((spec for spec in specs if "targets" in spec), None)
    shape = () if batch is None else (batch["features"].shape[-3:-1] if "features" in batch
                                      else batch["source"].shape[-2:-1]
                                      ) + batch["targets"].shape[-1:]
    return f"{programs.name} {shape or '(one for every shape)'}"

  def compile_one(programs, specs, lowered):
    began = time.perf_counter()
    programs.keep(specs, lowered)
    return time.perf_counter() - began

  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    pending = {}
    for programs, specs in wanted:
      lowered = programs.lower(state, *specs)
      if lowered is None:
        done += 1
        log.info("compiled %d/%d: %s already", done, len(wanted), describe(programs, specs))
        continue
      pending[pool.submit(compile_one, programs, specs, lowered)] = (programs, specs)
    for future in concurrent.futures.as_completed(pending):
      seconds = future.result()
      done, compiled = done + 1, compiled + 1
      log.info("compiled %d/%d: %s in %.1f s", done, len(wanted),
               describe(*pending[future]), seconds)
  log.info("stage %s: %d programs compiled in %.0f s", run.stage, compiled,
           time.perf_counter() - start)
  return compiled
