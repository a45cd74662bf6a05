"""The PyTorch references of benchmarks/attention.py, run side by side on the same machine:
lucidrains `local-attention` (exact +-64 window) and `performer-pytorch` (256 features).

Needs an environment with torch, local-attention and performer-pytorch (not the toolkit's;
torch is not a dependency of multiformer-jax):

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.13.0 \
        local-attention==1.11.2 performer-pytorch==1.1.4
(torch 2.13.0's CPU wheel lies on the project machines' disk; a plain `torch` pulls a CUDA
build of several GB.)
    /tmp/torchenv/bin/python -m benchmarks.torch_attention --out docs/benchmarks/torch_attention.jsonl

Each (kind, n) runs in a fresh subprocess, so its memory figure is the growth of the peak
resident set over the inputs (ru_maxrss after fwd+bwd minus before), the closest CPU analogue
of XLA's compiled temporaries. Time is the median fwd+bwd of `--repeats` runs after a warm-up,
and the median forward alone under `torch.no_grad()` (`forward_seconds`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, statistics, sys, time
import torch
mode, kind, n, batch, heads, head_dim, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
torch.manual_seed(0)
shape = (batch, heads, n, head_dim)
q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
if kind == "lucidrains_local(129)":
    from local_attention import LocalAttention
    attn = LocalAttention(window_size=64, causal=False, look_backward=1, look_forward=1,
                          exact_windowsize=True, autopad=True, dim=head_dim,
                          use_rotary_pos_emb=False)
elif kind == "performer(256)":
    from performer_pytorch import FastAttention
    attn = FastAttention(dim_heads=head_dim, nb_features=256, causal=False)
else:
    raise SystemExit(f"unknown kind {kind}")
def step():
    attn(q, k, v).sum().backward()
    q.grad = k.grad = v.grad = None
if mode == "peak":   # a fresh process: the growth of the peak RSS over one fwd+bwd
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_growth_bytes": (after - before) * 1024}))
else:
    def forward():   # what evaluation pays: no graph kept
        with torch.no_grad():
            attn(q, k, v)
    def median_time(fn):
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
        return statistics.median(times)
    print(json.dumps({"seconds": median_time(step), "forward_seconds": median_time(forward),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))
"""


def run(code: str, *args) -> dict:
  result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, check=False)
  if result.returncode:
    raise RuntimeError(result.stderr[-2000:])
  return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/torch_attention.jsonl")
  parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(json.dumps({"meta": {"command": " ".join(sys.argv), "batch": args.batch,
                                 "heads": args.heads, "head_dim": args.head_dim,
                                 "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}})
            + "\n")
  for n in map(int, args.lengths.split(",")):
    for kind in ("lucidrains_local(129)", "performer(256)"):
      sizes = (n, args.batch, args.heads, args.head_dim, args.repeats)
      timing = run(CHILD, "time", kind, *sizes)
      memory = run(CHILD, "peak", kind, *sizes)
      row = {"kind": kind, "n": n, **timing, **memory}
      print(json.dumps(row), flush=True)
      with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
