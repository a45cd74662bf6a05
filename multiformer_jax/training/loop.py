"""One stage's training loop: its data, model and state (fresh, resumed, or carried from another
run or stage), updates to {stage}.max_updates with the dev loss and a checkpoint every
{stage}.eval_every updates, the best by dev loss kept beside the last K, early stopping, and a
checkpoint on a stop request.

Rerunning the same command resumes: a finished stage (its DONE file) is skipped, an unfinished
one continues from its latest checkpoint with the optimizer state, the RNG key and the
data-iterator position, so the run continues with exactly the batch it would have seen next.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from data_prep.common import atomic
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import evaluate, inference
from multiformer_jax.experiment import (UpdatePlan, known_task_rows, model_config_for,
                                         pipeline_config, stage_ctc_weight, stage_key,
                                         task_keys, update_plan)
from multiformer_jax.model import S2TModel
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import compile_clock, faults, processes
from multiformer_jax.runtime.train_log import DONE, StageLogger
from multiformer_jax.training import curves, text_stage, transfer
from multiformer_jax.training.optimizer import (freezes, make_optimizer, trained_predicate,
                                                trained_values)
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.training.steps import (TrainState, create_state, evaluate_loss,
                                            make_steps, params_checksum)


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
  model: S2TModel
  dp: DataParallel
  train_data: ip.SplitData
  iterator: ip.TrainIterator
  dev_batcher: ip.Batcher
  checkpoints: ckpt_lib.StageCheckpoints
  logger: StageLogger
  train_step: Callable
  eval_step: Callable
  dev_scorer: "DevScorer | None"
  update: UpdatePlan

  @property
  def stage_cfg(self):
    return self.config[self.stage]

  def save(self, step: int, state: TrainState, dev: dict, **extra):
    """A checkpoint of `state` with the data position, the dev figures and the model config."""
    self.checkpoints.save(step, self.dp.unreplicate(state), {
        "stage": self.stage, "step": step, "iterator": self.iterator.state(), **dev,
        "model": self.model.config.to_dict(), **extra})


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
                           jax.process_count(), tasks=tasks)
  if train_batcher.too_long:
    log.warning("stage %s: %d training utterances longer than data.max_source_frames=%d are "
                "skipped (e.g. %s)", stage, len(train_batcher.too_long),
                config.data.max_source_frames, ", ".join(train_batcher.too_long[:5]))
  plan = update_plan(config, stage)
  log.info("stage %s: %d train / %d dev utterances, vocabulary %d, batch shapes "
           "(batch, frames, tokens) %s; an update is %d batch(es) of <= %d padded frames "
           "(%d per device, %d device(s)): %d frames", stage, len(train_data), len(dev_data),
           train_data.vocab.size, train_batcher.shapes, plan.update_freq, plan.batch_frames,
           plan.device_frames, plan.devices, plan.frames_per_update)
  return train_data, dev_data, tasks, train_batcher, dev_batcher, plan


def _starting_state(config, stage: str, workdir: str, state: TrainState,
                    checkpoints: ckpt_lib.StageCheckpoints, iterator: ip.TrainIterator,
                    log: logging.Logger) -> TrainState:
  """The state training continues from: the latest valid checkpoint (the data iterator moved to
  its position), else the fresh state with {stage}.init_from's parameters, or for the ST stage
  the ASR encoder and the text stage's parameters carried in."""
  resumed = checkpoints.restore_latest_valid(state, log)
  if resumed is not None:
    state, meta, latest = resumed
    iterator.restore(meta["iterator"])
    log.info("resumed stage %s from step %d (%s), data position %s", stage, latest,
             checkpoints.directory, meta["iterator"])
    return state
  scfg = config[stage]
  if scfg.init_from:
    return state.replace(params=transfer.init_from_run(state.params, config, stage, log))
  if stage != "st":
    return state
  if "asr" in config.train.stages:
    asr = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"))
    asr_params, which = asr.select_params(
        scfg.encoder_init, evaluate.averaged_count(config, scfg.encoder_init))
    log.info("ST encoder from the ASR stage: %s", which)
    state = state.replace(params=transfer.carry_from_asr(state.params, asr_params, log))
  decoder, encoder = text_stage.starts_decoder(config), text_stage.stacks_encoder(config)
  if decoder or encoder:
    state = state.replace(params=transfer.carry_from_text_stage(
        state.params, workdir, log, decoder, encoder))
  return state


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
  checkpoints = ckpt_lib.StageCheckpoints(
      os.path.join(workdir, stage, "checkpoints"), scfg.keep_last, stage,
      kept_around_best(config, stage))
  state = create_state(model, tx, stage_key(config, stage))
  iterator = ip.TrainIterator(train_batcher, workers=loader_workers(config))
  log.info("%s: training batches assembled %s; log.jsonl's data_wait_s is the time the loop "
           "waited for them", stage, f"ahead by {iterator.workers} worker processes into "
           f"shared memory, {iterator.prefetch} batches ahead" if iterator.workers
           else "in the training loop")
  state = _starting_state(config, stage, workdir, state, checkpoints, iterator, log)
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
                  logger, train_step, eval_step, dev_scorer, plan), state


def run_stage(config, stage: str, workdir: str, dp: DataParallel) -> dict:
  """Trains one stage to its max_updates (resuming if interrupted); returns its summary."""
  stage_dir = os.path.join(workdir, stage)
  os.makedirs(stage_dir, exist_ok=True)
  done_path = os.path.join(stage_dir, DONE)
  primary = jax.process_index() == 0
  logger = StageLogger(stage_dir, stage, primary)
  log = logger.log
  if processes.broadcast_int(os.path.exists(done_path)):      # process 0's view, agreed
    with open(done_path, encoding="utf-8") as f:
      summary = json.load(f)
    log.info("stage %s already finished (%s): skipped", stage, done_path)
    return summary
  run, state = prepare_stage(config, stage, workdir, dp, logger)
  step = int(state.step)
  state = dp.replicate(state)
  compile_clock.install()
  phases_before, compile_before = compile_clock.by_phase(), compile_clock.seconds()
  logger.start(step, run.stage_cfg.max_updates)
  try:
    with faults.StopRequest() as stop:      # a stop asked while compiling: after update 1
      compile_programs(run, state)
      step, state, early_stopped = _train_loop(run, state, step, stop)
  finally:
    run.iterator.close()
    logger.close()
  best = run.checkpoints.best()
  wall_s = logger.elapsed()
  phases = {k: v - phases_before[k] for k, v in compile_clock.by_phase().items()}
  compile_s = compile_clock.seconds() - compile_before
  summary = {"stage": stage, "updates": step, "early_stopped": early_stopped, "best_step": best,
             "best_dev_loss": run.checkpoints.meta(best).get("dev_loss"),
             "wall_s": round(wall_s, 1), "compile_s": round(compile_s, 1),
             "compile_fraction": round(compile_s / max(wall_s, 1e-9), 3),
             "compile_phases_s": {k: round(v, 1) for k, v in phases.items()}}
  log.info("stage %s: %.0f s in the training loop, %.0f s of it compiling (%.0f%%: train and "
           "dev steps per batch shape%s; tracing %.0f s, lowering %.0f s, XLA or the "
           "persistent cache (train.compilation_cache) %.0f s)", stage, wall_s, compile_s,
           100 * summary["compile_fraction"],
           ", dev decoding" if run.dev_scorer is not None else "",
           phases["trace"], phases["lower"], phases["compile"])
  log.info("stage %s finished: parameter checksum %s (process %d of %d)", stage,
           params_checksum(dp.unreplicate(state.params)), jax.process_index(),
           jax.process_count())
  if primary:
    curve = curves.plot_learning_curve(stage_dir, stage)
    if curve:
      log.info("stage %s: learning curve in %s", stage, curve)
    atomic.write_json(done_path, summary, indent=1)
  return summary


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
    batch = next((spec for spec in specs if "features" in spec), None)
    shape = batch["features"].shape[-3:-1] + batch["targets"].shape[-1:] if batch else ()
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


def _update(run: StageRun, state: TrainState) -> TrainState:
  """One update: the stage's micro-batches (UpdatePlan.update_freq) through the train step."""
  update_freq, logger = run.update.update_freq, run.logger
  update_ids = []
  for micro in range(update_freq):
    waited = time.perf_counter()
    batch = next(run.iterator)
    logger.data_wait(time.perf_counter() - waited)
    update_ids += [str(run.train_data.ids[i]) for i in batch["index"] if i >= 0]
    last_micro = micro == update_freq - 1
    state, metrics = run.train_step(state, run.dp.shard(batch), last_micro, micro == 0)
    logger.accumulate(metrics, update_ids if last_micro else None)
  return state


def _evaluate_and_save(run: StageRun, state: TrainState, step: int):
  """The dev loss (and with a dev scorer its WER or BLEU), logged, and a checkpoint."""
  dev = evaluate_loss(run.eval_step, state, run.dev_batcher, run.dp)
  scorer = run.dev_scorer
  if scorer is not None:
    dev.update(scorer(run.dp.unreplicate(state.params)))
  run.logger.scalars(step, dev)
  run.save(step, state, dev)
  scored = "" if scorer is None else (
      f", dev {scorer.metric.upper()} {dev[f'dev_{scorer.metric}']:.2f} (beam "
      f"{scorer.beam}, {dev['dev_decode_s']:.0f} s)")
  run.logger.log.info("step %d: dev loss %.4f, dev ppl %.2f%s; checkpoint saved", step,
                      dev["dev_loss"], dev["dev_ppl"], scored)


def _train_loop(run: StageRun, state: TrainState, step: int, stop: faults.StopRequest):
  """Updates from `step` to the stage's max_updates, or to an early stop (train.
  early_stop_patience evaluations without a better dev loss): logs, evaluates and checkpoints
  on schedule; on a stop request saves a checkpoint after the current update and raises
  Preempted. -> (step, state, early_stopped)."""
  config, stage, scfg, log = run.config, run.stage, run.stage_cfg, run.logger.log
  eval_every = resolved_eval_every(scfg, run.iterator.batcher, run.update.update_freq)
  patience = config.train.early_stop_patience
  while step < scfg.max_updates:
    state = _update(run, state)
    step += 1
    if step % config.train.log_every == 0 or step == scfg.max_updates:
      nonfinite = run.logger.flush(step)
      if nonfinite >= config.train.max_consecutive_nonfinite:
        raise FloatingPointError(
            f"{nonfinite} consecutive updates had a non-finite loss or gradient (skipped); "
            f"try a lower {stage}.lr, a longer warmup, model.dtype=float32, or check the "
            f"data for corrupt features")
    if step % eval_every == 0 or step == scfg.max_updates:
      _evaluate_and_save(run, state, step)
      if patience and step < scfg.max_updates:
        stale = evaluations_without_improvement(run.checkpoints, step, eval_every)
        if stale >= patience:
          log.info("stage %s: early stop at update %d: no dev loss improvement for %d "
                   "evaluations (train.early_stop_patience=%d), best at update %d", stage, step,
                   stale, patience, run.checkpoints.best())
          return step, state, True
    faults.fault_point(f"{stage}.update", step)               # tests: killed after an update
    if _stop_agreed(stop, step, config.train.log_every):
      run.logger.flush(step)
      run.save(step, state, {"dev_loss": None}, saved_on="SIGTERM")   # a no-op if saved here
      raise faults.Preempted(stage, step)
  return step, state, False


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
    self.translate = inference.make_translate_for(model, e, self.beam, stage=stage)

  @property
  def metric(self) -> str:
    return "bleu" if self.stage == "st" else "wer"

  def __call__(self, params) -> dict:
    """-> {'dev_wer' or 'dev_bleu': score, 'dev_decode_s': seconds}."""
    start = time.perf_counter()
    hypotheses = inference.decode_split(params, self.batcher, self.translate, False,
                                        self.seed)
    result = inference.score(self.stage, hypotheses, self.data.references)
    return {f"dev_{self.metric}": result[self.metric],
            "dev_decode_s": round(time.perf_counter() - start, 1)}


def evaluations_without_improvement(checkpoints, step: int, eval_every: int) -> int:
  """Evaluations since the best dev loss (fairseq's --patience counts them the same way):
  from the saved checkpoints, so it survives a resume."""
  best = checkpoints.best()
  return 0 if best is None else (step - best) // eval_every


def resolved_eval_every(stage_cfg, batcher: ip.Batcher, update_freq: int) -> int:
  """{stage}.eval_every, with -1 = once per epoch of the training data (fairseq's default:
  validate and save at every epoch end): the epoch's batches / update_freq updates."""
  if stage_cfg.eval_every == -1:
    return max(1, len(batcher.epoch_plan(0)) // update_freq)
  return stage_cfg.eval_every


def _stop_agreed(stop: faults.StopRequest, step: int, every: int) -> bool:
  """Whether to stop after this update. With several processes they must stop at the same
  update, so they agree (an all-gather of the flags) every `every` updates, when the loop
  synchronises for logging anyway."""
  if jax.process_count() == 1:
    return stop.requested
  if step % every:
    return False
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(np.any(multihost_utils.process_allgather(np.array(stop.requested))))


def kept_around_best(config, stage: str) -> int:
  """How many checkpoints around the best a stage keeps (1: the best alone): as many as
  evaluation by "around_best" averages (eval.average_around_best), where evaluation or, for the
  ASR stage, the ST encoder init selects by it."""
  if config.eval.checkpoint == "around_best" or (
      stage == "asr" and "st" in config.train.stages and config.st.encoder_init == "around_best"):
    return evaluate.averaged_count(config, "around_best")
  return 1
