"""The C++ attention kernels for the CPU backend (cpu/*.cc), built into one library that XLA
calls by FFI: local heads' band (local_cpu.py) and kernel heads' FAVOR+ (kernel_cpu.py).

The library is compiled on first use (multiformer_common.native_build: the system's C++
compiler, cached per machine, keyed by the sources, the flags, jaxlib's version and the CPU).
Where it cannot be built, the heads take their XLA paths and the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

from multiformer_common.errors import InvalidValue
from multiformer_common import native_build as native

SOURCE_DIR = Path(__file__).with_name("cpu")
SOURCES = ("local_band.cc", "favor.cc")
HEADERS = ("simd.h",)
HEAD_DIMS = (32, 64, 128)     # the head sizes both kernels are instantiated for
IMPLEMENTATIONS = ("auto", "xla", "cpu")   # a head kind's choice between kernel and XLA path
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
# FFI target name -> the handler symbol the library exports.
TARGETS = {
    "multiformer_local_band_forward": "LocalBandForward",
    "multiformer_local_band_backward": "LocalBandBackward",
    "multiformer_favor_forward": "FavorForward",
    "multiformer_favor_backward": "FavorBackward",
}

_log = logging.getLogger(__name__)
_lock = threading.Lock()


def build(compiler: str | None = None) -> Path:
  """Compiles the library (unless the cache has it); returns its path. Raises RuntimeError
  naming the compiler and its output where it fails."""
  return native.build("attention_kernels", [SOURCE_DIR / name for name in SOURCES],
                      [SOURCE_DIR / name for name in HEADERS], FLAGS, compiler,
                      include_dirs=[jax.ffi.include_dir()], key_parts=[jaxlib.__version__])


@functools.cache
def unavailable() -> str | None:
  """Builds, loads and registers the kernels once per process; None, or why they cannot run."""
  with _lock:
    try:
      library = ctypes.cdll.LoadLibrary(str(build()))
    except (RuntimeError, OSError) as error:
      _log.warning("local and kernel heads take their XLA paths: the CPU kernels are "
                   "unavailable: %s", error)
      return f"the CPU kernels are unavailable: {error}"
    for target, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                  platform="cpu")
    return None


def inputs_unsupported(q) -> str | None:
  """Why no CPU kernel can take these queries (backend, dtype, head size); None where one can."""
  if jax.default_backend() != "cpu":
    return f"the default backend is {jax.default_backend()!r}, not 'cpu'"
  if q.dtype != jnp.float32:
    return f"dtype {q.dtype} (the kernel is float32)"
  if q.shape[-1] not in HEAD_DIMS:
    return f"head_dim {q.shape[-1]} (the kernel has {HEAD_DIMS})"
  return None


def check_implementation(kind: str, implementation: str) -> None:
  """Raises a ValueError naming `kind`'s heads where `implementation` is none of
  IMPLEMENTATIONS."""
  if implementation not in IMPLEMENTATIONS:
    raise InvalidValue(f"{kind} attention implementation {implementation!r}; valid: "
                     f"{IMPLEMENTATIONS}")


def kernel_chosen(kind: str, implementation: str, unsupported) -> bool:
  """Whether `kind`'s heads take their CPU kernel: never under "xla"; under "auto" where
  `unsupported()` (why the kernel cannot run, or None) gives no reason; under "cpu" always,
  or a ValueError with that reason."""
  check_implementation(kind, implementation)
  if implementation == "xla":
    return False
  reason = unsupported()
  if reason is not None and implementation == "cpu":
    raise InvalidValue(f"{kind} attention implementation 'cpu' cannot run here: {reason}")
  return reason is None
