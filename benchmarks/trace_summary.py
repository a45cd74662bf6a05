"""Where the time of a profiled step went: total duration per event name, per thread or GPU
stream, from the perfetto trace that `train_step.py --trace_dir DIR` writes.

    python -m benchmarks.trace_summary DIR [top]

DIR is searched for perfetto_trace.json.gz (or give the file). For each thread / stream with
more than 1 ms of events: the summed and spanned milliseconds, the event count and the `top`
(default 30) event names by summed duration. For GPU streams also the time per kind of
kernel, from XLA's kernel names (KERNEL_KINDS).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys


def find_trace(path: str) -> str:
  if os.path.isfile(path):
    return path
  found = glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True)
  if not found:
    raise SystemExit(f"no perfetto_trace.json.gz under {path!r}: run train_step.py with "
                     f"--trace_dir {path} first")
  newest = max(found, key=os.path.getmtime)
  if len(found) > 1:
    print(f"{len(found)} traces under {path!r}; summarising the newest: {newest}")
  return newest


# (kind, pattern of the kernel name), first match wins. XLA names a fusion by its emitter:
# loop_* elementwise, input_* reductions (and transposes that read through shared memory),
# gemm_fusion_* its Triton matmuls, fusion_<n> the custom block-level (Triton) fusions of
# normalisations; the matmul and convolution libraries' kernels keep their own names.
KERNEL_KINDS = (
    ("matmul and convolution libraries", r"nvjet|cutlass|xmma|cublas|cudnn|gemm_bf16|sm\d+_"),
    ("XLA Triton matmuls (gemm_fusion)", r"^gemm_fusion"),
    ("block-level Triton fusions (fusion_N)", r"^fusion_\d+"),
    ("transposes and copies", r"transpose|copy|memcpy|Memset"),
    ("reductions (input_*)", r"^input_|reduce"),
    ("elementwise (loop_*)", r"^loop_|^wrapped_"),
)


def kernel_kind(name: str) -> str:
  for kind, pattern in KERNEL_KINDS:
    if re.search(pattern, name):
      return kind
  return "other"


def summarise(events: list[dict], top: int) -> str:
  process, thread = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      process[e["pid"]] = e["args"]["name"]
    elif e.get("ph") == "M" and e.get("name") == "thread_name":
      thread[(e["pid"], e["tid"])] = e["args"]["name"]
  total = collections.defaultdict(collections.Counter)   # track -> name -> microseconds
  count = collections.defaultdict(collections.Counter)
  span = {}
  for e in events:
    if e.get("ph") != "X":
      continue
    track = (process.get(e["pid"], e["pid"]), thread.get((e["pid"], e["tid"]), e["tid"]))
    duration = e.get("dur", 0)
    total[track][e["name"]] += duration
    count[track][e["name"]] += 1
    start, end = span.get(track, (float("inf"), 0.0))
    span[track] = (min(start, e["ts"]), max(end, e["ts"] + duration))
  lines = []
  for track, names in sorted(total.items(), key=lambda kv: -sum(kv[1].values())):
    summed = sum(names.values())
    if summed < 1000:
      continue
    lines.append(f"== {track}: {summed / 1e3:.1f} ms summed, span "
                 f"{(span[track][1] - span[track][0]) / 1e3:.1f} ms, "
                 f"{sum(count[track].values())} events")
    if "GPU" in str(track[0]):
      kinds = collections.Counter()
      for name, duration in names.items():
        kinds[kernel_kind(name)] += duration
      for kind, duration in kinds.most_common():
        lines.append(f"  {duration / 1e3:9.2f} ms {100 * duration / summed:5.1f}%  [{kind}]")
    for name, duration in names.most_common(top):
      lines.append(f"  {duration / 1e3:9.2f} ms {count[track][name]:6d}x  {name[:110]}")
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if not argv:
    raise SystemExit(__doc__)
  with gzip.open(find_trace(argv[0])) as f:
    events = json.load(f)["traceEvents"]
  print(summarise(events, int(argv[1]) if len(argv) > 1 else 30))


if __name__ == "__main__":
  main()
