"""XLA flags the toolkit sets by default, each unless XLA_FLAGS already names it.

XLA reads XLA_FLAGS once, when JAX first creates a backend, so each command calls
`add_default_xla_flags()` at its start, before any computation. GPU flags are added only where
JAX's CUDA plugin is installed: XLA aborts on a flag its build does not know, and a CPU-only
install has no use for them.

  --xla_gpu_enable_cudnn_layer_norm=true
      XLA:GPU rewrites layer norms, forward and backward, into cuDNN's norm kernels (Ampere and
      later; elsewhere the rewrite does not apply). It makes the s2t_transformer_s update in
      bf16 on an H200 1.17x faster (docs/benchmarks.md, "GPU"). To turn it off:
      XLA_FLAGS=--xla_gpu_enable_cudnn_layer_norm=false.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import MutableMapping

DEFAULT_GPU_XLA_FLAGS = ("--xla_gpu_enable_cudnn_layer_norm=true",)


def cuda_plugin_installed() -> bool:
  """Whether JAX's CUDA PJRT plugin (jax[cuda12] and later: jax_plugins.xla_cuda*) is here."""
  try:
    plugins = importlib.import_module("jax_plugins")
  except ImportError:
    return False
  return any(m.name.startswith("xla_cuda") for m in pkgutil.iter_modules(plugins.__path__))


def flag_name(flag: str) -> str:
  """'--name=value' -> 'name'."""
  return flag.lstrip("-").split("=", 1)[0]


def add_default_xla_flags(environ: MutableMapping[str, str] = os.environ,
                          gpu: bool | None = None) -> str:
  """Appends to environ['XLA_FLAGS'] each default flag it does not name; returns the result.
  gpu: whether to add the GPU flags (None: where the CUDA plugin is installed)."""
  if gpu is None:
    gpu = cuda_plugin_installed()
  current = environ.get("XLA_FLAGS", "").split()
  named = {flag_name(flag) for flag in current}
  defaults = DEFAULT_GPU_XLA_FLAGS if gpu else ()
  added = [flag for flag in defaults if flag_name(flag) not in named]
  if added:
    environ["XLA_FLAGS"] = " ".join(current + added)
  return environ.get("XLA_FLAGS", "")
