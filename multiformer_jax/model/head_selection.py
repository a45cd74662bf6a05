"""Head selection (Gong et al. 2022): per task and layer, H of H' candidate attention heads.

Each task t (a language, a domain or a pair: the stack's key, `model.encoder_task_tag` /
`decoder_task_tag` or the shared `model.task_tag`), layer l and candidate head h has a
logit phi[t, l, h], initialised uniformly in [ln 0.01, 0]. Training samples the Gumbel-sigmoid
s = sigmoid((phi + G1 - G2) / tau) (G1 - G2 of two standard Gumbels is a standard logistic) and
selects H heads:

  subset  the H candidates with the largest s;
  group   the candidates split into H strided groups {g, g+H, g+2H, ...}; one per group.

The selected heads' outputs are multiplied by the straight-through weight 1 - stop_grad(s) + s
(1 forward, ds backward) and fill the H slots of W_o (d x d as in the baseline): under `group`
slot g holds group g's head, under `subset` the selected heads in candidate order (the
reference ranks them by s, so a head's W_o rows change whenever the noise reorders the
samples). At inference the selection is deterministic, the top-H / per-group argmax of phi
with weight 1; `noisy` inference reproduces the reference, which samples noise there too.

Noise is drawn once per forward pass for every task, as in the reference; each example then
takes its own task's selection, so a batch may mix tasks. A caller may feed the noise in
instead (the variable `logistic` [tasks, layers, H'] of the `selection_noise` collection: how
tests replay the reference's draws).

`model.selection_subset_order="score"` puts the subset's heads in the order of their scores,
highest first, as the reference's topk does (so its checkpoints import), instead of candidate
order.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue

STRATEGIES = ("subset", "group")
INFERENCE_MODES = ("deterministic", "noisy")
SUBSET_ORDERS = ("candidate", "score")
NOISE_COLLECTION = "selection_noise"
LOGIT_INIT_RANGE = (math.log(0.01), 0.0)


def init_logits(key, shape, dtype=jnp.float32):
  """The reference's init: U[ln 0.01, ln 1]."""
  low, high = LOGIT_INIT_RANGE
  return jax.random.uniform(key, shape, dtype, low, high)


def gumbel_sigmoid(logits, key, temperature, noise=None):
  """s = sigmoid((phi + G1 - G2) / tau), with G1 - G2 ~ Logistic(0, 1) (drawn from `key`
  unless `noise` is given)."""
  if noise is None:
    noise = jax.random.logistic(key, logits.shape, logits.dtype)
  return jax.nn.sigmoid((logits + noise) / temperature)


def straight_through(values):
  """Value 1, gradient d values."""
  return 1.0 - jax.lax.stop_gradient(values) + values


def select(scores, num_heads: int, strategy: str, subset_order: str = "candidate"):
  """scores [..., H'] -> (indices [..., H] int32 into the candidates, chosen scores [..., H]).

  subset: the H largest scores, in candidate order (or by score, highest first). group: for
  slot g the best of the candidates {g, g+H, ...}.
  """
  candidates = scores.shape[-1]
  if strategy == "subset":
    _, top = jax.lax.top_k(scores, num_heads)
    indices = jnp.sort(top, axis=-1) if subset_order == "candidate" else top
  elif strategy == "group":
    grouped = scores.reshape(scores.shape[:-1] + (candidates // num_heads, num_heads))
    best = jnp.argmax(grouped, axis=-2)                          # [..., H]: row in the group
    indices = best * num_heads + jnp.arange(num_heads)
  else:
    raise InvalidValue(f"unknown head-selection strategy {strategy!r}; valid: {STRATEGIES}")
  indices = indices.astype(jnp.int32)
  return indices, jnp.take_along_axis(scores, indices, axis=-1)


def kl_per_task(samples, prior: float, eps: float = 1e-7):
  """samples [tasks, layers, H'] -> [tasks]: sum_{l,h} s (log s - log p) / (L * H')."""
  kl = samples * (jnp.log(samples + eps) - math.log(prior))
  return jnp.sum(kl, axis=(1, 2)) / (samples.shape[1] * samples.shape[2])


def selection_kl(samples, task_tokens, prior: float):
  """The reference's KL term: per-task KL weighted by the task's target tokens in the batch.
  samples [tasks, layers, H'], task_tokens [tasks] -> scalar."""
  return jnp.dot(kl_per_task(samples, prior), task_tokens)


class HeadSelector(nn.Module):
  """The selection logits of one stack (encoder or decoder self-attention) and the per-example
  selection of every layer.

  __call__(tasks [batch] int, temperature, deterministic) -> (indices [batch, layers, H],
  weights [batch, layers, H]). In training the Gumbel-sigmoid samples of every task are sown
  into the 'selection' collection (for the KL term).
  """
  num_tasks: int
  num_layers: int
  num_candidates: int
  num_heads: int
  strategy: str = "group"
  inference: str = "deterministic"
  temperature: float = 5.0         # used when a call passes none (evaluation, decoding)
  subset_order: str = "candidate"  # one of SUBSET_ORDERS

  @nn.compact
  def __call__(self, tasks, temperature=None, deterministic: bool = True):
    logits = self.param("logits", init_logits,
                        (self.num_tasks, self.num_layers, self.num_candidates))
    if deterministic and self.inference == "deterministic":
      indices, _ = select(logits, self.num_heads, self.strategy, self.subset_order)
      weights = jnp.ones(indices.shape, jnp.float32)
    else:
      temperature = self.temperature if temperature is None else temperature
      if self.has_variable(NOISE_COLLECTION, "logistic"):
        key, noise = None, self.get_variable(NOISE_COLLECTION, "logistic")
      else:
        key, noise = self.make_rng("dropout" if not deterministic else "selection"), None
      samples = gumbel_sigmoid(logits, key, temperature, noise)   # [tasks, layers, H']
      if not deterministic:
        self.sow("selection", "samples", samples)
      indices, chosen = select(samples, self.num_heads, self.strategy, self.subset_order)
      weights = straight_through(chosen)
    tasks = jnp.clip(tasks, 0, self.num_tasks - 1)
    return indices[tasks], weights[tasks]                  # [batch, layers, H] each


def stack_task_modules(config, side: str):
  """(HeadSelector or None, [TaskAdapter per layer] or None) of the encoder or decoder
  (`side`), as `config` (a ModelConfig) asks; created inside the stack's setup."""
  layers = getattr(config, f"{side}_layers")
  candidates = getattr(config, f"{side}_candidates")
  num_tasks = config.stack_num_tasks(side)
  selector = HeadSelector(num_tasks, layers, candidates, getattr(config, f"{side}_heads"),
                          config.selection_strategy, config.selection_inference,
                          config.selection_temperature, config.selection_subset_order,
                          name="head_selector") \
      if candidates else None
  adapters = [TaskAdapter(num_tasks, config.d_model, config.adapter_dim,
                          config.compute_dtype, name=f"adapters_{i}")
              for i in range(layers)] if config.adapter_dim else None
  return selector, adapters


def layer_selections(selector, num_layers: int, tasks, temperature=None,
                     deterministic: bool = True):
  """Per layer the (indices, weights) [batch, H] of the selected heads (Nones without a
  selector); temperature None = the model's selection_temperature."""
  if selector is None:
    return [None] * num_layers
  indices, weights = selector(tasks, temperature, deterministic)
  return [(indices[:, i], weights[:, i]) for i in range(num_layers)]


def adapt(adapters, layer: int, x, tasks):
  """x through the task adapter after `layer`, if the stack has adapters."""
  return x if adapters is None else adapters[layer](x, tasks)


def gather_heads(heads, indices, weights):
  """heads [batch, time, H', head_dim], indices / weights [batch, H] ->
  [batch, time, H, head_dim]: the selected heads in slot order, scaled by their weights."""
  chosen = jnp.take_along_axis(heads, indices[:, None, :, None], axis=2)
  return chosen * weights[:, None, :, None].astype(heads.dtype)


class TaskAdapter(nn.Module):
  """The adapter baseline (Bapna & Firat 2019): per task a bottleneck after a layer,
  x + W_up relu(W_down LN_t(x)). x [batch, time, d], tasks [batch] (None: task 0, a one-task
  model's) -> [batch, time, d]."""
  num_tasks: int
  d_model: int
  bottleneck: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, tasks):
    t, d, r = self.num_tasks, self.d_model, self.bottleneck
    scale = self.param("ln_scale", nn.initializers.ones, (t, d))
    bias = self.param("ln_bias", nn.initializers.zeros, (t, d))
    down = self.param("down", nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform",
                                                             in_axis=1, out_axis=2), (t, d, r))
    up = self.param("up", nn.initializers.zeros, (t, r, d))   # starts as the identity
    if tasks is None:
      tasks = jnp.zeros(x.shape[:1], jnp.int32)
    tasks = jnp.clip(tasks, 0, t - 1)
    mean = jnp.mean(x.astype(jnp.float32), -1, keepdims=True)
    var = jnp.mean(jnp.square(x.astype(jnp.float32) - mean), -1, keepdims=True)
    h = (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale[tasks][:, None] + bias[tasks][:, None]
    h = jnp.einsum("btd,bdr->btr", h.astype(self.dtype), down[tasks].astype(self.dtype))
    h = jnp.einsum("btr,brd->btd", nn.relu(h), up[tasks].astype(self.dtype))
    return x + h
