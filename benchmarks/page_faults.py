"""Page faults and time of XLA:CPU steps with glibc's default malloc and with huge pages.

    python -m benchmarks.page_faults --out docs/benchmarks/page_faults.jsonl [--mib 128]

Runs the same child twice, with MULTIFORMER_HUGE_PAGES=0 (glibc's defaults) and with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (what the entry points set up,
multiformer_jax/runtime/host_memory.py).
The child times jit(-x) and jit(exp(x)) on a `--mib` MiB float32 array, and a numpy multiply of
the same array into a preallocated output for the memory bandwidth, reporting the median
milliseconds of `--repeats` calls and the minor page faults per call (getrusage).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.report_format import command_line, load, markdown_table
from benchmarks.common import Results, machine

CHILD = r"""
import json, resource, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
size, repeats = int(sys.argv[1]), int(sys.argv[2])
x = jnp.ones((size // 4,), jnp.float32)
rows = {}
def measure(name, call):
  call()
  times, faults = [], []
  for _ in range(repeats):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  rows[name] = {"ms": round(1e3 * statistics.median(times), 2),
                "faults_per_call": statistics.median(faults)}
negate, exp = jax.jit(lambda a: -a), jax.jit(jnp.exp)
measure("jit(-x)", lambda: negate(x).block_until_ready())
measure("jit(exp(x))", lambda: exp(x).block_until_ready())
a = np.ones(size // 4, np.float32)
out = np.empty_like(a)
measure("numpy multiply into a preallocated output", lambda: np.multiply(a, 2.0, out=out))
print(json.dumps(rows))
"""



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  meta, rows = load(directory, "page_faults.jsonl")
  if not rows:
    return "", []
  table = markdown_table(["malloc", "operation", "ms per call", "page faults per call"],
                 [[r["setting"], r["op"], r["ms"], r["faults_per_call"]] for r in rows])
  text = f"""## Huge pages: page faults of XLA:CPU buffers

Command: `{command_line(meta['command'])}` ({meta['cpu_count']} cores). One call on a
{meta['mib']} MiB float32 array, median of {meta['repeats']}; "glibc defaults" is a process
with MULTIFORMER_HUGE_PAGES=0, the other what the entry points set up
(`multiformer_jax/runtime/host_memory.py`).

{table}
"""
  return text, []


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/page_faults.jsonl")
  parser.add_argument("--mib", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args(argv)
  base = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  settings = {"glibc defaults": {**base, "MULTIFORMER_HUGE_PAGES": "0"},
              "glibc.malloc.hugetlb=1": {**base, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}
  results = Results(args.out, {**machine(), "command": " ".join(sys.argv), "mib": args.mib,
                               "repeats": args.repeats})
  for setting, environ in settings.items():
    result = subprocess.run([sys.executable, "-c", CHILD, str(args.mib * 2 ** 20),
                             str(args.repeats)], env=environ, capture_output=True, text=True,
                            check=True)
    for name, row in json.loads(result.stdout.strip().splitlines()[-1]).items():
      results.add(setting=setting, op=name, **row)


if __name__ == "__main__":
  main()
