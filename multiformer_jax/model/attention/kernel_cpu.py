"""`kernel(m)` heads on the CPU through a C++ kernel (cpu/favor.cc) that XLA calls by FFI.

It computes what kernel.py's favor_attention computes (FAVOR+ with the same features,
stabilisers, eps and masking), forward and backward, with the exponentials, maxima and sums
done on tiles of positions between the products while they are in cache: XLA:CPU runs them as
separate passes over [batch, heads, time, m] arrays. Other backends, dtypes other than float32
and head sizes other than cpu_kernels.HEAD_DIMS take the XLA path.

The random features are constants here: the backward returns no gradient for them (neither
redraw policy trains them; `implementation="xla"` differentiates them too). The kernel is built
and loaded by cpu_kernels.py; where it cannot be, kernel heads take the XLA path.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax.model.attention import cpu_kernels

FEATURE_MULTIPLE = 16     # favor.cc: kLanes; other feature counts are padded with zero rows
ROWS = 64                 # favor.cc: kRows, positions per tile
FORWARD, BACKWARD = "multiformer_favor_forward", "multiformer_favor_backward"


def kernel_unsupported(q, k) -> str | None:
  """Why the kernel cannot compute these heads; None where it can (building it if needed)."""
  if reason := cpu_kernels.inputs_unsupported(q):
    return reason
  if q.shape != k.shape:
    return f"queries {q.shape} and keys {k.shape} differ in shape (the kernel is self-attention)"
  return cpu_kernels.unavailable()


def scratch_bytes(length: int, head_dim: int, features: int, threads: int | None = None,
                  inference: bool = False) -> int:
  """The kernel's own memory, outside XLA's buffers: per thread, the larger of the forward's
  (without a backward, the keys' features too) and the backward's (favor.cc's Scratch)."""
  threads = threads or os.cpu_count() or 1
  features = -(-features // FEATURE_MULTIPLE) * FEATURE_MULTIPLE
  forward = length + ROWS * head_dim + (length * features + ROWS * features if inference else 0)
  backward = 3 * features * head_dim + features + ROWS * features + 2 * ROWS * head_dim
  return threads * 4 * max(forward, backward)


def _result_specs(q, features: int, for_backward: bool):
  """The forward's results; E_q and E_k are empty where no backward will read them."""
  batch, length, heads, dim = q.shape
  f32 = jnp.float32
  spec = jax.ShapeDtypeStruct
  kept = length if for_backward else 0
  return (spec(q.shape, f32),                                 # out
          spec((batch, heads, length), f32),                  # normaliser O1[:, d]
          spec((batch, heads, length), jnp.int32),            # first argmax of each query's u
          spec((batch, heads, kept, features), f32),          # E_q
          spec((batch, heads, kept, features), f32),          # E_k
          spec((batch, heads, features, dim), f32),           # KV1[:, :d]
          spec((batch, heads, features), f32))                # KV1[:, d]


def padded_projection(projection):
  """[m, d] -> [m rounded up to FEATURE_MULTIPLE, d]: zero rows, which favor.cc leaves out."""
  padding = -projection.shape[0] % FEATURE_MULTIPLE
  return jnp.pad(projection, ((0, padding), (0, 0)))


def favor_attention_cpu(q, k, v, key_mask, projection, eps: float):
  """q, k, v: [batch, time, heads, head_dim] float32; key_mask: [batch, time] bool;
  projection: [m, head_dim]; eps: the features' additive stabiliser. Returns
  [batch, time, heads, head_dim], favor_attention's output."""
  return _favor(q, k, v, key_mask, padded_projection(projection), eps, projection.shape[0])


def _call_forward(q, k, v, key_mask, padded, eps, features, for_backward: bool):
  return jax.ffi.ffi_call(FORWARD, _result_specs(q, padded.shape[0], for_backward),
                          vmap_method="sequential")(
      q, k, v, key_mask, padded, eps=np.float32(eps), features=np.int64(features))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _favor(q, k, v, key_mask, padded, eps: float, features: int):
  """favor_attention_cpu with the projection padded; `features` of its rows are real."""
  return _call_forward(q, k, v, key_mask, padded, eps, features, for_backward=False)[0]


def _forward(q, k, v, key_mask, padded, eps, features):
  results = _call_forward(q, k, v, key_mask, padded, eps, features, for_backward=True)
  return results[0], (q, k, v, key_mask, padded, *results)


def _backward(eps, features, residuals, d_out):
  spec = jax.ShapeDtypeStruct(residuals[0].shape, jnp.float32)
  d_q, d_k, d_v = jax.ffi.ffi_call(BACKWARD, (spec, spec, spec), vmap_method="sequential")(
      *residuals, d_out.astype(jnp.float32), eps=np.float32(eps), features=np.int64(features))
  return d_q, d_k, d_v, None, None


_favor.defvjp(_forward, _backward)
