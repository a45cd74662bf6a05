"""A run and its training loop: every stage in order (experiment.stages_run: ASR pre-training,
the MT stage where the ST stage reads it, then ST with the encoder carried over), then
evaluation.

One stage = fairseq's recipe in JAX: what it trains with is built by stage.py, its update is
steps.py's (on loss.py's losses and optimizer.py's Adam and schedule: inverse-sqrt or
polynomial decay with linear warmup from 0, clip-norm, exact gradient accumulation), and the
loop here runs it to {stage}.max_updates with the dev loss and a checkpoint every
{stage}.eval_every updates, the best by dev loss kept beside the last K, early stopping, and a
checkpoint on a stop request.

Rerunning the same command resumes: a finished stage (its DONE file) is skipped, an unfinished
one continues from its latest checkpoint with the optimizer state, the RNG key and the
data-iterator position, so the run continues with exactly the batch it would have seen next.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax

from multiformer_common.errors import MissingInput
from multiformer_common import atomic, locks
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax import schema
from multiformer_jax.evaluation import scoring
from multiformer_jax.experiment import stages_run
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import compile_clock, faults, host_memory, processes, run_record
from multiformer_jax.runtime.train_log import DONE, StageLogger
from multiformer_jax.training import curves, mt_stage
from multiformer_jax.training.agreement import Agreement, Decision, EvaluationCut, SavePeriod
from multiformer_jax.training.data_setup import ensure_prepared, evaluated_splits
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.training.stage import StageRun, compile_programs, prepare_stage
from multiformer_jax.training.steps import TrainState, evaluate_loss, params_checksum


def train_and_evaluate(config, workdir: str, accept_config_changes: bool = False) -> dict:
  """All stages of `config.train.stages` in order, then (if eval.after_training) evaluation.
  While it runs, the workdir is this run's alone (multiformer_common.locks), a stop signal
  (faults.STOP_SIGNALS) ends a stage's training loop after the current update with a
  checkpoint (faults.Preempted), and anywhere else at once (faults.Stopped). A rerun resumes,
  refusing a config that would change the model or the data order unless
  `accept_config_changes` (runtime/run_record.py)."""
  log = logging.getLogger("multiformer_jax")
  schema.check(config)
  lock = locks.DirectoryLock(workdir, "training run")
  with faults.handling_stop_signals():
    try:
      processes.on_first_process(lambda: _take_workdir(workdir, lock, log),
                                 f"taking the workdir {workdir}")
      processes.on_first_process(
          lambda: run_record.record_config(workdir, config, accept_config_changes, log),
          f"checking the config against {workdir}'s")
      return _train_and_evaluate(config, workdir, log)
    finally:
      lock.release()


def _take_workdir(workdir: str, lock: locks.DirectoryLock, log: logging.Logger):
  ckpt_lib.check_writable(workdir)
  lock.acquire(log=log)


def _train_and_evaluate(config, workdir: str, log: logging.Logger) -> dict:
  # Process 0 prepares (the directory is shared); the others wait, then read it.
  processes.on_first_process(lambda: ensure_prepared(config, log),
                             f"preparing {config.data.prepared_dir}")
  if jax.process_count() > 1 and not os.path.exists(
      os.path.join(config.data.prepared_dir, "prepared.json")):
    raise MissingInput(
        f"process {jax.process_index()} does not see {config.data.prepared_dir}/prepared.json, "
        f"which process 0 prepared: data.prepared_dir must be on a filesystem every process "
        f"reads")
  processes.on_first_process(lambda: run_record.record_corpus(
      workdir, config.data.prepared_dir, (config.data.train_split, config.data.dev_split)),
                             f"checking {config.data.prepared_dir} against the run's corpus")
  mt_stage.check_prepared(config)
  dp = DataParallel(config.train.parallel)
  log.info("devices: %d local (%s), %d processes; parallel=%s", dp.num_local,
           jax.local_devices()[0].platform, jax.process_count(), dp.mode)
  log.info("host memory: %s", host_memory.describe())
  results = {}
  for stage in stages_run(config):
    results[stage] = {"train": run_stage(config, stage, workdir, dp)}
  if config.eval.after_training and jax.process_index() == 0:
    splits = evaluated_splits(config)
    for stage in config.train.stages:
      results[stage]["eval"] = scoring.evaluate_stage(config, workdir, stage, splits[0])
      for split in splits[1:]:
        results[stage][f"eval_{split}"] = scoring.evaluate_stage(config, workdir, stage, split)
  return results


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
  prepare = mt_stage.prepare if stage == mt_stage.STAGE else prepare_stage
  run, state = prepare(config, stage, workdir, dp, logger)
  step = int(state.step)
  state = dp.replicate(state)
  compile_clock.install()
  phases_before, compile_before = compile_clock.by_phase(), compile_clock.seconds()
  logger.start(step, run.stage_cfg.max_updates)
  stop = faults.active_stop_request()
  period = SavePeriod(config.train.checkpoint_every_minutes,
                      config.train.checkpoint_every_updates, step)
  try:
    with stop.deferred():                 # a stop asked while compiling: after update 1
      compile_programs(run, state)
      step, state, early_stopped = _train_loop(run, state, step,
                                               Agreement(dp, stop, period, stage))
  finally:
    run.iterator.close()
    logger.close()
  best = run.checkpoints.best()
  wall_s = logger.elapsed()
  phases = {k: v - phases_before[k] for k, v in compile_clock.by_phase().items()}
  compile_s = compile_clock.seconds() - compile_before
  best_meta = run.checkpoints.meta(best)
  summary = {"stage": stage, "updates": step, "early_stopped": early_stopped, "best_step": best,
             "best_dev_loss": best_meta.get("dev_loss"),
             "wall_s": round(wall_s, 1), "compile_s": round(compile_s, 1),
             "compile_fraction": round(compile_s / max(wall_s, 1e-9), 3),
             "compile_phases_s": {k: round(v, 1) for k, v in phases.items()}}
  if run.dev_scorer is not None:          # the best checkpoint's dev WER or BLEU
    metric = f"dev_{run.dev_scorer.metric}"
    summary[f"best_{metric}"] = best_meta.get(metric)
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
    run.checkpoints.remove_progress()       # nothing resumes a finished stage
  return summary


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


def _evaluate_and_save(run: StageRun, state: TrainState, step: int, agreement: Agreement):
  """The dev loss (and with a dev scorer its WER or BLEU), logged, and an evaluation
  checkpoint. A stop signal on any process cuts it short (EvaluationCut), every process at the
  same point: the dev loss between batches; dev scoring, which process 0 does alone while the
  others wait, between decoded batches."""
  dev = evaluate_loss(run.eval_step, state, run.dev_batcher, run.dp, agreement)
  scorer = run.dev_scorer
  if scorer is not None:
    scored = scorer(run.dp.unreplicate(state.params), cancelled=agreement.scoring_cancelled)
    cut = agreement.stop_signal() if scored is None else None
    if jax.process_count() > 1:
      agreement.scoring_finished(step, cut)
    if cut is not None:
      raise EvaluationCut(cut)
    dev.update(scored)
  elif run.scores_dev:                     # process 0 scores the dev split: wait for it
    agreement.wait_for_scoring(step)
  run.logger.scalars(step, dev)
  run.save(step, state, dev)
  scored = "" if scorer is None else (
      f", dev {scorer.metric.upper()} {dev[f'dev_{scorer.metric}']:.2f} (beam "
      f"{scorer.beam}, {dev['dev_decode_s']:.0f} s)")
  run.logger.log.info("step %d: dev loss %.4f, dev ppl %.2f%s; checkpoint saved", step,
                      dev["dev_loss"], dev["dev_ppl"], scored)


def _train_loop(run: StageRun, state: TrainState, step: int, agreement: Agreement):
  """Updates from `step` to the stage's max_updates, or to an early stop (train.
  early_stop_patience evaluations without a better dev loss): logs, evaluates and writes an
  evaluation checkpoint on schedule, and a progress checkpoint on its own period. Every process
  votes before each update (training.agreement); after an update where any was asked to stop,
  all save a progress checkpoint and raise Preempted. -> (step, state, early_stopped)."""
  config, stage, scfg = run.config, run.stage, run.stage_cfg
  eval_every = resolved_eval_every(scfg, run.iterator.batcher, run.update.update_freq)
  if run.evaluation_due:                  # a stop cut this update's evaluation short
    run.logger.log.info("stage %s: the dev evaluation of update %d, cut short by the stop, "
                        "first", stage, step)
    if _conclude_update(run, state, step, Decision(None, False), True, agreement, eval_every):
      return step, state, True
  while step < scfg.max_updates:
    vote = agreement.cast(step + 1)
    state = _update(run, state)
    step += 1
    decision = agreement.read(vote)
    if step % config.train.log_every == 0 or step == scfg.max_updates:
      nonfinite = run.logger.flush(step)
      if nonfinite >= config.train.max_consecutive_nonfinite:
        raise FloatingPointError(
            f"{nonfinite} consecutive updates had a non-finite loss or gradient (skipped); "
            f"try a lower {stage}.lr, a longer warmup, model.dtype=float32, or check the "
            f"data for corrupt features")
    evaluation = step % eval_every == 0 or step == scfg.max_updates
    if _conclude_update(run, state, step, decision, evaluation, agreement, eval_every):
      return step, state, True
  return step, state, False


def _conclude_update(run: StageRun, state: TrainState, step: int, decision: Decision,
                     evaluation: bool, agreement: Agreement, eval_every: int) -> bool:
  """What follows update `step`: its evaluation if due (none when a stop was decided), then on
  a stop (decided, or one that cut the evaluation short) a progress checkpoint that says
  whether the evaluation is still to do, and Preempted; else a progress checkpoint if its
  period is due. -> whether to stop early."""
  stop = decision.stop
  if evaluation and stop is None:
    try:
      if _evaluate(run, state, step, agreement, eval_every):
        return True
      agreement.period.saved(step)
      evaluation = False
    except EvaluationCut as cut:
      stop = cut.signum
  faults.fault_point(f"{run.stage}.update", step)              # tests: killed after an update
  if stop is not None:
    run.logger.flush(step)
    run.save_progress(step, state, faults.signal_name(stop), evaluation_due=evaluation)
    raise faults.Preempted(run.stage, step, stop)
  if decision.save and run.save_progress(step, state, "period"):
    agreement.period.saved(step)
    train_cfg = run.config.train
    run.logger.log.info("step %d: progress checkpoint saved (train.checkpoint_every_minutes="
                        "%g, checkpoint_every_updates=%d)", step,
                        train_cfg.checkpoint_every_minutes, train_cfg.checkpoint_every_updates)
  return False


def _evaluate(run: StageRun, state: TrainState, step: int, agreement: Agreement,
              eval_every: int) -> bool:
  """The evaluation of update `step` and its checkpoint; -> whether to stop early (train.
  early_stop_patience evaluations without a better dev loss)."""
  _evaluate_and_save(run, state, step, agreement)
  patience = run.config.train.early_stop_patience
  if not patience or step >= run.stage_cfg.max_updates:
    return False
  stale = evaluations_without_improvement(run.checkpoints, step, eval_every)
  if stale < patience:
    return False
  run.logger.log.info("stage %s: early stop at update %d: no dev loss improvement for %d "
                      "evaluations (train.early_stop_patience=%d), best at update %d",
                      run.stage, step, stale, patience, run.checkpoints.best())
  return True


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
