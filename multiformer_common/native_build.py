"""C++ sources of the package compiled on first use into a shared library, once per machine.

The library is built with the system's C++ compiler ($CXX, default g++; with -march=native, so
it is built per machine) into $MULTIFORMER_KERNEL_CACHE (default
~/.cache/multiformer_jax/kernels), keyed by the sources, the flags, the compiler, anything
else the caller names and the CPU. Built under a temporary name and renamed: concurrent
processes never load a partial file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path


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


def library_path(name: str, sources, headers, flags, compiler: str, key_parts=()) -> Path:
  texts = [Path(path).read_text() for path in (*sources, *headers)]
  key = hashlib.sha256("\n".join([*texts, compiler, " ".join(flags), *key_parts,
                                  platform.machine(), _cpu_model()]).encode()).hexdigest()[:16]
  return cache_dir() / f"{name}_{key}.so"


def build(name: str, sources, headers=(), flags=(), compiler: str | None = None,
          include_dirs=(), key_parts=()) -> Path:
  """Compiles `sources` into the library `name` (unless the cache has it); returns its path.
  Raises RuntimeError naming the compiler and its output where it fails."""
  compiler = compiler or os.environ.get("CXX", "g++")
  path = library_path(name, sources, headers, flags, compiler, key_parts)
  if path.exists():
    return path
  if shutil.which(compiler) is None:
    raise RuntimeError(f"no C++ compiler {compiler!r} on PATH (set $CXX to one)")
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as partial:
    partial_path = Path(partial.name)
  command = [compiler, *flags, *(arg for d in include_dirs for arg in ("-isystem", str(d))),
             *(str(source) for source in sources), "-o", str(partial_path)]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    partial_path.unlink(missing_ok=True)
    raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): "
                       f"{result.stderr.strip()[-2000:]}")
  os.replace(partial_path, path)
  return path
