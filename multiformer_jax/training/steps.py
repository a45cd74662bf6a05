"""The compiled steps of a stage: the training state, the update (gradient accumulation,
skipped non-finite updates, hybrid CTC/attention and head-selection losses) and the dev loss."""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from data_prep.common.token_ids import PAD_ID
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import inference
from multiformer_jax.evaluation.metrics import ctc_loss_sum, label_smoothed_nll
from multiformer_jax.model import S2TModel, head_selection, init_params
from multiformer_jax.training.optimizer import as_constants
from multiformer_jax.training.parallel import AXIS, DataParallel


@flax.struct.dataclass
class TrainState:
  step: jnp.ndarray          # updates applied (or skipped as non-finite)
  micro_step: jnp.ndarray    # micro-batches seen: the dropout key is fold_in(rng, micro_step)
  params: Any
  opt_state: Any
  grad_acc: Any              # gradient sums since the last update (zero between updates)
  acc_tokens: jnp.ndarray    # target tokens since the last update (over every device)
  rng: jnp.ndarray
  nonfinite: jnp.ndarray     # consecutive skipped updates


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


def make_loss_sums(model: S2TModel, label_smoothing: float, train_cfg=None,
                   ctc_weight: float = 0.0):
  """-> loss_sums(params, batch, deterministic, key=None, step=None) -> (loss, aux sums).

  Head-selection models add the KL term of their Gumbel-sigmoid samples, weighted by each
  task's target tokens (train.kl_weight; 0 in the published recipes, then it is only logged).

  With ctc_weight > 0 (a model with a CTC head) the loss is ESPnet's hybrid CTC/attention one,
  (1 - w) * label-smoothed CE + w * CTC, both summed over the batch and divided, like the CE,
  by the target tokens of the update. The CTC spells the batch's `ctc_targets` where it has
  them (an ST stage's source transcripts), else its targets.
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

  return loss_sums


class Programs:
  """A step function compiled once per shape of its arguments, ahead of use where `compile`
  is given their specs (jax.ShapeDtypeStruct), else on first call."""

  def __init__(self, function, name: str, call_compiled: bool = True):
    self.function, self.name, self.call_compiled = function, name, call_compiled
    self.compiled = {}
    self.not_ahead = set()        # argument shapes first met in a call (compiled then)

  @staticmethod
  def key(args) -> tuple:
    return tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args))

  def lower(self, state, *specs):
    """The lowered program for (state, *specs), or None where it is compiled already."""
    if self.key(specs) in self.compiled:
      return None
    return self.function.lower(state, *specs)

  def keep(self, specs, lowered) -> None:
    """Compiles `lowered` (from `lower(state, *specs)`) and keeps it for calls of that shape.
    XLA releases the GIL while it compiles, so several can run in threads."""
    executable = lowered.compile()
    self.compiled[self.key(specs)] = executable if self.call_compiled else self.function

  def compile(self, state, *specs):
    """Compiles for (state, *specs) unless already compiled; -> whether it compiled."""
    lowered = self.lower(state, *specs)
    if lowered is None:
      return False
    self.keep(specs, lowered)
    return True

  def __call__(self, state, *args):
    key = self.key(args)
    compiled = self.compiled.get(key)
    if compiled is None and self.compiled and key not in self.not_ahead:
      self.not_ahead.add(key)
      logging.getLogger("multiformer_jax").warning(
          "%s: compiling for argument shapes %s, which were not compiled ahead", self.name,
          [shape for shape, _ in key])
    return (compiled or self.function)(state, *args)


class TrainStep:
  """The update's programs, called `train_step(state, batch, apply_update, first_micro)` for
  each micro-batch of an update (`first_micro`: it starts the update, `apply_update`: it
  ends it).

  An update of one micro-batch is one program per batch shape (`single`: the gradients
  all-reduced once and applied). An update of several is `accumulate` per batch shape (each
  device adds its micro-batch's gradients into its own accumulator, no all-reduce) and one
  `apply` whatever the shapes (the accumulated gradients all-reduced once, divided by the
  update's target tokens, clipped and applied). Under pmap the accumulator is the state's
  `grad_acc` (one per device); under jit it is an array [devices, ...] sharded over the
  devices, made by `zeros` at an update's first micro-batch and passed between the programs
  (never in a checkpoint: checkpoints are saved between updates). No static flag multiplies the
  programs: a stage needs its batch shapes' programs plus at most two."""

  def __init__(self, single: Programs, accumulate: Programs, apply: Programs,
               zeros: Programs | None = None, accumulator_spec=None):
    self.single, self.accumulate, self.apply = single, accumulate, apply
    self.zeros, self.accumulator_spec = zeros, accumulator_spec    # jit only
    self._accumulator = None

  def programs(self, batch_specs: list, update_freq: int, params=None
               ) -> list[tuple[Programs, tuple]]:
    """(programs, specs after the state) of every program an update of `update_freq`
    micro-batches of these shapes runs (`params`: the state's, for jit's accumulator)."""
    if update_freq == 1:
      return [(self.single, (spec,)) for spec in batch_specs]
    if self.zeros is None:
      return [(self.accumulate, (spec,)) for spec in batch_specs] + [(self.apply, ())]
    accumulator = self.accumulator_spec(params)
    return ([(self.zeros, ())] + [(self.accumulate, (accumulator, spec)) for spec in batch_specs]
            + [(self.apply, (accumulator,))])

  def __call__(self, state, batch, apply_update: bool = True, first_micro: bool = True):
    if apply_update and first_micro:
      return self.single(state, batch)
    if self.zeros is None:
      state, sums = self.accumulate(state, batch)
      if not apply_update:
        return state, sums
      state, update = self.apply(state)
      return state, {**sums, **update}
    if first_micro or self._accumulator is None:
      self._accumulator = self.zeros(state)
    state, self._accumulator, sums = self.accumulate(state, self._accumulator, batch)
    if not apply_update:
      return state, sums
    accumulator, self._accumulator = self._accumulator, None
    state, update = self.apply(state, accumulator)
    return state, {**sums, **update}


def make_steps(model: S2TModel, tx, schedule, dp: DataParallel, label_smoothing: float,
               train_cfg=None, ctc_weight: float = 0.0,
               trained: Callable[[str], bool] | None = None):
  """-> (TrainStep, eval_step: Programs of eval(state, batch)); the loss is make_loss_sums'.

  Between updates `grad_acc` is zero (and jit's accumulator gone). A non-finite loss or
  gradient norm skips the update (parameters and optimizer state kept) through `lax.cond`,
  not a select per leaf: with the
  select XLA recomputes Adam's new moments inside the parameters' update and so reads the
  old moments twice, which costs a copy of every donated parameter, moment and accumulator per
  update (on a 2-core CPU the optimizer's part of an s2t_transformer_s update took about twice
  as long; docs/notes/benchmarks-lab-notebook.md).

  `trained` (parameter name -> bool, default: all) differentiates only the parameters it
  accepts (`as_constants`); the optimizer's freeze_all_but keeps the others fixed.
  """
  loss_sums = make_loss_sums(model, label_smoothing, train_cfg, ctc_weight)

  def apply_optimizer(operands):
    params, opt_state, grads = operands
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  differentiated = loss_sums if trained is None else (
      lambda params, *rest: loss_sums(as_constants(params, trained), *rest))

  def gradients(state: TrainState, batch, device):
    """-> (gradient sums of `batch`, its loss sums), dropout keyed by the micro-batch and
    `device`."""
    key = jax.random.fold_in(jax.random.fold_in(state.rng, state.micro_step), device)
    (loss, aux), grads = jax.value_and_grad(differentiated, has_aux=True)(
        state.params, batch, False, key, state.step)
    return grads, {"loss": loss, **aux, "examples": jnp.sum(batch["weights"]),
                   "frames": jnp.sum(batch["lengths"] * (batch["weights"] > 0))}

  def micro_gradients(state: TrainState, batch):
    """-> (this device's gradient sums, the micro-batch's sums over every device)."""
    grads, sums = gradients(state, batch, dp.device_index())
    return grads, dp.psum(sums)

  def device_gradients(state: TrainState, batch):
    """jit: -> (every device's gradient sums of its slice, stacked [devices, ...] where they
    were computed, no all-reduce; the micro-batch's sums over every device). The dropout keys
    are pmap's."""
    def per_device(state, batch):
      grads, sums = gradients(state, batch, jax.lax.axis_index(AXIS))
      return (jax.tree_util.tree_map(lambda g: g[None], grads),
              jax.lax.psum(sums, AXIS))
    return dp.per_device(per_device)(state, batch)

  def finish_update(state: TrainState, grads, tokens, loss, grad_acc):
    """The update from its gradient sums over every device and its target tokens; skipped
    where the gradient norm or `loss` is not finite."""
    grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(tokens, 1.0), grads)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(loss)
    params, opt_state = jax.lax.cond(finite, apply_optimizer, lambda operands: operands[:2],
                                     (state.params, state.opt_state, grads))
    lr = schedule(state.step)
    state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                          grad_acc=grad_acc, acc_tokens=jnp.zeros_like(state.acc_tokens),
                          nonfinite=jnp.where(finite, 0, state.nonfinite + 1))
    return state, {"grad_norm": grad_norm, "lr": lr, "finite": finite}

  def single(state: TrainState, batch):
    grads, sums = micro_gradients(state, batch)
    state = state.replace(micro_step=state.micro_step + 1)
    state, update = finish_update(state, dp.psum(grads), sums["tokens"], sums["loss"],
                                  state.grad_acc)       # untouched: still zero
    return state, {**sums, **update}

  def accumulate(state: TrainState, batch):
    grads, sums = micro_gradients(state, batch)
    return state.replace(
        micro_step=state.micro_step + 1,
        grad_acc=jax.tree_util.tree_map(jnp.add, state.grad_acc, grads),   # this device's
        acc_tokens=state.acc_tokens + sums["tokens"]), sums

  def apply(state: TrainState):
    # A non-finite micro-batch loss makes its gradients, and so their norm, non-finite.
    return finish_update(state, dp.psum(state.grad_acc), state.acc_tokens, 0.0,
                         jax.tree_util.tree_map(jnp.zeros_like, state.grad_acc))

  # jit: the accumulator [devices, ...] sharded over the devices, outside the state.
  devices = jax.device_count()

  def zeros(state: TrainState):
    return jax.tree_util.tree_map(
        lambda p: jax.lax.with_sharding_constraint(
            jnp.zeros((devices,) + p.shape, p.dtype), dp.sharded), state.params)

  def accumulator_spec(params):
    return jax.tree_util.tree_map(
        lambda p: jax.ShapeDtypeStruct((devices,) + tuple(p.shape), p.dtype,
                                       sharding=dp.sharded), params)

  def accumulate_on_devices(state: TrainState, accumulator, batch):
    grads, sums = device_gradients(state, batch)
    return (state.replace(micro_step=state.micro_step + 1,
                          acc_tokens=state.acc_tokens + sums["tokens"]),
            jax.tree_util.tree_map(jnp.add, accumulator, grads), sums)

  def apply_from_devices(state: TrainState, accumulator):
    grads = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), accumulator)  # the all-reduce
    return finish_update(state, grads, state.acc_tokens, 0.0, state.grad_acc)   # still zero

  def eval_step(state: TrainState, batch):
    loss, aux = loss_sums(state.params, batch, True)
    return dp.psum({"loss": loss, **aux})

  compile_ = lambda fn, name, donate=(0,): Programs(
      dp.compile(fn, donate_argnums=donate), name, dp.calls_compiled)
  single_step = compile_(single, "train step")
  if dp.mode == "jit":
    train_step = TrainStep(single_step, compile_(accumulate_on_devices, "accumulate", (0, 1)),
                           compile_(apply_from_devices, "apply"),
                           compile_(zeros, "zero accumulator", ()), accumulator_spec)
  else:
    train_step = TrainStep(single_step, compile_(accumulate, "accumulate"),
                           compile_(apply, "apply"))
  return train_step, compile_(eval_step, "dev loss", ())


def evaluate_loss(eval_step, state, batcher: ip.Batcher, dp: DataParallel) -> dict:
  totals = {"loss": 0.0, "nll": 0.0, "tokens": 0.0}
  for batch in ip.eval_batches(batcher):
    sums = eval_step(state, dp.shard(batch))
    for k in totals:
      totals[k] += dp.scalar(sums[k])
  tokens = max(totals["tokens"], 1.0)
  return {"dev_loss": totals["loss"] / tokens, "dev_nll": totals["nll"] / tokens,
          "dev_ppl": float(np.exp(min(totals["nll"] / tokens, 50.0)))}


def params_checksum(params) -> str:
  """sha256 of every parameter's bytes in tree order: equal iff the parameters are bit-equal."""
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(params):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]
