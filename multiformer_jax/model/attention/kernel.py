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

Features are either fixed (drawn from `seed`, the same on every call, so a checkpoint plus its
config reproduce them) or redrawn at every training step from the step's dropout key; eval
always uses the fixed draw.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

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


@jax.custom_jvp
def max_over_features(u):
  """max(u, axis=-1, keepdims=True) whose derivative is taken at the first argmax.

  `jnp.max`'s derivative compares u with the broadcast maximum and shares the tangent among
  ties: on the CPU that materialised the [.., features] broadcast and a mask the size of u,
  forward and backward. This one gathers one tangent per row. Both are derivatives of the same
  function; they differ only where two features tie exactly for the maximum."""
  return jnp.max(u, axis=-1, keepdims=True)


@max_over_features.defjvp
def _max_over_features_jvp(primals, tangents):
  (u,), (du,) = primals, tangents
  first_argmax = jnp.argmax(u, axis=-1)[..., None]
  return (jnp.take_along_axis(u, first_argmax, axis=-1),
          jnp.take_along_axis(du, first_argmax, axis=-1))


def positive_features(x, projection, valid=None):
  """x: [batch, heads, time, dim] -> [batch, heads, time, features] (float32), phi(x) m^1/2.

  valid: None for queries (stabiliser per position); a [batch, time] bool key mask for keys
  (stabiliser over valid positions; padded rows set to zero).
  """
  x = x.astype(jnp.float32) * x.shape[-1] ** -0.25
  u = jnp.einsum("bhtd,md->bhtm", x, projection)
  half_sq_norm = 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
  if valid is None:
    stabiliser = max_over_features(u)
  else:
    valid = valid[:, None, :, None]
    stabiliser = jnp.max(jnp.where(valid, u, -jnp.inf), axis=(2, 3), keepdims=True)
    stabiliser = jax.lax.stop_gradient(jnp.where(jnp.isfinite(stabiliser), stabiliser, 0.0))
  features = jnp.exp(u - half_sq_norm - stabiliser) + FEATURE_EPS
  if valid is not None:
    features = jnp.where(valid, features, 0.0)
  return features


def heads_major(x):
  """[batch, time, heads, dim] <-> [batch, heads, time, dim]: batched matmuls over contiguous
  rows (the time-major einsums ran ~2x slower on CPU, mostly in transposes)."""
  return jnp.swapaxes(x, 1, 2)


def with_ones_column(values):
  """[..., dim] -> [..., dim + 1]: a column of ones beside the values, so one product with the
  key features gives both the weighted values and the normaliser."""
  return jnp.concatenate([values, jnp.ones(values.shape[:-1] + (1,), values.dtype)], axis=-1)


def favor_attention(q, k, v, key_mask, projection):
  """Linear-time attention: [batch, time, heads, dim] -> same shape, O(n * m * dim)."""
  phi_q = positive_features(heads_major(q), projection)             # [batch, heads, q_len, m]
  phi_k = positive_features(heads_major(k), projection, key_mask)   # [batch, heads, k_len, m]
  # A column of ones beside v gives the normaliser phi_q . sum_k phi_k from the same matmuls.
  v_ones = with_ones_column(heads_major(v).astype(jnp.float32))
  kv = jnp.einsum("bhkm,bhkd->bhmd", phi_k, v_ones)                 # [batch, heads, m, dim+1]
  out = jnp.einsum("bhqm,bhmd->bhqd", phi_q, kv)                    # [batch, heads, q_len, dim+1]
  out = out[..., :-1] / jnp.maximum(out[..., -1:], 1e-30)
  return heads_major(out).astype(v.dtype)


def favor_weights(q, k, key_mask, projection):
  """[batch, heads, q_len, k_len]: the weights FAVOR+ gives each value (rows sum to 1), dense,
  O(n^2): for the analyses (favor_attention never forms them)."""
  phi_q = positive_features(heads_major(q), projection)
  phi_k = positive_features(heads_major(k), projection, key_mask)
  scores = jnp.einsum("bhqm,bhkm->bhqk", phi_q, phi_k)
  return scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), 1e-30)


class KernelAttention(nn.Module):
  features: int = 256
  redraw: str = "fixed"   # one of REDRAW_POLICIES
  seed: int = 0

  def projection(self, head_dim: int, deterministic: bool):
    if self.redraw not in REDRAW_POLICIES:
      raise ValueError(f"kernel redraw policy {self.redraw!r}; valid: {REDRAW_POLICIES}")
    if self.redraw == "step" and not deterministic:
      return orthogonal_gaussian_features(self.make_rng("dropout"), self.features, head_dim)
    # A constant of the compiled program: drawn once at trace time, not at every step.
    with jax.ensure_compile_time_eval():
      return orthogonal_gaussian_features(jax.random.PRNGKey(self.seed), self.features, head_dim)

  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    return favor_attention(q, k, v, key_mask, self.projection(q.shape[-1], deterministic))

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, k_len] with the evaluation-time (fixed) features."""
    return favor_weights(q, k, key_mask, self.projection(q.shape[-1], True))
