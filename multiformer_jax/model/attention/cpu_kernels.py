"""The C++ attention kernels for the CPU backend (cpu/*.cc), built into one library that XLA
calls by FFI: local heads' band (local_cpu.py) and kernel heads' FAVOR+ (kernel_cpu.py).

The library is compiled on first use with the system's C++ compiler ($CXX, default g++; with
-march=native, so it is built per machine) into $MULTIFORMER_KERNEL_CACHE (default
~/.cache/multiformer_jax/kernels), keyed by the sources, the flags, jaxlib's version and the
CPU. Where it cannot be built, the heads take their XLA paths and the reason is logged once.
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
  texts = [(SOURCE_DIR / name).read_text() for name in SOURCES + HEADERS]
  key = hashlib.sha256("\n".join([*texts, compiler, " ".join(FLAGS), jaxlib.__version__,
                                  platform.machine(), _cpu_model()]).encode()).hexdigest()[:16]
  return cache_dir() / f"attention_kernels_{key}.so"


def build(compiler: str | None = None) -> Path:
  """Compiles the library (unless the cache has it); returns its path. Raises RuntimeError
  naming the compiler and its output where it fails."""
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
  command = [compiler, *FLAGS, "-isystem", jax.ffi.include_dir(),
             *(str(SOURCE_DIR / name) for name in SOURCES), "-o", str(partial_path)]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    partial_path.unlink(missing_ok=True)
    raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): "
                       f"{result.stderr.strip()[-2000:]}")
  os.replace(partial_path, path)
  return path


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
    raise ValueError(f"{kind} attention implementation {implementation!r}; valid: "
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
    raise ValueError(f"{kind} attention implementation 'cpu' cannot run here: {reason}")
  return reason is None
