"""Two-stage training (ASR pre-training, then ST with the encoder carried over).

One stage = fairseq's recipe in JAX: Adam, inverse-sqrt schedule with linear warmup from 0,
clip-norm, gradient accumulation (`update_freq`, exact: gradient sums over all micro-batches
divided by their total target tokens), label-smoothed cross-entropy, dev loss every
`eval_every` updates with a checkpoint, the best by dev loss kept beside the last K.

Rerunning the same command resumes: a finished stage (its DONE file) is skipped, an unfinished
one continues from its latest checkpoint with the optimizer state, the RNG key and the
data-iterator position, so the run continues with exactly the batch it would have seen next.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import compile_clock
from multiformer_jax.training import curves
from multiformer_jax.evaluation import evaluate
from multiformer_jax.runtime import faults
from multiformer_jax.runtime import host_memory
from multiformer_jax.model import head_selection
from multiformer_jax.evaluation import inference
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.experiment import (initial_params, known_task_rows, model_config_for,
                                         pipeline_config, stage_ctc_weight, stage_key,
                                         task_keys)
from multiformer_jax.evaluation.metrics import ctc_loss_sum, label_smoothed_nll
from multiformer_jax.model import S2TModel, init_params
from multiformer_jax.training import text_stage
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.runtime.train_log import StageLogger

DONE = "DONE.json"
PAD_ID = 1


@flax.struct.dataclass
class TrainState:
  step: jnp.ndarray          # updates applied (or skipped as non-finite)
  micro_step: jnp.ndarray    # micro-batches seen: the dropout key is fold_in(rng, micro_step)
  params: Any
  opt_state: Any
  grad_acc: Any              # gradient sums since the last update (zero between updates)
  acc_tokens: jnp.ndarray    # target tokens since the last update
  rng: jnp.ndarray
  nonfinite: jnp.ndarray     # consecutive skipped updates


def inverse_sqrt_schedule(peak_lr: float, warmup: int):
  """fairseq inverse_sqrt: lr = peak * u / warmup during warmup (from 0), then
  peak * sqrt(warmup / u), u being the number of updates already applied."""
  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    warm = peak_lr * count / max(warmup, 1)
    decay = peak_lr * jnp.sqrt(max(warmup, 1) / jnp.maximum(count, 1.0))
    return jnp.where(count < warmup, warm, decay)
  return schedule


def polynomial_decay_schedule(peak_lr: float, warmup: int, total: int, power: float = 1.0,
                              end_lr: float = 0.0):
  """fairseq polynomial_decay: lr = peak * u / warmup during warmup (from 0), then
  end + (peak - end) * (1 - (u - warmup) / (total - warmup)) ** power, end_lr from u = total."""
  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    warm = peak_lr * count / max(warmup, 1)
    remaining = jnp.clip(1.0 - (count - warmup) / max(total - warmup, 1), 0.0, 1.0)
    decay = end_lr + (peak_lr - end_lr) * remaining ** power
    return jnp.where(count < warmup, warm, decay)
  return schedule


LR_SCHEDULERS = ("inverse_sqrt", "polynomial_decay")


def make_schedule(stage_cfg):
  name = stage_cfg.get("lr_scheduler", "inverse_sqrt")
  if name == "inverse_sqrt":
    return inverse_sqrt_schedule(stage_cfg.lr, stage_cfg.warmup_updates)
  if name == "polynomial_decay":
    if stage_cfg.max_updates <= stage_cfg.warmup_updates:
      raise ValueError(f"lr_scheduler polynomial_decay decays from warmup_updates "
                       f"({stage_cfg.warmup_updates}) to max_updates ({stage_cfg.max_updates}); "
                       f"max_updates must be larger")
    return polynomial_decay_schedule(stage_cfg.lr, stage_cfg.warmup_updates,
                                     stage_cfg.max_updates)
  raise ValueError(f"lr_scheduler {name!r}; valid: {', '.join(LR_SCHEDULERS)}")


def make_optimizer(train_cfg, stage_cfg):
  schedule = make_schedule(stage_cfg)
  transforms = [freeze_all_but(trained_predicate(stage_cfg))] if freezes(stage_cfg) else []
  transforms += [optax.clip_by_global_norm(train_cfg.clip_norm),
                optax.scale_by_adam(train_cfg.adam_b1, train_cfg.adam_b2, train_cfg.adam_eps),
                optax.scale_by_learning_rate(schedule)]
  if train_cfg.selection_lr_multiplier != 1.0:
    transforms.append(scale_head_selector_updates(train_cfg.selection_lr_multiplier))
  return optax.chain(*transforms), schedule


def scale_head_selector_updates(multiplier: float) -> optax.GradientTransformation:
  """Multiplies the updates of the head-selection logits (a learning rate of their own, as
  architecture parameters often get): with Adam a logit moves at most about lr per update, so
  short runs barely leave the random initial selection at the model's learning rate."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda path, u: u * multiplier if "head_selector" in jax.tree_util.keystr(path) else u,
        updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def trained_by_pattern(name: str, pattern: str) -> bool:
  """Whether parameter `name` ('encoder/adapters_0/up', ...) is trained under
  {stage}.train_only=`pattern`: a comma-separated list of substrings, '' = every parameter."""
  return not pattern or _named(name, pattern)


def _named(name: str, pattern: str) -> bool:
  return any(part and part in name for part in pattern.split(","))


def freezes(stage_cfg) -> bool:
  """Whether the stage keeps some parameters fixed ({stage}.train_only or {stage}.frozen)."""
  return bool(stage_cfg.get("train_only", "") or stage_cfg.get("frozen", ""))


def trained_predicate(stage_cfg) -> Callable[[str], bool]:
  """name -> whether the stage trains that parameter: named by {stage}.train_only (or it is
  empty) and not by {stage}.frozen."""
  train_only, frozen = stage_cfg.get("train_only", ""), stage_cfg.get("frozen", "")
  return lambda name: trained_by_pattern(name, train_only) and not (
      frozen and _named(name, frozen))


def freeze_all_but(trained: Callable[[str], bool]) -> optax.GradientTransformation:
  """Zeroes the gradients of every parameter that `trained` refuses, before clipping and
  Adam: their Adam moments stay 0, so they never move (the adapters' second step: "trained with
  the Transformer parameters frozen")."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda path, g: g if trained(_param_name(path)) else jnp.zeros_like(g), updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def as_constants(params, trained: Callable[[str], bool]):
  """`params` with the leaves `trained` refuses behind stop_gradient: their gradients are
  symbolic zeros, so the backward pass of a frozen bottom (the conv subsampler under
  {stage}.frozen=encoder/subsample) is not computed at all."""
  return jax.tree_util.tree_map_with_path(
      lambda path, v: v if trained(_param_name(path)) else jax.lax.stop_gradient(v), params)


def _param_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _flat(params) -> dict:
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(dict(params)), sep="/")


def _groups(names) -> str:
  """'encoder/layers_0, decoder/embed_tokens': the modules (first two path parts) of names."""
  return ", ".join(sorted({"/".join(n.split("/")[:2]) for n in names}))


def copy_tensors(params, source, take, labels=("source", "model")
                 ) -> tuple[dict, list[str], list[str]]:
  """Copies into `params` every tensor `take(name)` selects that `source` has, shapes fitting:
  -> (flat params, names restored, '<name>: <labels[0]> <shape> vs <labels[1]> <shape>' for
  the misfits)."""
  flat, flat_source = _flat(params), _flat(source)
  restored, mismatched = [], []
  for name, value in flat.items():
    if name in flat_source and take(name):
      shape = tuple(np.shape(flat_source[name]))
      if shape != tuple(value.shape):
        mismatched.append(f"{name}: {labels[0]} {shape} vs {labels[1]} {tuple(value.shape)}")
      else:
        flat[name] = jnp.asarray(flat_source[name], value.dtype)
        restored.append(name)
  return flat, restored, mismatched


def init_from_run(params, stage_cfg, stage: str, log: logging.Logger):
  """{stage}.init_from: the parameters of another run's same stage (its workdir), selected by
  {stage}.init_from_checkpoint; tensors the run lacks (new adapters, say) stay freshly
  initialised, shapes must fit. The T5X-style restore a two-step recipe needs."""
  directory = os.path.join(stage_cfg.init_from, stage, "checkpoints")
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"{stage}.init_from={stage_cfg.init_from!r}: no {directory}; give "
                            f"the workdir of a run that trained the {stage} stage")
  source, which = ckpt_lib.StageCheckpoints(directory).select_params(
      stage_cfg.get("init_from_checkpoint", "latest"), stage_cfg.get("init_from_average", 10))
  flat, restored, mismatched = copy_tensors(params, source, lambda name: True,
                                            ("there", "here"))
  if mismatched:
    raise ValueError(f"{stage}.init_from={stage_cfg.init_from!r} does not fit this model:\n  "
                     + "\n  ".join(mismatched))
  restored_names = set(restored)
  fresh = [n for n in flat if n not in restored_names]
  log.info("%s init from %s (%s): restored %d tensors, freshly initialised %d (%s)", stage,
           stage_cfg.init_from, which, len(restored), len(fresh), _groups(fresh) or "none")
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def trained_values(params, stage_cfg, stage: str) -> tuple[int, int]:
  """(values trained, values in all) under {stage}.train_only and {stage}.frozen; each must
  name a parameter, and something must be left to train."""
  flat = _flat(params)
  for key in ("train_only", "frozen"):
    pattern = stage_cfg.get(key, "")
    if pattern and not any(_named(n, pattern) for n in flat):
      raise ValueError(f"{stage}.{key}={pattern!r} names no parameter of this model; its "
                       f"parameters are under: {_groups(flat)}")
  trained = [n for n in flat if trained_predicate(stage_cfg)(n)]
  if not trained:
    raise ValueError(f"{stage}.train_only={stage_cfg.get('train_only', '')!r} and "
                     f"{stage}.frozen={stage_cfg.get('frozen', '')!r} leave no parameter to "
                     f"train; its parameters are under: {_groups(flat)}")
  return sum(flat[n].size for n in trained), sum(v.size for v in flat.values())


def create_state(model: S2TModel, tx, key) -> TrainState:
  init_key, rng = jax.random.split(key)
  params = init_params(model, init_key)
  return TrainState(step=jnp.array(0, jnp.int32), micro_step=jnp.array(0, jnp.int32),
                    params=params, opt_state=tx.init(params),
                    grad_acc=jax.tree_util.tree_map(jnp.zeros_like, params),
                    acc_tokens=jnp.array(0.0, jnp.float32), rng=rng,
                    nonfinite=jnp.array(0, jnp.int32))


def selection_temperature(train_cfg, initial: float, step):
  """Gumbel-sigmoid temperature after `step` updates: max(min, initial * exp(-decay * step));
  decay 0 (the reference) keeps it constant."""
  decay = train_cfg.selection_temperature_decay
  if not decay:
    return jnp.asarray(initial, jnp.float32)
  return jnp.maximum(train_cfg.selection_temperature_min,
                     initial * jnp.exp(-decay * jnp.asarray(step, jnp.float32)))


def make_steps(model: S2TModel, tx, schedule, dp: DataParallel, label_smoothing: float,
               train_cfg=None, ctc_weight: float = 0.0,
               trained: Callable[[str], bool] | None = None):
  """-> (train_step(state, batch, apply_update, first_micro), eval_step(state, batch)), compiled.

  train_step's two static flags give the micro-batch's place in an update of `update_freq`
  micro-batches: `first_micro` (it starts the update) and `apply_update` (it ends it; with
  update_freq = 1 both are True). The first micro-batch's gradients become the sums without
  reading `grad_acc`, which is zero between updates; an update that started with it leaves
  `grad_acc` untouched (still zero). The results are those of always adding into `grad_acc`
  and zeroing it after the update; the parameter-sized accumulator is just not read and
  rewritten when there is nothing in it.

  A non-finite loss or gradient norm skips the update (parameters and optimizer state kept)
  through `lax.cond`, not a select per leaf: with the select XLA recomputes Adam's new moments
  inside the parameters' update and so reads the old moments twice, which costs a copy of
  every donated parameter, moment and accumulator per update (on a 2-core CPU the optimizer's
  part of an s2t_transformer_s update took about twice as long; docs/notes/benchmarks-lab-notebook.md).

  Head-selection models add the KL term of their Gumbel-sigmoid samples, weighted by each
  task's target tokens (train.kl_weight; 0 in the published recipes, then it is only logged).

  With ctc_weight > 0 (a model with a CTC head) the loss is ESPnet's hybrid CTC/attention one,
  (1 - w) * label-smoothed CE + w * CTC, both summed over the batch and divided, like the CE,
  by the target tokens of the update. The CTC spells the batch's `ctc_targets` where it has
  them (an ST stage's source transcripts), else its targets.

  `trained` (parameter name -> bool, default: all) differentiates only the parameters it
  accepts (`as_constants`); the optimizer's freeze_all_but keeps the others fixed.
  """
  cfg = model.config
  if ctc_weight and not cfg.ctc_head:
    raise ValueError(f"ctc_weight {ctc_weight} needs a model with a CTC head (ctc_head=True)")
  selecting = bool(cfg.encoder_candidates or cfg.decoder_candidates)

  def loss_sums(params, batch, deterministic, key=None, step=None):
    rngs = {"dropout": key} if key is not None else {}
    tasks = inference.batch_tasks(batch)
    temperature = None if step is None or train_cfg is None else selection_temperature(
        train_cfg, cfg.selection_temperature, step)
    logits, sown = model.apply({"params": params}, batch["features"], batch["lengths"],
                               batch["prev_tokens"], deterministic, tasks, temperature,
                               rngs=rngs, mutable=["selection", "ctc"])
    targets = jnp.where(batch["weights"][:, None] > 0, batch["targets"], PAD_ID)
    loss, nll, tokens = label_smoothed_nll(logits, targets, label_smoothing)
    aux = {"nll": nll, "tokens": tokens}
    if ctc_weight:
      ctc_logits, ctc_mask = sown["ctc"]["logits"][0]
      # ASR: the transcript the decoder writes; ST: the source transcript (ctc_targets).
      ctc_targets = batch.get("ctc_targets", targets)
      ctc, _ = ctc_loss_sum(ctc_logits, ctc_mask, ctc_targets, batch["weights"], cfg.bos_id,
                            cfg.pad_id, cfg.eos_id)
      loss = (1.0 - ctc_weight) * loss + ctc_weight * ctc
      aux["ctc"] = ctc
    if selecting and not deterministic:
      per_example = jnp.sum(targets != PAD_ID, axis=1).astype(jnp.float32)
      kl = 0.0
      for side, (stack, candidates, heads) in enumerate(
          (("encoder", cfg.encoder_candidates, cfg.encoder_heads),
           ("decoder", cfg.decoder_candidates, cfg.decoder_heads))):
        if candidates:
          task_ids = None if tasks is None else tasks[side]
          if task_ids is None:
            task_ids = jnp.zeros(batch["weights"].shape, jnp.int32)
          task_tokens = jnp.zeros(cfg.stack_num_tasks(stack)).at[jnp.clip(task_ids, 0)].add(
              per_example)
          samples = sown["selection"][stack]["head_selector"]["samples"][0]
          kl = kl + head_selection.selection_kl(samples, task_tokens, heads / candidates)
      aux["kl"] = kl
      loss = loss + (train_cfg.kl_weight if train_cfg is not None else 0.0) * kl
    return loss, aux

  def apply_optimizer(operands):
    params, opt_state, grads = operands
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def train_step(state: TrainState, batch, apply_update: bool, first_micro: bool):
    key = jax.random.fold_in(jax.random.fold_in(state.rng, state.micro_step),
                             dp.device_index())
    differentiated = loss_sums if trained is None else (
        lambda params, *rest: loss_sums(as_constants(params, trained), *rest))
    (loss, aux), grads = jax.value_and_grad(differentiated, has_aux=True)(
        state.params, batch, False, key, state.step)
    sums = dp.psum({"loss": loss, **aux, "examples": jnp.sum(batch["weights"]),
                    "frames": jnp.sum(batch["lengths"] * (batch["weights"] > 0))})
    grads = dp.psum(grads)
    grad_acc = grads if first_micro else jax.tree_util.tree_map(jnp.add, state.grad_acc, grads)
    acc_tokens = sums["tokens"] + (0.0 if first_micro else state.acc_tokens)
    state = state.replace(micro_step=state.micro_step + 1)
    if not apply_update:
      return state.replace(grad_acc=grad_acc, acc_tokens=acc_tokens), sums
    grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(acc_tokens, 1.0), grad_acc)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(sums["loss"])
    params, opt_state = jax.lax.cond(finite, apply_optimizer, lambda operands: operands[:2],
                                     (state.params, state.opt_state, grads))
    lr = schedule(state.step)
    state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state,
        grad_acc=(state.grad_acc if first_micro
                  else jax.tree_util.tree_map(jnp.zeros_like, state.grad_acc)),
        acc_tokens=jnp.zeros_like(state.acc_tokens),
        nonfinite=jnp.where(finite, 0, state.nonfinite + 1))
    return state, {**sums, "grad_norm": grad_norm, "lr": lr, "finite": finite}

  def eval_step(state: TrainState, batch):
    loss, aux = loss_sums(state.params, batch, True)
    return dp.psum({"loss": loss, **aux})

  return (dp.compile(train_step, static_argnums=(2, 3), donate_argnums=(0,)),
          dp.compile(eval_step))


def carried_from_asr(name: str, decoder_layers: bool) -> bool:
  """Whether ST init takes tensor `name` from the ASR checkpoint: the encoder; with
  `decoder_layers` also the decoder's layers and final norm (its embeddings and output
  projection belong to the ASR vocabulary). The CTC head is carried by carry_from_asr when
  both have one of the same size (an ST stage with CTC on the source transcript)."""
  if name.startswith("encoder/"):
    return True
  return decoder_layers and (name.startswith("decoder/layers_") or
                             name.startswith("decoder/layer_norm/"))


def carry_from_asr(params, asr_params, log: logging.Logger, decoder_layers: bool = False):
  """ST init: the encoder from the ASR checkpoint (and with `decoder_layers` the decoder's
  layers), the rest fresh. Shapes must fit."""
  flat_asr = _flat(asr_params)
  shapes = {name: np.shape(value) for name, value in _flat(params).items()}
  carried = lambda name: carried_from_asr(name, decoder_layers) or (
      name.startswith("ctc_proj/") and name in flat_asr and
      np.shape(flat_asr[name]) == shapes.get(name))
  flat, restored, mismatched = copy_tensors(params, asr_params, carried, ("ASR", "ST"))
  missing = [n for n in flat if carried(n) and n not in flat_asr]
  if mismatched or missing:
    raise ValueError("the ASR checkpoint does not fit the ST model config:\n  " +
                     "\n  ".join(mismatched + [f"{n}: not in the ASR checkpoint"
                                               for n in missing]) +
                     "\nUse the same model.* settings for both stages.")
  restored_names = set(restored)
  fresh = [n for n in flat if n not in restored_names]
  skipped = sorted(n for n in flat_asr if not carried(n))
  log.info("ST init: restored %d %s tensors from ASR, skipped %d ASR tensors (vocabulary-"
           "bound), freshly initialised %d tensors", len(restored),
           "encoder and decoder-layer" if decoder_layers else "encoder", len(skipped),
           len(fresh))
  for title, names in (("restored", restored), ("skipped", skipped), ("fresh", fresh)):
    log.info("  %s: %s", title, _groups(names))
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def loader_workers(config) -> int:
  """data.loader_workers, with -1 resolved by backend: on a CPU the step uses every core and
  batches are assembled between steps (dispatch is asynchronous, so that overlaps the step);
  with an accelerator, background processes keep up with a fast step."""
  workers = config.data.get("loader_workers", 0)
  if workers >= 0:
    return workers
  return 0 if jax.default_backend() == "cpu" else max(1, min(8, (os.cpu_count() or 2) // 2))


def evaluate_loss(eval_step, state, batcher: ip.Batcher, dp: DataParallel) -> dict:
  totals = {"loss": 0.0, "nll": 0.0, "tokens": 0.0}
  for batch in ip.eval_batches(batcher):
    sums = eval_step(state, dp.shard(batch))
    for k in totals:
      totals[k] += dp.scalar(sums[k])
  tokens = max(totals["tokens"], 1.0)
  return {"dev_loss": totals["loss"] / tokens, "dev_nll": totals["nll"] / tokens,
          "dev_ppl": float(np.exp(min(totals["nll"] / tokens, 50.0)))}


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
    self.beam = e.get("score_dev_beam", 1)
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


def run_stage(config, stage: str, workdir: str, dp: DataParallel) -> dict:
  """Trains one stage to its max_updates (resuming if interrupted); returns its summary."""
  stage_dir = os.path.join(workdir, stage)
  os.makedirs(stage_dir, exist_ok=True)
  done_path = os.path.join(stage_dir, DONE)
  primary = jax.process_index() == 0
  logger = StageLogger(stage_dir, stage, primary)
  log = logger.log
  if os.path.exists(done_path):
    with open(done_path, encoding="utf-8") as f:
      summary = json.load(f)
    log.info("stage %s already finished (%s): skipped", stage, done_path)
    return summary
  scfg = config[stage]
  train_data = ip.SplitData(pipeline_config(config, stage), config.data.train_split)
  if stage == "st" and text_stage.distilling(config):
    train_data = text_stage.with_distilled_targets(train_data, workdir, log)
  dev_data = ip.SplitData(pipeline_config(config, stage, "dev"), config.data.dev_split)
  tasks = task_keys(config, stage)
  dev_data, unknown = known_task_rows(dev_data, tasks)
  if unknown:
    log.warning("stage %s: %d dev utterances have no task in the model and are left out of "
                "the dev loss and score: %s", stage, sum(unknown.values()), unknown)
  train_batcher = ip.Batcher(train_data, True, dp.global_batch_multiple, jax.process_index(),
                             jax.process_count(), tasks=tasks)
  model = S2TModel(model_config_for(config, train_data.vocab.size, tasks, stage))
  for side, key in (tasks or {}).items():
    log.info("stage %s: %s heads keyed by %s, %d tasks: %s", stage, side, key.field,
             len(key.names), ", ".join(key.names))
  log.info("stage %s: pairs %s", stage, ", ".join(ip.split_tags(train_data)["pair"]))
  dev_batcher = ip.Batcher(dev_data, False, dp.global_batch_multiple, jax.process_index(),
                           jax.process_count(), tasks=tasks)
  if train_batcher.too_long:
    log.warning("stage %s: %d training utterances longer than data.max_source_frames=%d are "
                "skipped (e.g. %s)", stage, len(train_batcher.too_long),
                config.data.max_source_frames, ", ".join(train_batcher.too_long[:5]))
  log.info("stage %s: %d train / %d dev utterances, vocabulary %d, batch shapes "
           "(batch, frames, tokens) %s, %d batch(es) of <= %d padded frames per update",
           stage, len(train_data), len(dev_data), train_data.vocab.size, train_batcher.shapes,
           scfg.update_freq, config.data.max_frames)
  tx, schedule = make_optimizer(config.train, scfg)
  checkpoints = ckpt_lib.StageCheckpoints(os.path.join(stage_dir, "checkpoints"),
                                          scfg.keep_last, stage, kept_around_best(config, stage))
  state = create_state(model, tx, stage_key(config, stage))
  iterator = ip.TrainIterator(train_batcher, workers=loader_workers(config),
                              prefetch=config.data.get("prefetch_batches", 4))
  log.info("%s: training batches assembled %s; log.jsonl's data_wait_s is the time the loop "
           "waited for them", stage, f"ahead by {iterator.workers} worker processes"
           if iterator.workers else "in the training loop")
  resumed = checkpoints.restore_latest_valid(state, log)
  if resumed is not None:
    state, meta, latest = resumed
    iterator.restore(meta["iterator"])
    log.info("resumed stage %s from step %d (%s), data position %s", stage, latest,
             checkpoints.directory, meta["iterator"])
  elif scfg.get("init_from", ""):
    state = state.replace(params=init_from_run(state.params, scfg, stage, log))
  else:
    if stage == "st" and "asr" in config.train.stages:
      asr = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"))
      asr_params, which = asr.select_params(scfg.encoder_init, scfg.encoder_init_average)
      log.info("ST encoder from the ASR stage: %s", which)
      state = state.replace(params=carry_from_asr(state.params, asr_params, log,
                                                  scfg.get("carry_decoder_layers", False)))
    decoder, encoder = text_stage.starts_decoder(config), text_stage.stacks_encoder(config)
    if stage == "st" and (decoder or encoder):
      state = state.replace(params=text_stage.carry_from_text_stage(
          state.params, workdir, log, decoder, encoder))
  if freezes(scfg):
    trained, total = trained_values(state.params, scfg, stage)
    log.info("%s: training %d of %d values (train_only %r, frozen %r); the rest stay fixed",
             stage, trained, total, scfg.get("train_only", ""), scfg.get("frozen", ""))
  log.info("%s: %d parameters; encoder key block %d, FFN token chunk %d (0 = dense; "
           "model.key_block_size / ffn_token_chunk, -1 = by backend)", stage,
           sum(x.size for x in jax.tree_util.tree_leaves(state.params)),
           model.config.resolved_key_block_size, model.config.resolved_ffn_token_chunk)

  train_step, eval_step = make_steps(model, tx, schedule, dp, config.train.label_smoothing,
                                     config.train, stage_ctc_weight(config, stage),
                                     trained_predicate(scfg) if freezes(scfg) else None)
  dev_scorer = DevScorer(config, stage, model, dev_data, tasks) if (
      primary and config.eval.get("score_dev", False)) else None
  step = int(state.step)
  state = dp.replicate(state)
  compile_clock.install()
  phases_before, compile_before = compile_clock.by_phase(), compile_clock.seconds()
  logger.start(step, scfg.max_updates)
  try:
    with faults.StopRequest() as stop:
      step, state, early_stopped = _train_loop(
          config, stage, state, step, iterator, train_step, eval_step, dev_batcher, dp,
          checkpoints, logger, stop, train_data, model, dev_scorer)
  finally:
    iterator.close()
    logger.close()
  best = checkpoints.best()
  wall_s = logger.elapsed()
  phases = {k: v - phases_before[k] for k, v in compile_clock.by_phase().items()}
  compile_s = compile_clock.seconds() - compile_before
  summary = {"stage": stage, "updates": step, "early_stopped": early_stopped, "best_step": best,
             "best_dev_loss": checkpoints.meta(best).get("dev_loss"),
             "wall_s": round(wall_s, 1), "compile_s": round(compile_s, 1),
             "compile_fraction": round(compile_s / max(wall_s, 1e-9), 3),
             "compile_phases_s": {k: round(v, 1) for k, v in phases.items()}}
  log.info("stage %s: %.0f s in the training loop, %.0f s of it compiling (%.0f%%: train and "
           "dev steps per batch shape%s; tracing %.0f s, lowering %.0f s, XLA or the "
           "persistent cache (train.compilation_cache) %.0f s)", stage, wall_s, compile_s,
           100 * summary["compile_fraction"], ", dev decoding" if dev_scorer is not None else "",
           phases["trace"], phases["lower"], phases["compile"])
  log.info("stage %s finished: parameter checksum %s (process %d of %d)", stage,
           params_checksum(dp.unreplicate(state.params)), jax.process_index(),
           jax.process_count())
  if primary:
    curve = curves.plot_learning_curve(stage_dir, stage)
    if curve:
      log.info("stage %s: learning curve in %s", stage, curve)
    with open(done_path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
    os.replace(done_path + ".tmp", done_path)
  return summary


def params_checksum(params) -> str:
  """sha256 of every parameter's bytes in tree order: equal iff the parameters are bit-equal."""
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(params):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]


def _train_loop(config, stage, state, step, iterator, train_step, eval_step, dev_batcher, dp,
                checkpoints, logger, stop, train_data, model, dev_scorer=None):
  """Updates from `step` to the stage's max_updates, or to an early stop (train.
  early_stop_patience evaluations without a better dev loss): logs, evaluates (dev loss; with
  a `dev_scorer` also dev WER or BLEU) and checkpoints on schedule; on a stop request saves a
  checkpoint after the current update and raises Preempted. -> (step, state, early_stopped)."""
  scfg, log = config[stage], logger.log
  eval_every = resolved_eval_every(scfg, iterator.batcher)
  patience = config.train.get("early_stop_patience", 0)
  seen_shapes = set()
  while step < scfg.max_updates:
    update_ids = []
    for micro in range(scfg.update_freq):
      waited = time.perf_counter()
      batch = next(iterator)
      logger.data_wait(time.perf_counter() - waited)
      update_ids += [str(train_data.ids[i]) for i in batch["index"] if i >= 0]
      shape = batch["features"].shape[:2] + batch["targets"].shape[1:]
      if shape not in seen_shapes:
        seen_shapes.add(shape)
        log.info("compiling the train step for batch shape %s (first use; later steps with "
                 "this shape are fast)", shape)
      last_micro = micro == scfg.update_freq - 1
      state, metrics = train_step(state, dp.shard(batch), last_micro, micro == 0)
      logger.accumulate(metrics, update_ids if last_micro else None)
    step += 1
    if step % config.train.log_every == 0 or step == scfg.max_updates:
      nonfinite = logger.flush(step)
      if nonfinite >= config.train.max_consecutive_nonfinite:
        raise FloatingPointError(
            f"{nonfinite} consecutive updates had a non-finite loss or gradient (skipped); "
            f"try a lower {stage}.lr, a longer warmup, model.dtype=float32, or check the "
            f"data for corrupt features")
    if step % eval_every == 0 or step == scfg.max_updates:
      dev = evaluate_loss(eval_step, state, dev_batcher, dp)
      if dev_scorer is not None:
        dev.update(dev_scorer(dp.unreplicate(state.params)))
      logger.scalars(step, dev)
      meta = {"stage": stage, "step": step, "iterator": iterator.state(), **dev,
              "model": model.config.to_dict()}
      checkpoints.save(step, dp.unreplicate(state), meta)
      scored = "" if dev_scorer is None else (
          f", dev {dev_scorer.metric.upper()} {dev[f'dev_{dev_scorer.metric}']:.2f} (beam "
          f"{dev_scorer.beam}, {dev['dev_decode_s']:.0f} s)")
      log.info("step %d: dev loss %.4f, dev ppl %.2f%s; checkpoint saved", step,
               dev["dev_loss"], dev["dev_ppl"], scored)
      if patience and step < scfg.max_updates:
        stale = evaluations_without_improvement(checkpoints, step, eval_every)
        if stale >= patience:
          log.info("stage %s: early stop at update %d: no dev loss improvement for %d "
                   "evaluations (train.early_stop_patience=%d), best at update %d", stage, step,
                   stale, patience, checkpoints.best())
          return step, state, True
    faults.fault_point(f"{stage}.update", step)               # tests: killed after an update
    if _stop_agreed(stop, step, config.train.log_every):
      logger.flush(step)
      checkpoints.save(step, dp.unreplicate(state), {      # a no-op if saved at this step
          "stage": stage, "step": step, "iterator": iterator.state(), "dev_loss": None,
          "model": model.config.to_dict(), "saved_on": "SIGTERM"})
      raise faults.Preempted(stage, step)
  return step, state, False


def evaluations_without_improvement(checkpoints, step: int, eval_every: int) -> int:
  """Evaluations since the best dev loss (fairseq's --patience counts them the same way):
  from the saved checkpoints, so it survives a resume."""
  best = checkpoints.best()
  return 0 if best is None else (step - best) // eval_every


def resolved_eval_every(stage_cfg, batcher: ip.Batcher) -> int:
  """{stage}.eval_every, with -1 = once per epoch of the training data (fairseq's default:
  validate and save at every epoch end): the epoch's batches / update_freq updates."""
  if stage_cfg.eval_every == -1:
    return max(1, len(batcher.epoch_plan(0)) // stage_cfg.update_freq)
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


def ensure_prepared(config, log: logging.Logger):
  """Prepares data.prepared_dir from data.root when needed (builds the embedded corpus first
  if data.embedded); a no-op when it is already prepared."""
  d = config.data
  from data_prep import embedded_corpus, prepare  # pylint: disable=import-outside-toplevel
  specs = [embedded_corpus.CorpusSpec(
      sources=tuple(d.embedded_sources.split(",")), target=target, seed=d.seed,
      text=tuple(d.get("embedded_text", "catalogs").split(",")),
      train_speakers_per_sentence=d.get("embedded_speakers_per_sentence", 2),
      train_speakers_per_variant=d.get("embedded_speakers_per_variant", 1),
      extra_training_variants=d.get("embedded_extra_training_variants", False),
      max_heldout=d.get("embedded_max_heldout", 0),
      synthesizers=tuple(d.get("embedded_synthesizers", "espeak").split(",")),
      unseen_synthesizer=d.get("embedded_unseen_synthesizer", ""),
      other_synthesizer_share=d.get("embedded_other_synthesizer_share", 0.0),
      other_speakers_per_voice=d.get("embedded_other_speakers_per_voice", 0),
      bible_english=d.get("embedded_bible_english", "web"),
      bible_max_words=d.get("embedded_bible_max_words", 20))
      for target in d.embedded_target.split(",")] if d.embedded else []
  if os.path.exists(os.path.join(d.prepared_dir, "prepared.json")):
    for spec in specs:     # an embedded corpus of another spec: refused, not silently used
      for source, target in spec.directions():
        embedded_corpus.is_built(embedded_corpus.direction_dir(d.root, source, target), spec)
    return
  if not d.root:
    raise FileNotFoundError(f"data.prepared_dir={d.prepared_dir!r} is not prepared and "
                            f"data.root is empty: set --config.data.root to the corpus "
                            f"download directory, or run python -m data_prep.prepare")
  if specs:
    log.info("building the embedded corpus in %s", d.root)
  for spec in specs:
    embedded_corpus.build(d.root, spec)
  extra = extra_test_splits(config)
  if specs:      # an embedded split a synthesizer that cannot be had here would speak: none
    built = set().union(*(embedded_corpus.effective_spec(s, lambda m: None).splits()
                          for s in specs))
    extra = [s for s in extra if s in built]
  log.info("preparing %s -> %s", d.root, d.prepared_dir)
  prepare.prepare(d.corpus, d.root, d.pairs.split(","), d.prepared_dir,
                  [d.train_split, d.dev_split, d.test_split, *extra], d.asr_vocab, d.st_vocab,
                  speed_perturb=prepare.parse_speeds(d.get("speed_perturb", "")),
                  eval_only_pairs=[p for p in d.get("eval_only_pairs", "").split(",") if p])


def extra_test_splits(config) -> list[str]:
  """data.extra_test_splits as a list (empty where the saved config predates the key)."""
  return [s.strip() for s in config.data.get("extra_test_splits", "").split(",") if s.strip()]


def evaluated_splits(config) -> list[str]:
  """The splits evaluation after training reads: data.test_split, then each of
  data.extra_test_splits that was prepared."""
  prepared = ip.read_summary(config.data.prepared_dir)["splits"]
  return [config.data.test_split] + [s for s in extra_test_splits(config) if s in prepared]


def kept_around_best(config, stage: str) -> int:
  """How many checkpoints around the best a stage keeps (1: the best alone): as many as
  evaluation by "around_best" or, for the ASR stage, the ST encoder init by it averages."""
  counts = [1]
  if config.eval.checkpoint == "around_best":
    counts.append(evaluate.averaged_count(config, "around_best"))
  if (stage == "asr" and "st" in config.train.stages and
      config.st.encoder_init == "around_best"):
    counts.append(config.st.encoder_init_average)
  return max(counts)


def check_checkpoint_retention(config):
  """The checkpoint selections are known ones, and averaging N checkpoints needs N kept: each
  stage's keep_last must cover eval.average_last (evaluation by "average") and the ASR
  stage's st.encoder_init_average (ST encoder init by "average"); "around_best" keeps its
  own."""
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
    needs.append(("asr", config.st.encoder_init_average, "st.encoder_init_average"))
  for stage, count, key in needs:
    if config[stage].keep_last < count:
      raise ValueError(f"{stage}.keep_last={config[stage].keep_last} keeps fewer checkpoints "
                       f"than {key}={count} averages; set {stage}.keep_last >= {count} or "
                       f"lower {key}")


def train_and_evaluate(config, workdir: str) -> dict:
  """All stages of `config.train.stages` in order, then (if eval.after_training) evaluation."""
  log = logging.getLogger("multiformer_jax")
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
  if jax.process_index() == 0:
    ckpt_lib.save_config(workdir, config)
  ensure_prepared(config, log)
  text_stage.check_config(config, prepared=True)
  dp = DataParallel(config.train.parallel)
  log.info("devices: %d local (%s), %d processes; parallel=%s", dp.num_local,
           jax.local_devices()[0].platform, jax.process_count(), dp.mode)
  log.info("host memory: %s", host_memory.describe())
  results = {}
  for stage in config.train.stages:
    if stage == "st" and text_stage.wanted(config):
      results[text_stage.STAGE] = {"train": text_stage.run_text_stage(config, workdir, log)}
      if text_stage.distilling(config):
        results[text_stage.STAGE]["distilled"] = text_stage.distil_training_targets(
            config, workdir, log)
    results[stage] = {"train": run_stage(config, stage, workdir, dp)}
  if config.eval.after_training and jax.process_index() == 0:
    splits = evaluated_splits(config)
    for stage in config.train.stages:
      results[stage]["eval"] = evaluate.evaluate_stage(config, workdir, stage, splits[0])
      for split in splits[1:]:
        results[stage][f"eval_{split}"] = evaluate.evaluate_stage(config, workdir, stage, split)
  return results
