"""`kernel(m)` heads (the thesis's "Fast"): Performer FAVOR+ with positive orthogonal features.

softmax(q k^T / sqrt(d)) is approximated by phi(q) phi(k)^T with
phi(x) = m^-1/2 (exp(w_r . x' - |x'|^2 / 2 - c) + eps)_r,  x' = d^-1/4 x,
w_r orthogonal Gaussian rows with chi-distributed norms (Choromanski et al. 2021). The
stabiliser c is per position for queries (it cancels but for eps's share) and, for keys, the
maximum over the features and the *valid* positions of the utterance, so an utterance's output
does not depend on its padding or its batch-mates. Padded keys have their features zeroed:
masking is exact.

The constant m^-1/2 cancels between the numerator and the normaliser, so the features here leave
it out (for m = 256 that is bit-exact: 1/16 is a power of two). It saved a full-size multiply
forward and backward, which XLA:CPU also materialised as a broadcast.

On the CPU backend, float32 heads run through a C++ kernel (kernel_cpu.py: the same function,
about 1.5x faster fwd+bwd at n = 4096); `implementation="xla"` keeps them on XLA.

Features are either fixed (drawn from `seed`, the same on every call, so a checkpoint plus its
config reproduce them) or redrawn at every training step from the step's dropout key; eval
always uses the fixed draw.

`kernel(thesis)` heads compute performer-pytorch 1.1.3's FastAttention as the thesis's code
called it: no padding mask (padded keys and their values count, and the keys' stabiliser is the
maximum over every position), int(hd ln hd) features unless given, and the projection matrix a
weight of the model (`projection`, drawn at initialisation as FastAttention draws it, never
trained: its gradient is stopped), so a checkpoint of the thesis's code imports exactly.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.attention.cpu_kernels import IMPLEMENTATIONS, kernel_chosen
from multiformer_jax.model.attention.kernel_cpu import favor_attention_cpu, kernel_unsupported

FEATURE_EPS = 1e-4     # the Performer reference's additive stabiliser on the features
REDRAW_POLICIES = ("fixed", "step")


def orthogonal_gaussian_features(key, num_features: int, dim: int):
  """[num_features, dim]: stacked blocks of orthogonal rows, each row scaled to the norm of a
  Gaussian vector (so rows are marginally N(0, I) but orthogonal within a block)."""
  num_blocks = -(-num_features // dim)
  block_keys = jax.random.split(key, num_blocks + 1)
  blocks = []
  for i in range(num_blocks):
    gaussian = jax.random.normal(block_keys[i], (dim, dim), jnp.float32)
    q, _ = jnp.linalg.qr(gaussian)
    blocks.append(q.T)
  rows = jnp.concatenate(blocks, axis=0)[:num_features]
  norms = jnp.linalg.norm(jax.random.normal(block_keys[-1], (num_features, dim)), axis=1)
  return rows * norms[:, None]


def fixed_features(seed: int, num_features: int, dim: int) -> jax.Array:
  """orthogonal_gaussian_features of PRNGKey(seed), a concrete array drawn once per process
  and setting of JAX's random bits: every trace of a model with fixed kernel heads (its
  initialisation, train and dev steps, each search) takes it as a constant instead of
  drawing it again, one small eager program per operation, inside the trace."""
  return _fixed_features(seed, num_features, dim, jax.config.jax_default_prng_impl,
                         jax.config.jax_threefry_partitionable)


@functools.lru_cache(maxsize=64)
def _fixed_features(seed, num_features, dim, prng_impl, threefry_partitionable):
  del prng_impl, threefry_partitionable          # part of the cache's key: they set the bits
  with jax.ensure_compile_time_eval():
    return orthogonal_gaussian_features(jax.random.PRNGKey(seed), num_features, dim)


@jax.custom_vjp
def query_stabiliser(x, projection, u):
  """max(u, axis=-1, keepdims=True) for u = x @ projection.T, whose derivative is taken at the
  first argmax and sent straight to x and the projection through that feature's row.

  The derivative of `jnp.max` is a mask the size of u ([.., features]); here it is a gather
  of one projection row per position ([.., dim]). The feature index is a min over a select,
  which XLA:CPU vectorises; `jnp.argmax` is a two-operand reduce, which it does not.
  It is the derivative of the same function; it differs from jnp.max's only where two
  features tie exactly for the maximum (jnp.max shares the tangent among them)."""
  return jnp.max(u, axis=-1, keepdims=True)


def _query_stabiliser_fwd(x, projection, u):
  stabiliser = jnp.max(u, axis=-1, keepdims=True)
  features = u.shape[-1]
  first_argmax = jnp.min(jnp.where(u == stabiliser, jnp.arange(features, dtype=jnp.int32),
                                   features), axis=-1)                # [...]
  return stabiliser, (x, projection, first_argmax)


def _query_stabiliser_bwd(residuals, d_stabiliser):
  x, projection, first_argmax = residuals                             # d_stabiliser [..., 1]
  d_x = d_stabiliser * projection[first_argmax]                       # [..., dim]
  d_projection = jnp.zeros_like(projection).at[first_argmax.reshape(-1)].add(
      (d_stabiliser * x).reshape(-1, x.shape[-1]))
  return d_x, d_projection, None


query_stabiliser.defvjp(_query_stabiliser_fwd, _query_stabiliser_bwd)


def exp_features(x, projection, valid=None):
  """x: [batch, heads, time, dim] -> [batch, heads, time, features] (float32):
  phi(x) m^1/2 - eps, i.e. exp(w_r . x' - |x'|^2 / 2 - c) (zero for padded keys).

  valid: None for queries (stabiliser per position); a [batch, time] bool key mask for keys
  (stabiliser over valid positions; padded rows set to zero).
  """
  x = x.astype(jnp.float32) * x.shape[-1] ** -0.25
  u = jnp.einsum("bhtd,md->bhtm", x, projection)
  half_sq_norm = 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
  if valid is None:
    stabiliser = query_stabiliser(x, projection, u)
  else:
    valid = valid[:, None, :, None]
    stabiliser = jnp.max(jnp.where(valid, u, -jnp.inf), axis=(2, 3), keepdims=True)
    stabiliser = jax.lax.stop_gradient(jnp.where(jnp.isfinite(stabiliser), stabiliser, 0.0))
  features = jnp.exp(u - half_sq_norm - stabiliser)
  if valid is not None:
    features = jnp.where(valid, features, 0.0)
  return features


def positive_features(x, projection, valid=None):
  """x: [batch, heads, time, dim] -> [batch, heads, time, features] (float32), phi(x) m^1/2.
  See exp_features for `valid`."""
  features = exp_features(x, projection, valid) + FEATURE_EPS
  if valid is not None:
    features = jnp.where(valid[:, None, :, None], features, 0.0)
  return features


def heads_major(x):
  """[batch, time, heads, dim] <-> [batch, heads, time, dim]: batched matmuls over contiguous
  rows (the time-major einsums ran ~2x slower on CPU, mostly in transposes)."""
  return jnp.swapaxes(x, 1, 2)


def with_ones_column(values):
  """[..., dim] -> [..., dim + 1]: a column of ones beside the values, so one product with the
  key features gives both the weighted values and the normaliser."""
  return jnp.concatenate([values, jnp.ones(values.shape[:-1] + (1,), values.dtype)], axis=-1)


def favor_attention(q, k, v, key_mask, projection, implementation: str = "auto"):
  """Linear-time attention: [batch, time, heads, dim] -> same shape, O(n * m * dim).

  implementation: "auto" (the CPU kernel where it applies, else XLA), "xla", or "cpu" (the
  kernel, or a ValueError saying why it cannot run). The kernel treats the projection as a
  constant (no gradient for it).
  """
  if kernel_chosen("kernel", implementation, lambda: kernel_unsupported(q, k)):
    return favor_attention_cpu(q, k, v, key_mask.astype(bool), projection.astype(jnp.float32),
                               FEATURE_EPS).astype(v.dtype)
  return favor_attention_xla(q, k, v, key_mask, projection)


def favor_attention_xla(q, k, v, key_mask, projection):
  """favor_attention in jnp, any backend and dtype.

  The features' eps is added through the products' linearity, not to the [.., features]
  arrays: phi_k^T [v, 1] = E_k^T [v, 1] + eps * sum over valid keys of [v, 1], and
  phi_q kv = E_q kv + eps * sum over features of kv (E = phi m^1/2 - eps, exp_features)."""
  exp_q = exp_features(heads_major(q), projection)                  # [batch, heads, q_len, m]
  exp_k = exp_features(heads_major(k), projection, key_mask)        # [batch, heads, k_len, m]
  # A column of ones beside v gives the normaliser phi_q . sum_k phi_k from the same matmuls.
  v_ones = with_ones_column(heads_major(v).astype(jnp.float32))     # [batch, heads, k_len, d+1]
  valid_v_sum = jnp.sum(jnp.where(key_mask[:, None, :, None], v_ones, 0.0), axis=2)  # [b, h, d+1]
  kv = (jnp.einsum("bhkm,bhkd->bhmd", exp_k, v_ones)
        + FEATURE_EPS * valid_v_sum[:, :, None, :])                  # [batch, heads, m, d+1]
  out = (jnp.einsum("bhqm,bhmd->bhqd", exp_q, kv)
         + FEATURE_EPS * jnp.sum(kv, axis=2)[:, :, None, :])         # [batch, heads, q_len, d+1]
  # With no valid key both parts are 0 (the output is 0). Dividing by 1 there, not by a tiny
  # floor, also keeps the derivative finite: x / y's is -x / y^2, 0 / 0 at y = 1e-30 in float32.
  normaliser = out[..., -1:]
  out = out[..., :-1] / jnp.where(normaliser > 1e-30, normaliser, 1.0)
  return heads_major(out).astype(v.dtype)


def favor_weights(q, k, key_mask, projection):
  """[batch, heads, q_len, k_len]: the weights FAVOR+ gives each value (rows sum to 1), dense,
  O(n^2): for the analyses (favor_attention never forms them)."""
  phi_q = positive_features(heads_major(q), projection)
  phi_k = positive_features(heads_major(k), projection, key_mask)
  scores = jnp.einsum("bhqm,bhkm->bhqk", phi_q, phi_k)
  return scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), 1e-30)


def thesis_feature_count(head_dim: int) -> int:
  """performer-pytorch's default feature count: int(hd ln hd) (266 for hd 64)."""
  return int(head_dim * math.log(head_dim))


class KernelAttention(nn.Module):
  features: int = 256     # 0 with `thesis`: thesis_feature_count
  redraw: str = "fixed"   # one of REDRAW_POLICIES
  seed: int = 0
  implementation: str = "auto"   # one of cpu_kernels.IMPLEMENTATIONS
  thesis: bool = False    # performer-pytorch's FastAttention, as the thesis's code used it
  head_dim: int = 0       # with `thesis`: the projection weight's width

  def setup(self):
    if self.thesis:
      features = self.features or thesis_feature_count(self.head_dim)
      self.projection_weight = self.param(
          "projection", lambda key, shape: orthogonal_gaussian_features(key, *shape),
          (features, self.head_dim))                         # [features, head_dim]

  def projection(self, head_dim: int, deterministic: bool):
    if self.thesis:
      return jax.lax.stop_gradient(self.projection_weight)
    if self.redraw not in REDRAW_POLICIES:
      raise InvalidValue(f"kernel redraw policy {self.redraw!r}; valid: {REDRAW_POLICIES}")
    if self.redraw == "step" and not deterministic:
      return orthogonal_gaussian_features(self.make_rng("dropout"), self.features, head_dim)
    # A constant of the compiled program, not drawn at every step.
    return fixed_features(self.seed, self.features, head_dim)

  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    if self.thesis:              # every position a key, padded ones included
      key_mask = jnp.ones_like(key_mask)
    return favor_attention(q, k, v, key_mask, self.projection(q.shape[-1], deterministic),
                           self.implementation)

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, k_len] with the evaluation-time (fixed) features."""
    if self.thesis:
      key_mask = jnp.ones_like(key_mask)
    return favor_weights(q, k, key_mask, self.projection(q.shape[-1], True))
