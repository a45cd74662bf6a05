"""`local(w)` heads on the CPU through a C++ kernel (cpu/local_band.cc) that XLA calls by FFI.

The kernel computes exactly what the XLA band in local.py computes (query i attends to the
valid keys j with |i - j| <= w//2), forward and backward, but only the band: tiles of 4
queries against the keys their band spans, so at radius 64 it multiplies ~1.1x the band's
entries where the XLA band's blocks of 64 multiply 1.5x, and it forms no key windows. Its
attention dropout draws the XLA band's very masks (dropout.py's hash of the same indices under
the same keys), so the two compute one function in training too. Other backends, dtypes other
than float32 and head sizes other than cpu_kernels.HEAD_DIMS take the XLA band.

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
from multiformer_jax.model.dropout import threefry_key_words

MAX_RADIUS = 480          # local_band.cc: kMaxVectors key vectors per tile of queries
TILE, LANES = 4, 16       # local_band.cc: kTile, kLanes
FORWARD, BACKWARD = "multiformer_local_band_forward", "multiformer_local_band_backward"


def kernel_unsupported(q, radius: int, dropout_rate: float, dropout_rng=None,
                       mask_elements: int = 0) -> str | None:
  """Why the kernel cannot compute these heads; None where it can (building it if needed).
  With dropout: mask_elements is the size of one chunk's mask in the XLA band, whose masks the
  kernel draws (dropout.py hashes indices below 2**32 under threefry key words)."""
  if reason := cpu_kernels.inputs_unsupported(q):
    return reason
  if radius > MAX_RADIUS:
    return f"window radius {radius} > {MAX_RADIUS}"
  if dropout_rate > 0.0:
    if dropout_rng is None or threefry_key_words(dropout_rng) is None:
      return ("attention dropout with a key that is not a threefry key (the kernel draws "
              "dropout.py's masks, which hash under threefry key words)")
    if mask_elements >= 2 ** 32:
      return (f"attention dropout over {mask_elements} mask elements per chunk (dropout.py "
              f"hashes indices below 2**32)")
  return cpu_kernels.unavailable()


def scratch_bytes(length: int, head_dim: int, threads: int | None = None) -> int:
  """The kernel's own memory, outside XLA's buffers: per thread, keys and values transposed
  to [head_dim, time] plus three tiles of weights (local_band.cc's backward_task: the
  probabilities, their gradient, the kept ones under dropout)."""
  threads = threads or os.cpu_count() or 1
  padded = -(-length // LANES) * LANES + LANES
  tile_weights = TILE * ((TILE + 2 * MAX_RADIUS) // LANES + 2) * LANES
  return threads * 4 * (2 * head_dim * padded + 3 * tile_weights)


def _specs(q):
  batch, length, heads, _ = q.shape
  return (jax.ShapeDtypeStruct(q.shape, jnp.float32),
          jax.ShapeDtypeStruct((batch, heads, length), jnp.float32))


def band_attention(q, k, v, key_mask, radius: int, dropout_rate: float = 0.0, dropout_rng=None,
                   block: int = 1, chunk_blocks: int = 1, num_chunks: int = 0):
  """q, k, v: [batch, time, heads, head_dim] float32 (q unscaled); key_mask: [batch, time] bool.
  Returns [batch, time, heads, head_dim]: softmax over the valid keys within `radius`, with
  attention dropout at `dropout_rate` drawing the XLA band's masks (local.py: its geometry of
  `num_chunks` chunks of `chunk_blocks` query blocks of `block` queries)."""
  if dropout_rate > 0.0:
    keys = chunk_key_words(dropout_rng, num_chunks)
    keep_below = np.float32(1.0 - dropout_rate)
    scale = np.float32(1.0) / keep_below
  else:
    keys, keep_below, scale = jnp.zeros((0, 2), jnp.uint32), np.float32(1.0), np.float32(1.0)
  return _band(q, k, v, key_mask, keys, radius, keep_below, scale, block, chunk_blocks)


def chunk_key_words(rng, num_chunks: int):
  """[num_chunks, 2] uint32: the threefry words of fold_in(rng, c), the key the XLA band's
  chunk c draws its dropout mask from (blockwise.dropout_keep_mask)."""
  return jax.vmap(lambda c: jnp.stack(threefry_key_words(jax.random.fold_in(rng, c))))(
      jnp.arange(num_chunks))


def _attributes(radius, keep_below, scale, block, chunk_blocks):
  return dict(radius=np.int64(radius), keep_below=np.float32(keep_below),
              scale=np.float32(scale), block=np.int64(block), chunk_blocks=np.int64(chunk_blocks))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _band(q, k, v, key_mask, keys, radius, keep_below, scale, block, chunk_blocks):
  return _forward(q, k, v, key_mask, keys, radius, keep_below, scale, block, chunk_blocks)[0]


def _forward(q, k, v, key_mask, keys, *static):
  out, log_sum_exp = jax.ffi.ffi_call(FORWARD, _specs(q), vmap_method="sequential")(
      q, k, v, key_mask, keys, **_attributes(*static))
  return out, (q, k, v, key_mask, keys, out, log_sum_exp)


def _backward(radius, keep_below, scale, block, chunk_blocks, residuals, d_out):
  q, k, v, key_mask, keys, out, log_sum_exp = residuals
  spec = _specs(q)[0]
  d_q, d_k, d_v = jax.ffi.ffi_call(BACKWARD, (spec, spec, spec), vmap_method="sequential")(
      q, k, v, key_mask, keys, out, log_sum_exp, d_out.astype(jnp.float32),
      **_attributes(radius, keep_below, scale, block, chunk_blocks))
  return d_q, d_k, d_v, None, None


_band.defvjp(_forward, _backward)
