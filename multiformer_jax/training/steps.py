"""The compiled steps of a stage: the training state, the update (`train_step` for an update
of one micro-batch; `accumulate_step` + `apply_step` under pmap, their `_on_devices` /
`_from_devices` forms under jit, for several; non-finite updates skipped) and the dev loss
(`eval_step`), on the losses of loss.py."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.model import S2TModel, init_params
from multiformer_jax.training.loss import make_loss_sums
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


def create_state(model: S2TModel, tx, key, init: Callable = init_params) -> TrainState:
  """The state before the first update; `init(model, key)` makes the parameters (an
  S2TModel's by default)."""
  init_key, rng = jax.random.split(key)
  params = init(model, init_key)
  return TrainState(step=jnp.array(0, jnp.int32), micro_step=jnp.array(0, jnp.int32),
                    params=params, opt_state=tx.init(params),
                    grad_acc=jax.tree_util.tree_map(jnp.zeros_like, params),
                    acc_tokens=jnp.array(0.0, jnp.float32), rng=rng,
                    nonfinite=jnp.array(0, jnp.int32))


class Programs:
  """A step function compiled once per shape of its arguments: ahead of use where `lower` and
  `keep` are given their specs (jax.ShapeDtypeStruct), else on first call."""

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


@dataclasses.dataclass(frozen=True)
class UpdateRule:
  """What an update computes besides the state and the batch: the loss (loss.make_loss_sums),
  the optimizer and its schedule, the data parallelism, and which parameters are trained
  (`trained`, parameter name -> bool; None: all). The step functions below take it first and
  make_steps binds it (functools.partial) before compiling them."""
  loss_sums: Callable
  tx: optax.GradientTransformation
  schedule: Callable
  dp: DataParallel
  trained: Callable[[str], bool] | None = None

  def differentiated(self, params, *rest):
    """The loss, with the parameters `trained` refuses behind stop_gradient (`as_constants`):
    their backward is not computed; the optimizer's freeze_all_but keeps them fixed."""
    if self.trained is not None:
      params = as_constants(params, self.trained)
    return self.loss_sums(params, *rest)


def gradients(rule: UpdateRule, state: TrainState, batch, device):
  """-> (gradient sums of `batch`, its loss sums), dropout keyed by the micro-batch and
  `device`."""
  key = jax.random.fold_in(jax.random.fold_in(state.rng, state.micro_step), device)
  (loss, aux), grads = jax.value_and_grad(rule.differentiated, has_aux=True)(
      state.params, batch, False, key, state.step)
  return grads, {"loss": loss, **aux, "examples": jnp.sum(batch["weights"]),
                 "frames": jnp.sum(batch["lengths"] * (batch["weights"] > 0))}


def micro_gradients(rule: UpdateRule, state: TrainState, batch):
  """-> (this device's gradient sums, the micro-batch's sums over every device)."""
  grads, sums = gradients(rule, state, batch, rule.dp.device_index())
  return grads, rule.dp.psum(sums)


def finish_update(rule: UpdateRule, state: TrainState, grads, tokens, loss, grad_acc):
  """The update from its gradient sums over every device and its target tokens; skipped
  where the gradient norm or `loss` is not finite."""
  def apply_optimizer(operands):
    params, opt_state, grads = operands
    updates, opt_state = rule.tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(tokens, 1.0), grads)
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(loss)
  params, opt_state = jax.lax.cond(finite, apply_optimizer, lambda operands: operands[:2],
                                   (state.params, state.opt_state, grads))
  lr = rule.schedule(state.step)
  state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                        grad_acc=grad_acc, acc_tokens=jnp.zeros_like(state.acc_tokens),
                        nonfinite=jnp.where(finite, 0, state.nonfinite + 1))
  return state, {"grad_norm": grad_norm, "lr": lr, "finite": finite}


def train_step(rule: UpdateRule, state: TrainState, batch):
  """An update of one micro-batch: its gradients all-reduced once and applied."""
  grads, sums = micro_gradients(rule, state, batch)
  state = state.replace(micro_step=state.micro_step + 1)
  state, update = finish_update(rule, state, rule.dp.psum(grads), sums["tokens"], sums["loss"],
                                state.grad_acc)       # untouched: still zero
  return state, {**sums, **update}


def accumulate_step(rule: UpdateRule, state: TrainState, batch):
  """pmap: a micro-batch's gradients added into this device's `grad_acc` (no all-reduce)."""
  grads, sums = micro_gradients(rule, state, batch)
  return state.replace(
      micro_step=state.micro_step + 1,
      grad_acc=jax.tree_util.tree_map(jnp.add, state.grad_acc, grads),   # this device's
      acc_tokens=state.acc_tokens + sums["tokens"]), sums


def apply_step(rule: UpdateRule, state: TrainState):
  """pmap: the accumulated gradients all-reduced once and applied; `grad_acc` zeroed."""
  # A non-finite micro-batch loss makes its gradients, and so their norm, non-finite.
  return finish_update(rule, state, rule.dp.psum(state.grad_acc), state.acc_tokens, 0.0,
                       jax.tree_util.tree_map(jnp.zeros_like, state.grad_acc))


def zero_accumulator(rule: UpdateRule, state: TrainState):
  """jit: the accumulator [devices, ...] of zeros, sharded over the devices."""
  devices = jax.device_count()
  return jax.tree_util.tree_map(
      lambda p: jax.lax.with_sharding_constraint(
          jnp.zeros((devices,) + p.shape, p.dtype), rule.dp.sharded), state.params)


def accumulator_spec(dp: DataParallel, params):
  """jit: the accumulator's shapes (jax.ShapeDtypeStruct), to compile ahead."""
  devices = jax.device_count()
  return jax.tree_util.tree_map(
      lambda p: jax.ShapeDtypeStruct((devices,) + tuple(p.shape), p.dtype,
                                     sharding=dp.sharded), params)


def accumulate_on_devices(rule: UpdateRule, state: TrainState, accumulator, batch):
  """jit: every device's gradient sums of its slice of `batch` added into its row of the
  accumulator where they were computed (shard_map, no all-reduce); the dropout keys are
  pmap's."""
  def per_device(state, batch):
    grads, sums = gradients(rule, state, batch, jax.lax.axis_index(AXIS))
    return (jax.tree_util.tree_map(lambda g: g[None], grads), jax.lax.psum(sums, AXIS))
  grads, sums = rule.dp.per_device(per_device)(state, batch)
  return (state.replace(micro_step=state.micro_step + 1,
                        acc_tokens=state.acc_tokens + sums["tokens"]),
          jax.tree_util.tree_map(jnp.add, accumulator, grads), sums)


def apply_from_devices(rule: UpdateRule, state: TrainState, accumulator):
  """jit: the accumulator summed over its devices (the one all-reduce) and applied."""
  grads = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), accumulator)
  return finish_update(rule, state, grads, state.acc_tokens, 0.0, state.grad_acc)  # still 0


def eval_step(rule: UpdateRule, state: TrainState, batch):
  """The dev loss sums of `batch` over every device (no dropout)."""
  loss, aux = rule.loss_sums(state.params, batch, True)
  return rule.dp.psum({"loss": loss, **aux})


def make_steps(model: S2TModel, tx, schedule, dp: DataParallel, label_smoothing: float,
               train_cfg=None, ctc_weight: float = 0.0,
               trained: Callable[[str], bool] | None = None, loss_sums: Callable | None = None):
  """-> (TrainStep, eval_step: Programs of eval(state, batch)): the step functions above with
  their UpdateRule bound, compiled for `dp`; the loss is `loss_sums` (the MT stage's:
  loss.make_mt_loss_sums), by default loss.make_loss_sums' of `model`.

  Between updates `grad_acc` is zero (and jit's accumulator gone). A non-finite loss or
  gradient norm skips the update (parameters and optimizer state kept) through `lax.cond`,
  not a select per leaf: with the select XLA recomputes Adam's new moments inside the
  parameters' update and so reads the old moments twice, which costs a copy of every donated
  parameter, moment and accumulator per update (on a 2-core CPU the optimizer's part of an
  s2t_transformer_s update took about twice as long; docs/notes/benchmarks-lab-notebook.md).
  """
  if loss_sums is None:
    loss_sums = make_loss_sums(model, label_smoothing, train_cfg, ctc_weight)
  rule = UpdateRule(loss_sums, tx, schedule, dp, trained)
  compile_ = lambda fn, name, donate=(0,): Programs(
      dp.compile(functools.partial(fn, rule), donate_argnums=donate), name, dp.calls_compiled)
  single = compile_(train_step, "train step")
  if dp.mode == "jit":
    steps = TrainStep(single, compile_(accumulate_on_devices, "accumulate", (0, 1)),
                      compile_(apply_from_devices, "apply"),
                      compile_(zero_accumulator, "zero accumulator", ()),
                      functools.partial(accumulator_spec, dp))
  else:
    steps = TrainStep(single, compile_(accumulate_step, "accumulate"),
                      compile_(apply_step, "apply"))
  return steps, compile_(eval_step, "dev loss", ())


def evaluate_loss(eval_step, state, batcher: ip.Batcher, dp: DataParallel,
                  agreement=None) -> dict:
  """The dev loss, perplexity and NLL per target token. With an `agreement`
  (training.agreement), every process votes before each batch and all stop at the same batch
  if one was asked to stop (EvaluationCut)."""
  totals = {"loss": 0.0, "nll": 0.0, "tokens": 0.0}
  for batch in ip.eval_batches(batcher):
    vote = agreement.cast() if agreement is not None else None
    sums = eval_step(state, dp.shard(batch))
    if vote is not None:
      agreement.check_dev_batch(vote)
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
