"""The optimizer of a stage: fairseq's learning-rate schedules, clip-norm and Adam (each its
arithmetic, tests/test_fairseq_training.py), and which parameters a stage trains
({stage}.train_only, {stage}.frozen), by their names in the parameter tree
('encoder/layers_0/...')."""

from __future__ import annotations

import math
from typing import Callable

import flax
import jax
import jax.numpy as jnp
import optax

from multiformer_common.errors import InvalidValue
from multiformer_jax.schema.sections import LR_SCHEDULERS


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


def make_schedule(stage_cfg):
  name = stage_cfg.lr_scheduler
  if name == "inverse_sqrt":
    return inverse_sqrt_schedule(stage_cfg.lr, stage_cfg.warmup_updates)
  if name == "polynomial_decay":
    return polynomial_decay_schedule(stage_cfg.lr, stage_cfg.warmup_updates,
                                     stage_cfg.max_updates)
  raise InvalidValue(f"lr_scheduler {name!r}; valid: {', '.join(LR_SCHEDULERS)}")


def make_optimizer(train_cfg, stage_cfg):
  schedule = make_schedule(stage_cfg)
  transforms = [freeze_all_but(trained_predicate(stage_cfg))] if freezes(stage_cfg) else []
  transforms += [clip_grad_norm(train_cfg.clip_norm),
                scale_by_fairseq_adam(train_cfg.adam_b1, train_cfg.adam_b2, train_cfg.adam_eps),
                optax.scale_by_learning_rate(schedule)]
  if train_cfg.selection_lr_multiplier != 1.0:
    transforms.append(scale_head_selector_updates(train_cfg.selection_lr_multiplier))
  return optax.chain(*transforms), schedule


def clip_grad_norm(max_norm: float) -> optax.GradientTransformation:
  """fairseq's clip_grad_norm_: every gradient times min(1, max_norm / (norm + 1e-6)), the
  norm over all of them; max_norm 0 (fairseq's --clip-norm 0) leaves them alone."""
  def update(updates, state, params=None):
    del params
    if max_norm <= 0:
      return updates, state
    coefficient = jnp.minimum(1.0, max_norm / (optax.global_norm(updates) + 1e-6))
    return jax.tree_util.tree_map(lambda g: g * coefficient.astype(g.dtype), updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_fairseq_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """fairseq's Adam (fairseq/optim/adam.py), before the learning rate: the moments as in
  every Adam, the step sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps). eps is added to
  the uncorrected sqrt(v); optax's scale_by_adam (and torch.optim.Adam) add it to the
  corrected one, where fairseq's amounts to eps / sqrt(1 - b2^t): 31.6 times theirs at t = 1
  with b2 0.999, 1.26 times at t = 1000. The state is optax's ScaleByAdamState."""
  def init(params):
    zeros = lambda p: jnp.zeros_like(p, jnp.float32)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=jax.tree_util.tree_map(zeros, params),
                                  nu=jax.tree_util.tree_map(zeros, params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1.0 - b2) * g * g, state.nu, updates)
    count = optax.safe_int32_increment(state.count)
    # 1 - b^t as -expm1(t log b): in float32, 1 - 0.999 ** 1 would be 6e-5 off relatively.
    t = count.astype(jnp.float32)
    correction = lambda b: -jnp.expm1(t * math.log(b))
    step_size = jnp.sqrt(correction(b2)) / correction(b1)
    updates = jax.tree_util.tree_map(lambda m, v: step_size * (m / (jnp.sqrt(v) + eps)), mu,
                                     nu)
    return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)
  return optax.GradientTransformation(init, update)


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
  return bool(stage_cfg.train_only or stage_cfg.frozen)


def trained_predicate(stage_cfg) -> Callable[[str], bool]:
  """name -> whether the stage trains that parameter: named by {stage}.train_only (or it is
  empty) and not by {stage}.frozen."""
  train_only, frozen = stage_cfg.train_only, stage_cfg.frozen
  return lambda name: trained_by_pattern(name, train_only) and not (
      frozen and _named(name, frozen))


def trained_values(params, stage_cfg, stage: str) -> tuple[int, int]:
  """(values trained, values in all) under {stage}.train_only and {stage}.frozen; each must
  name a parameter, and something must be left to train."""
  flat = flat_params(params)
  for key in ("train_only", "frozen"):
    pattern = stage_cfg[key]
    if pattern and not any(_named(n, pattern) for n in flat):
      raise InvalidValue(f"{stage}.{key}={pattern!r} names no parameter of this model; its "
                       f"parameters are under: {module_groups(flat)}")
  trained = [n for n in flat if trained_predicate(stage_cfg)(n)]
  if not trained:
    raise InvalidValue(f"{stage}.train_only={stage_cfg.train_only!r} and "
                     f"{stage}.frozen={stage_cfg.frozen!r} leave no parameter to "
                     f"train; its parameters are under: {module_groups(flat)}")
  return sum(flat[n].size for n in trained), sum(v.size for v in flat.values())


def freeze_all_but(trained: Callable[[str], bool]) -> optax.GradientTransformation:
  """Zeroes the gradients of every parameter that `trained` refuses, before clipping and
  Adam: their Adam moments stay 0, so they never move (the adapters' second step: "trained with
  the Transformer parameters frozen")."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda path, g: g if trained(param_name(path)) else jnp.zeros_like(g), updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def as_constants(params, trained: Callable[[str], bool]):
  """`params` with the leaves `trained` refuses behind stop_gradient: their gradients are
  symbolic zeros, so the backward pass of a frozen bottom (the conv subsampler under
  {stage}.frozen=encoder/subsample) is not computed at all."""
  return jax.tree_util.tree_map_with_path(
      lambda path, v: v if trained(param_name(path)) else jax.lax.stop_gradient(v), params)


def param_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def flat_params(params) -> dict:
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(dict(params)), sep="/")


def module_groups(names) -> str:
  """'encoder/layers_0, decoder/embed_tokens': the modules (first two path parts) of names."""
  return ", ".join(sorted({"/".join(n.split("/")[:2]) for n in names}))
