"""Shared by the benchmark scripts: timing, XLA's compiled cost and memory, the machine's
measured matmul peak, and result files (JSON lines + a description of the machine)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax.model.attention import local as local_lib


def machine() -> dict:
  device = jax.devices()[0]
  info = {"date": datetime.date.today().isoformat(), "platform": device.platform,
          "device": getattr(device, "device_kind", str(device)),
          "devices": jax.device_count(), "cpu_count": os.cpu_count(),
          "python": platform.python_version(), "jax": jax.__version__,
          "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
          "ld_preload": os.environ.get("LD_PRELOAD", ""),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    info["cpu"] = names[0] if names else platform.processor()
  except OSError:
    info["cpu"] = platform.processor()
  return info


def _flops(cost) -> float:
  if isinstance(cost, list):
    cost = cost[0] if cost else {}
  return float((cost or {}).get("flops", 0.0))


def lowered_flops(lowered) -> float:
  """XLA's FLOPs of a lowered, not yet optimised program (`jax.jit(f).lower(...)`).

  The figure the train step's utilisation divides by. On CPU it is within 1% of the compiled
  program's count (s2t_transformer_s update, batch 40: 1341.7 vs 1342.5 GFLOP; batch 8:
  s2t_v2 259.2 vs 261.5, h_lc_nodown 999.5 vs 1005.3, multiformer_s_nodown 1045.6 vs 1054.0).
  On a GPU the compiled count leaves out the matmuls XLA has rewritten into library calls
  (0.37 of 1.34 TFLOP for that update on an H100; jax-ml/jax#22249), which made the GPU MFU
  figures of 2026-11-22/23 several times too low. Like the compiled count, it counts a loop
  body once.

  It is not the compiled count everywhere: for single attention kinds at n = 512 (CPU) the
  lowered count of local bands is 16-17% higher and of conv-compressed heads 17-25% lower
  (XLA rewrites those before counting), so benchmarks/attention.py keeps the compiled count,
  measured on CPU."""
  return _flops(lowered.cost_analysis())


def executable_stats(exe) -> dict:
  """XLA's compiled memory (bytes) and FLOPs of a compiled executable (FLOPs: on a GPU they
  leave out library matmuls, see lowered_flops)."""
  memory = exe.memory_analysis()
  size = lambda name: int(getattr(memory, name, 0) or 0)
  return {"temp_bytes": size("temp_size_in_bytes"),
          "argument_bytes": size("argument_size_in_bytes"),
          "output_bytes": size("output_size_in_bytes"),
          "alias_bytes": size("alias_size_in_bytes"),
          "flops": _flops(exe.cost_analysis())}


@contextlib.contextmanager
def local_heads_in_one_chunk():
  """Local heads trace as a single scan step while this is active. XLA's cost analysis counts
  a loop body once, so FLOPs of local heads are read off a program compiled in here (its
  backward still recomputes the band's logits: one extra q k^T product, counted)."""
  saved = local_lib.QUERY_CHUNK
  local_lib.QUERY_CHUNK = 1 << 40
  try:
    yield
  finally:
    local_lib.QUERY_CHUNK = saved


def compiled(fn, *args):
  """jit(fn) compiled for args -> (compiled, executable_stats)."""
  exe = jax.jit(fn).lower(*args).compile()
  return exe, executable_stats(exe)


def time_call(fn, *args, repeats: int = 3, warmup: int = 1, max_seconds: float = 60.0):
  """Median wall time of fn(*args) (blocking on the result), after warm-up calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times, start = [], time.perf_counter()
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
    if time.perf_counter() - start > max_seconds:
      break
  return statistics.median(times)


def matmul_peak(size: int = 2048, dtype=jnp.float32, repeats: int = 5,
                warmup_seconds: float = 0.0) -> float:
  """Measured FLOP/s of a large square matmul: the denominator of the utilisation figures.

  `warmup_seconds` keeps the device multiplying that long before the timing: a GPU raises its
  clock under load over about a second, and five products after one warm-up call read
  between 252 and 675 TFLOP/s on the same H100 (bf16, 8192)."""
  a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), dtype)
  fn = jax.jit(lambda x, y: x @ y)
  start = time.perf_counter()
  while time.perf_counter() - start < warmup_seconds:
    jax.block_until_ready(fn(a, a))
  seconds = time_call(fn, a, a, repeats=repeats)
  return 2 * size ** 3 / seconds


class Results:
  """Appends one JSON object per measurement to `path` (and prints it)."""

  def __init__(self, path: str, meta: dict):
    self.path = path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(json.dumps({"meta": meta}) + "\n")

  def add(self, **row):
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def read_results(path: str) -> tuple[dict, list[dict]]:
  """(meta, rows) of a JSON-lines results file: meta is the first line's "meta" as `Results`
  writes it, or {} for files without one (fairseq_train_step.py's, written in its own
  environment)."""
  with open(path, encoding="utf-8") as f:
    lines = [json.loads(l) for l in f if l.strip()]
  if lines and "meta" in lines[0]:
    return lines[0]["meta"], lines[1:]
  return {}, lines
