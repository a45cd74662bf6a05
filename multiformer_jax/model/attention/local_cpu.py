"""`local(w)` heads on the CPU through a C++ kernel (cpu/local_band.cc) that XLA calls by FFI.

The kernel computes exactly what the XLA band in local.py computes (query i attends to the
valid keys j with |i - j| <= w//2), forward and backward, but only the band: tiles of 4
queries against the keys their band spans, so at radius 64 it multiplies ~1.1x the band's
entries where the XLA band's blocks of 64 multiply 1.5x, and it forms no key windows. It has
no attention dropout: calls with dropout active take the XLA band (which applies it), as do
other backends, dtypes other than float32 and head sizes other than HEAD_DIMS.

The library is compiled on first use with the system's C++ compiler ($CXX, default g++; with
-march=native, so it is built per machine) into $MULTIFORMER_KERNEL_CACHE (default
~/.cache/multiformer_jax/kernels), keyed by the source, the flags, jaxlib's version and the
CPU. Where it cannot be built, local heads take the XLA band and the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

SOURCE = Path(__file__).with_name("cpu") / "local_band.cc"
HEAD_DIMS = (32, 64, 128)
MAX_RADIUS = 480          # local_band.cc: kMaxVectors key vectors per tile of queries
TILE, LANES = 4, 16       # local_band.cc: kTile, kLanes
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
FORWARD, BACKWARD = "multiformer_local_band_forward", "multiformer_local_band_backward"

_log = logging.getLogger(__name__)
_lock = threading.Lock()


def cache_dir() -> Path:
  default = Path.home() / ".cache" / "multiformer_jax" / "kernels"
  return Path(os.environ.get("MULTIFORMER_KERNEL_CACHE", default))


def _cpu_model() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith(("model name", "flags")):
        return line
  except OSError:
    pass
  return platform.processor()


def library_path(compiler: str) -> Path:
  key = hashlib.sha256("\n".join([SOURCE.read_text(), compiler, " ".join(FLAGS),
                                  jaxlib.__version__, platform.machine(), _cpu_model()])
                       .encode()).hexdigest()[:16]
  return cache_dir() / f"local_band_{key}.so"


def build(compiler: str | None = None) -> Path:
  """Compiles the kernel (unless the cache has it); returns the library's path. Raises
  RuntimeError naming the compiler and its output where it fails."""
  compiler = compiler or os.environ.get("CXX", "g++")
  path = library_path(compiler)
  if path.exists():
    return path
  if shutil.which(compiler) is None:
    raise RuntimeError(f"no C++ compiler {compiler!r} on PATH (set $CXX to one)")
  path.parent.mkdir(parents=True, exist_ok=True)
  # Built under a temporary name and renamed: concurrent processes never load a partial file.
  with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as partial:
    partial_path = Path(partial.name)
  command = [compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o",
             str(partial_path)]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    partial_path.unlink(missing_ok=True)
    raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): "
                       f"{result.stderr.strip()[-2000:]}")
  os.replace(partial_path, path)
  return path


@functools.cache
def _registered() -> str | None:
  """Builds, loads and registers the kernel once per process; None, or why it cannot run."""
  with _lock:
    try:
      library = ctypes.cdll.LoadLibrary(str(build()))
    except (RuntimeError, OSError) as error:
      _log.warning("local heads take the XLA band: the CPU kernel is unavailable: %s", error)
      return f"the CPU kernel is unavailable: {error}"
    jax.ffi.register_ffi_target(FORWARD, jax.ffi.pycapsule(library.LocalBandForward),
                                platform="cpu")
    jax.ffi.register_ffi_target(BACKWARD, jax.ffi.pycapsule(library.LocalBandBackward),
                                platform="cpu")
    return None


def kernel_unsupported(q, radius: int, dropout_rate: float) -> str | None:
  """Why the kernel cannot compute these heads; None where it can (building it if needed)."""
  if jax.default_backend() != "cpu":
    return f"the default backend is {jax.default_backend()!r}, not 'cpu'"
  if q.dtype != jnp.float32:
    return f"dtype {q.dtype} (the kernel is float32)"
  if q.shape[-1] not in HEAD_DIMS:
    return f"head_dim {q.shape[-1]} (the kernel has {HEAD_DIMS})"
  if dropout_rate > 0.0:
    return "attention dropout is active (the kernel has none; the XLA band applies it)"
  if radius > MAX_RADIUS:
    return f"window radius {radius} > {MAX_RADIUS}"
  return _registered()


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
