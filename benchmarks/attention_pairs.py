"""local(129) and kernel(256) against their PyTorch references, on equal work, in alternating
runs:

    python -m benchmarks.attention_pairs --torch_python /tmp/torchenv/bin/python \
        --out_dir docs/benchmarks/cpu/attention_pairs [--rounds 6] [--n 4096]

(/tmp/torchenv: torch, local-attention 1.11.2 and performer-pytorch 1.1.4, see
benchmarks/torch_attention.py.)

First the equal-work check, on the same q, k, v (batch 2, 4 heads x 64, n = 512, N(0, 1)):
- lucidrains `LocalAttention(window_size=64, look_backward=1, look_forward=1,
  exact_windowsize=True, use_rotary_pos_emb=False)` against `local_attention(window=129)`:
  the same function, so the outputs must agree within 1e-4;
- performer-pytorch `FastAttention(nb_features=256)` against `favor_attention` with
  performer-pytorch's own projection matrix: the same estimator on the same features, so the
  outputs must agree within 1e-4; with our own draw both must err against exact softmax
  attention by the same order (their mean absolute errors within 2x of each other).
The timing refuses to run when a check fails.

Then `--rounds` rounds at length `--n` (batch 8, 4 heads x 64, fwd+bwd and forward, median of
`--repeats`): benchmarks/attention.py (local(129), kernel(256)) and
benchmarks/torch_attention.py one after the other, ours first in rounds 0, 3, 4, 7, ... (ABBA),
both processes on one allocator: GLIBC_TUNABLES=glibc.malloc.hugetlb=1, or with `--allocator
tcmalloc` the system's tcmalloc preloaded into both.
`summary.json` under --out_dir holds the check, every round, the median speed ratios and the
memory figures (XLA temporaries for ours, peak resident-set growth for PyTorch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.report_format import verdict
from benchmarks.common import read_results
from benchmarks.fairseq_pairs import check_pairs_args, ours_first
from multiformer_jax.runtime import host_memory

HUGE_PAGES = "glibc.malloc.hugetlb=1"
PAIRS = (("local(129)", "lucidrains_local(129)"), ("kernel(256)", "performer(256)"))
LOCAL_TOLERANCE = 1e-4
KERNEL_TOLERANCE = 1e-4

# Runs in the PyTorch environment: the references' outputs on the q, k, v of argv[1] ([batch,
# heads, n, dim] float32), written to argv[2] with performer-pytorch's projection matrix.
REFERENCE_OUTPUTS = r"""
import sys
import numpy as np
import torch
from local_attention import LocalAttention
from performer_pytorch import FastAttention
inputs = np.load(sys.argv[1])
q, k, v = (torch.from_numpy(inputs[name]) for name in ("q", "k", "v"))
head_dim = q.shape[-1]
torch.manual_seed(0)
local = LocalAttention(window_size=64, causal=False, look_backward=1, look_forward=1,
                       exact_windowsize=True, autopad=True, dim=head_dim,
                       use_rotary_pos_emb=False)
performer = FastAttention(dim_heads=head_dim, nb_features=256, causal=False)
with torch.no_grad():
    np.savez(sys.argv[2], local=local(q, k, v).numpy(), performer=performer(q, k, v).numpy(),
             projection=performer.projection_matrix.numpy())
"""


def equal_work_check(torch_python: str, n: int = 512, batch: int = 2, heads: int = 4,
                     head_dim: int = 64) -> dict:
  """Feeds one q, k, v to both sides; -> the differences and errors (see the module doc)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from multiformer_jax.model.attention.full import softmax_attention  # pylint: disable=import-outside-toplevel
  from multiformer_jax.model.attention.kernel import (  # pylint: disable=import-outside-toplevel
      favor_attention, orthogonal_gaussian_features)
  from multiformer_jax.model.attention.local import local_attention  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(batch, heads, n, head_dim)).astype(np.float32) for _ in range(3))
  with tempfile.TemporaryDirectory() as tmp:
    inputs, outputs = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
    np.savez(inputs, q=q, k=k, v=v)
    subprocess.run([torch_python, "-c", REFERENCE_OUTPUTS, inputs, outputs], check=True)
    reference = dict(np.load(outputs))
  time_major = lambda x: jnp.asarray(np.swapaxes(x, 1, 2))       # [b, h, n, d] -> [b, n, h, d]
  heads_major = lambda x: np.swapaxes(np.asarray(x), 1, 2)
  tq, tk, tv = map(time_major, (q, k, v))
  mask = jnp.ones((batch, n), bool)
  ours_local = heads_major(local_attention(tq, tk, tv, mask, 129))
  same_features = heads_major(favor_attention(tq, tk, tv, mask, jnp.asarray(
      reference["projection"])))
  own_features = heads_major(favor_attention(tq, tk, tv, mask, orthogonal_gaussian_features(
      jax.random.PRNGKey(0), 256, head_dim)))
  exact = heads_major(softmax_attention(tq, tk, tv, mask[:, None, None, :])[0])
  mean_error = lambda x: float(np.mean(np.abs(x - exact)))
  check = {"n": n, "batch": batch, "heads": heads, "head_dim": head_dim,
           "local_max_abs_diff": float(np.max(np.abs(ours_local - reference["local"]))),
           "kernel_same_features_max_abs_diff": float(np.max(np.abs(
               same_features - reference["performer"]))),
           "performer_mean_abs_error_vs_softmax": mean_error(reference["performer"]),
           "kernel_mean_abs_error_vs_softmax": mean_error(own_features)}
  errors = (check["performer_mean_abs_error_vs_softmax"],
            check["kernel_mean_abs_error_vs_softmax"])
  check["passed"] = bool(check["local_max_abs_diff"] <= LOCAL_TOLERANCE
                         and check["kernel_same_features_max_abs_diff"] <= KERNEL_TOLERANCE
                         and max(errors) <= 2 * min(errors))
  return check


def pairs_environment(allocator: str) -> dict:
  """One allocator for both sides. 'glibc': glibc with huge pages, our entry points' tcmalloc
  preload turned off (PyTorch would not have it); 'tcmalloc': the system's tcmalloc preloaded
  into both processes."""
  env = {k: v for k, v in os.environ.items() if k != host_memory.TCMALLOC_OPT_OUT_VARIABLE}
  env["GLIBC_TUNABLES"] = HUGE_PAGES
  if allocator == "tcmalloc":
    library = host_memory.find_tcmalloc()
    if library is None:
      raise SystemExit("--allocator tcmalloc: no tcmalloc library in "
                       f"{host_memory.LIBRARY_DIRS} (apt install libtcmalloc-minimal4)")
    env = host_memory.tcmalloc_environment(env, library) or env
  return {**env, host_memory.TCMALLOC_OPT_OUT_VARIABLE: "0"}


def _rows(path: str) -> dict:
  return {row["kind"]: row for row in read_results(path)[1] if "seconds" in row}



# The report's section of this benchmark (benchmarks/report.py assembles them).
PAIRS_SUMMARY = os.path.join("cpu", "attention_pairs", "summary.json")


def report_targets(directory) -> list:
  """The Targets rows against lucidrains and performer-pytorch: from one alternating run of
  benchmarks/attention_pairs.py (equal work checked, both on the same allocator)."""
  path = os.path.join(directory, PAIRS_SUMMARY)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  check, rounds, n = summary["check"], len(summary["rounds"]), summary["n"]
  local, kernel = summary["local(129)"], summary["kernel(256)"]
  speed = lambda s: (f"{s['median_ratio']:.2f}x ({s['median_ours_s']:.3f} vs "
                     f"{s['median_peer_s']:.3f} s; median of {rounds} ABBA rounds, both on "
                     f"{summary['glibc_tunables']}; rounds {s['min_ratio']:.2f}-"
                     f"{s['max_ratio']:.2f}x)")
  return [
      [f"local(129) vs lucidrains local-attention (no rotary; outputs "
       f"{check['local_max_abs_diff']:.1e} apart), n={n}: >= 1.5x faster",
       speed(local),
       verdict(local["median_ratio"] >= 1.5)],
      [f"local(129) vs lucidrains, n={n}: <= 1/2 of its memory",
       f"{local['memory_ratio']:.2f} (XLA temporaries vs its peak RSS growth)",
       verdict(local["memory_ratio"] <= 0.5)],
      [f"kernel(256) vs performer-pytorch (same estimator: outputs "
       f"{check['kernel_same_features_max_abs_diff']:.1e} apart on its features), n={n}: "
       ">= 3x faster",
       speed(kernel),
       verdict(kernel["median_ratio"] >= 3)],
  ]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--torch_python", required=True,
                      help="a Python with torch, local-attention and performer-pytorch")
  parser.add_argument("--out_dir", required=True)
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--n", type=int, default=4096)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--allocator", default="glibc", choices=("glibc", "tcmalloc"),
                      help="both sides' malloc: glibc with huge pages, or the system's tcmalloc "
                           "preloaded into both (runtime/host_memory.py)")
  args = parser.parse_args(argv)
  check_pairs_args(args.rounds, args.torch_python, "torch_python")
  env = pairs_environment(args.allocator)
  os.makedirs(args.out_dir, exist_ok=True)
  check = equal_work_check(args.torch_python)
  print(json.dumps({"check": check}), flush=True)
  if not check["passed"]:
    raise SystemExit(f"the references do not compute our functions: {check}")
  rounds = []
  for i in range(args.rounds):
    ours_path = os.path.join(args.out_dir, f"ours_{i}.jsonl")
    torch_path = os.path.join(args.out_dir, f"torch_{i}.jsonl")
    sizes = ["--lengths", str(args.n), "--repeats", str(args.repeats)]
    ours = [sys.executable, os.path.join(HERE, "attention.py"), "--only",
            ",".join(kind for kind, _ in PAIRS), "--out", ours_path, *sizes]
    reference = [args.torch_python, os.path.join(HERE, "torch_attention.py"), "--out",
                 torch_path, *sizes]
    for command in (ours, reference) if ours_first(i) else (reference, ours):
      subprocess.run(command, env=env, check=True)
    ours_rows, torch_rows = _rows(ours_path), _rows(torch_path)
    record = {"round": i, "ours_first": ours_first(i)}
    for kind, peer in PAIRS:
      a, b = ours_rows[kind], torch_rows[peer]
      record[kind] = {"ours_s": a["seconds"], "peer_s": b["seconds"],
                      "ratio": round(b["seconds"] / a["seconds"], 4),
                      "forward_ratio": round(b["forward_seconds"] / a["forward_seconds"], 4),
                      "ours_temp_bytes": a["temp_bytes"],
                      "peer_peak_growth_bytes": b["peak_growth_bytes"]}
    rounds.append(record)
    print(json.dumps(record), flush=True)
  summary = {"check": check, "rounds": rounds, "n": args.n, "glibc_tunables": HUGE_PAGES,
             "ld_preload": env.get("LD_PRELOAD", ""), "command": " ".join(sys.argv)}
  for kind, peer in PAIRS:
    ratios = [r[kind]["ratio"] for r in rounds]
    summary[kind] = {"peer": peer, "median_ratio": statistics.median(ratios),
                     "min_ratio": min(ratios), "max_ratio": max(ratios),
                     "median_forward_ratio": statistics.median(
                         r[kind]["forward_ratio"] for r in rounds),
                     "median_ours_s": statistics.median(r[kind]["ours_s"] for r in rounds),
                     "median_peer_s": statistics.median(r[kind]["peer_s"] for r in rounds),
                     "memory_ratio": statistics.median(
                         r[kind]["ours_temp_bytes"] / r[kind]["peer_peak_growth_bytes"]
                         for r in rounds)}
  with open(os.path.join(args.out_dir, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps({kind: summary[kind] for kind, _ in PAIRS}))


if __name__ == "__main__":
  main()
