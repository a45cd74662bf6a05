"""`local(w)` heads on the CPU through a C++ kernel (cpu/local_band.cc) that XLA calls by FFI.

The kernel computes exactly what the XLA band in local.py computes (query i attends to the
valid keys j with |i - j| <= w//2), forward and backward, but only the band: tiles of 4
queries against the keys their band spans, so at radius 64 it multiplies ~1.1x the band's
entries where the XLA band's blocks of 64 multiply 1.5x, and it forms no key windows. It has
no attention dropout: calls with dropout active take the XLA band (which applies it), as do
other backends, dtypes other than float32 and head sizes other than cpu_kernels.HEAD_DIMS.

The kernel is built and loaded by cpu_kernels.py; where it cannot be, local heads take the XLA
band.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax.model.attention import cpu_kernels

MAX_RADIUS = 480          # local_band.cc: kMaxVectors key vectors per tile of queries
TILE, LANES = 4, 16       # local_band.cc: kTile, kLanes
FORWARD, BACKWARD = "multiformer_local_band_forward", "multiformer_local_band_backward"


def kernel_unsupported(q, radius: int, dropout_rate: float) -> str | None:
  """Why the kernel cannot compute these heads; None where it can (building it if needed)."""
  if reason := cpu_kernels.inputs_unsupported(q):
    return reason
  if dropout_rate > 0.0:
    return "attention dropout is active (the kernel has none; the XLA band applies it)"
  if radius > MAX_RADIUS:
    return f"window radius {radius} > {MAX_RADIUS}"
  return cpu_kernels.unavailable()


def scratch_bytes(length: int, head_dim: int, threads: int | None = None) -> int:
  """The kernel's own memory, outside XLA's buffers: per thread, keys and values transposed
  to [head_dim, time] plus two tiles of weights (local_band.cc's backward_task)."""
  threads = threads or os.cpu_count() or 1
  padded = -(-length // LANES) * LANES + LANES
  tile_weights = TILE * ((TILE + 2 * MAX_RADIUS) // LANES + 2) * LANES
  return threads * 4 * (2 * head_dim * padded + 2 * tile_weights)


def _specs(q):
  batch, length, heads, _ = q.shape
  return (jax.ShapeDtypeStruct(q.shape, jnp.float32),
          jax.ShapeDtypeStruct((batch, heads, length), jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def band_attention(q, k, v, key_mask, radius: int):
  """q, k, v: [batch, time, heads, head_dim] float32 (q unscaled); key_mask: [batch, time] bool.
  Returns [batch, time, heads, head_dim]: softmax over the valid keys within `radius`."""
  return _forward(q, k, v, key_mask, radius)[0]


def _forward(q, k, v, key_mask, radius):
  out, log_sum_exp = jax.ffi.ffi_call(FORWARD, _specs(q), vmap_method="sequential")(
      q, k, v, key_mask, radius=np.int64(radius))
  return out, (q, k, v, key_mask, out, log_sum_exp)


def _backward(radius, residuals, d_out):
  q, k, v, key_mask, out, log_sum_exp = residuals
  spec = _specs(q)[0]
  d_q, d_k, d_v = jax.ffi.ffi_call(BACKWARD, (spec, spec, spec), vmap_method="sequential")(
      q, k, v, key_mask, out, log_sum_exp, d_out.astype(jnp.float32), radius=np.int64(radius))
  return d_q, d_k, d_v, None


band_attention.defvjp(_forward, _backward)
