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

from multiformer_jax.attention import local as local_lib


def machine() -> dict:
  device = jax.devices()[0]
  info = {"date": datetime.date.today().isoformat(), "platform": device.platform,
          "device": getattr(device, "device_kind", str(device)),
          "devices": jax.device_count(), "cpu_count": os.cpu_count(),
          "python": platform.python_version(), "jax": jax.__version__,
          "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    info["cpu"] = names[0] if names else platform.processor()
  except OSError:
    info["cpu"] = platform.processor()
  return info


def executable_stats(exe) -> dict:
  """XLA's compiled memory (bytes) and FLOPs of a compiled executable."""
  memory = exe.memory_analysis()
  cost = exe.cost_analysis()
  if isinstance(cost, list):
    cost = cost[0] if cost else {}
  size = lambda name: int(getattr(memory, name, 0) or 0)
  return {"temp_bytes": size("temp_size_in_bytes"),
          "argument_bytes": size("argument_size_in_bytes"),
          "output_bytes": size("output_size_in_bytes"),
          "alias_bytes": size("alias_size_in_bytes"),
          "flops": float((cost or {}).get("flops", 0.0))}


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


def matmul_peak(size: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
  """Measured FLOP/s of a large square matmul: the denominator of the utilisation figures."""
  a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), dtype)
  fn = jax.jit(lambda x, y: x @ y)
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
  with open(path, encoding="utf-8") as f:
    lines = [json.loads(l) for l in f if l.strip()]
  return lines[0]["meta"], lines[1:]
