"""Attention kinds: fwd+bwd time, XLA compiled temporary memory and FLOPs against n.

    python -m benchmarks.attention --out docs/benchmarks/attention.jsonl \
        [--lengths 256,512,1024,2048,4096,8192] [--batch 8] [--heads 4] [--head_dim 64]

Every kind runs on the same q, k, v ([batch, n, heads, head_dim], every position valid), as
jit(grad(sum(attention(q, k, v)))) with respect to q, k, v (and the conv weights). The
references are the dense masked computation a JAX user would write for a window
(`jax.nn.dot_product_attention(local_window_size=...)`, which forms the n x n matrix under a
mask) and dense full attention; they are skipped above --max_dense_n (their n^2 temporaries).
On a GPU two cuDNN flash-attention rows join them (`jax.nn.dot_product_attention(...,
implementation="cudnn")`): `cudnn_full` (every key valid, as `full`) and
`cudnn_masked(129)`, the same band as local(129) given as a boolean mask (cuDNN's own sliding
window is causal only, so a symmetric window is a mask). Each cuDNN row records the largest
absolute difference of its forward output from its counterpart's (`full`, `local(129)`) on the
same q, k, v: the check that both compute the same function.
Each row also times the forward alone (`forward_seconds`: what evaluation pays).
Results are JSON lines: kind, n, seconds, forward_seconds, temp_bytes, flops.
`benchmarks/report.py` turns them into docs/benchmarks.md tables and plots.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

from benchmarks.report_format import (MIB, allocator, command_line, forward_table, kind_rows, load,
                                      machine_line, markdown_table, verdict)
from benchmarks import attention_pairs
from benchmarks.common import (Results, compiled, local_heads_in_one_chunk, machine,
                               time_call)
from multiformer_jax.model.attention.blockwise import blockwise_attention
from multiformer_jax.model.attention.conv import ConvAttention
from multiformer_jax.model.attention.full import softmax_attention
from multiformer_jax.model.attention.kernel import (favor_attention, heads_major,
                                                    orthogonal_gaussian_features,
                                                    with_ones_column)
from multiformer_jax.model.attention import kernel_cpu, local_cpu
from multiformer_jax.model.attention.local import local_attention
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags

LOCAL_WINDOWS = (5, 17, 33, 65, 129)
KEY_BLOCK = 512   # the blockwise rows (model.key_block_size)


def local_kinds():
  """name -> (window, dilation, implementation, attention dropout). `auto` runs the CPU kernel
  where it applies (local_cpu.py), `/xla` names the XLA band; `/dropout` rows drop weights at
  the recipes' rate, 0.1 (training)."""
  kinds = {f"local({w})": (w, 1, "auto", 0.0) for w in LOCAL_WINDOWS}
  kinds["local(33,2)"] = (33, 2, "auto", 0.0)
  kinds["local(129)/xla"] = (129, 1, "xla", 0.0)
  kinds["local(129)/dropout"] = (129, 1, "auto", 0.1)
  kinds["local(129)/xla/dropout"] = (129, 1, "xla", 0.1)
  return kinds


def kernel_kinds():
  """name -> implementation: `auto` runs the CPU kernel where it applies (kernel_cpu.py),
  `/xla` names the XLA path."""
  return {"kernel(256)": "auto", "kernel(256)/xla": "xla"}


def kernel_projection(head_dim: int):
  """The kernel(256) rows' fixed features."""
  return orthogonal_gaussian_features(jax.random.PRNGKey(0), 256, head_dim)


def kernel_fn(projection, implementation: str):
  return lambda p, q, k, v, m: favor_attention(q, k, v, m, projection, implementation)


def local_fn(window: int, dilation: int, implementation: str, rate: float = 0.0):
  key = jax.random.PRNGKey(0) if rate > 0.0 else None
  return lambda p, q, k, v, m: local_attention(q, k, v, m, window, dilation, dropout_rate=rate,
                                               dropout_rng=key, implementation=implementation)


def kinds(head_dim: int, window_for_dense: int):
  """name -> (fn(params, q, k, v, mask) -> out, params or None, is_dense)."""
  projection = kernel_projection(head_dim)
  table = {
      f"dense_masked({window_for_dense})": (
          lambda p, q, k, v, m: jax.nn.dot_product_attention(
              q, k, v, local_window_size=(window_for_dense // 2, window_for_dense // 2)),
          None, True),
      "full": (lambda p, q, k, v, m: softmax_attention(q, k, v, m[:, None, None, :])[0],
               None, True),
  }
  for name, spec in local_kinds().items():
    table[name] = (local_fn(*spec), None, False)
  for name, implementation in kernel_kinds().items():
    table[name] = (kernel_fn(projection, implementation), None, False)
  table["kernel(256)/products"] = (lambda p, q, k, v, m: kernel_products(q, k, v, projection),
                                   None, False)
  table[f"full/blockwise({KEY_BLOCK})"] = (
      lambda p, q, k, v, m: blockwise_attention(q, k, v, m, KEY_BLOCK), None, False)
  dummy = jnp.zeros((1, 16, 1, head_dim))
  for kernel, stride in ((5, 2), (7, 3)):
    for key_block in (0, KEY_BLOCK):
      module = ConvAttention(kernel, stride, key_block_size=key_block)
      params = module.init(jax.random.PRNGKey(0), dummy, dummy, dummy,
                           jnp.ones((1, 16), bool))["params"]
      name = f"conv({kernel},{stride})" + (f"/blockwise({key_block})" if key_block else "")
      table[name] = (
          lambda p, q, k, v, m, module=module: module.apply({"params": p}, q, k, v, m),
          params, False)
  return table


CUDNN_COUNTERPARTS = {"cudnn_full": "full", "cudnn_masked(129)": "local(129)"}


def cudnn_kinds():
  """The cuDNN flash-attention references (GPU only), same signature as kinds()' entries."""
  def band(n):
    offsets = jnp.arange(n)[None, :] - jnp.arange(n)[:, None]
    return (jnp.abs(offsets) <= 64)[None, None]   # [1, 1, q, k]
  return {   # flash attention: no n x n temporaries, so not "dense" (--max_dense_n)
      "cudnn_full": (lambda p, q, k, v, m: jax.nn.dot_product_attention(
          q, k, v, key_value_seq_lengths=jnp.sum(m, axis=1, dtype=jnp.int32),
          implementation="cudnn"), None, False),
      "cudnn_masked(129)": (lambda p, q, k, v, m: jax.nn.dot_product_attention(
          q, k, v, mask=band(q.shape[1]), implementation="cudnn"), None, False),
  }


def kernel_products(q, k, v, projection):
  """The matrix products of kernel(256) alone, in its layout: the feature projections of q and
  k, phi(k)^T [v, 1] and phi(q) (phi(k)^T [v, 1]), without the exponentials, stabilisers, masks
  and the normalising division. Its fwd+bwd is the floor under kernel(256)'s on this machine."""
  u_q = jnp.einsum("bhtd,md->bhtm", heads_major(q), projection)
  u_k = jnp.einsum("bhtd,md->bhtm", heads_major(k), projection)
  v_ones = with_ones_column(heads_major(v))
  out = jnp.einsum("bhqm,bhmd->bhqd", u_q, jnp.einsum("bhkm,bhkd->bhmd", u_k, v_ones))
  return heads_major(out[..., :-1])


def fwd_bwd(fn):
  def loss(params, q, k, v, mask):
    return jnp.sum(fn(params, q, k, v, mask).astype(jnp.float32))
  return jax.grad(loss, argnums=(0, 1, 2, 3))



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory, plot_dir):
  meta, rows = load(directory, "attention.jsonl")
  if not rows:
    return "", [], ""
  # The PyTorch rows run on the allocator ours run on (huge pages), from one run.
  torch_meta_row, torch_rows = load(directory, "torch_attention_hugepages.jsonl")
  measured = [r for r in rows if "seconds" in r]
  kinds = list(dict.fromkeys(r["kind"] for r in rows))
  lengths = sorted({r["n"] for r in rows})
  get = {(r["kind"], r["n"]): r for r in measured}
  tget = {(r["kind"], r["n"]): r for r in torch_rows}
  torch_kinds = list(dict.fromkeys(r["kind"] for r in torch_rows))

  lookup = lambda kind, n: get.get((kind, n)) or tget.get((kind, n))
  time_rows = kind_rows(kinds + torch_kinds, lengths, lookup, "seconds")
  mem_rows = kind_rows(kinds, lengths, lookup, "temp_bytes", MIB, "{:.0f}")
  mem_rows += kind_rows(torch_kinds, lengths, lookup, "peak_growth_bytes", MIB, "{:.0f}",
                         "{} (RSS growth)")
  flop_rows = kind_rows(kinds, lengths, lookup, "flops", 1e9, "{:.1f}")
  timed_forward = [kind for kind in kinds + torch_kinds
                   if any("forward_seconds" in (lookup(kind, n) or {}) for n in lengths)]
  forward_rows = kind_rows(timed_forward, lengths, lookup, "forward_seconds")
  header = ["kind"] + [f"n={n}" for n in lengths]

  for key, ylabel, name, scale in (("seconds", "fwd+bwd seconds", "attention_time.png", 1),
                                   ("temp_bytes", "XLA temporaries (MiB)",
                                    "attention_memory.png", MIB)):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in kinds + (torch_kinds if key == "seconds" else []):
      points = [(n, lookup(kind, n)[key] / scale) for n in lengths
                if (lookup(kind, n) or {}).get(key) is not None]
      if points:
        ax.plot(*zip(*points), marker="o", label=kind,
                linestyle="--" if kind in torch_kinds else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"batch {meta['batch']}, {meta['heads']} heads x {meta['head_dim']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(plot_dir, name), dpi=110)
    plt.close(fig)

  targets = []
  local, dense = get.get(("local(129)", 4096)), get.get(("dense_masked(129)", 4096))
  if local and dense:
    speed = dense["seconds"] / local["seconds"]
    memory = local["temp_bytes"] / dense["temp_bytes"]
    targets.append(["local(129) vs dense masked, n=4096: >= 15x faster",
                    f"{speed:.1f}x", verdict(speed >= 15)])
    targets.append(["local(129) vs dense masked, n=4096: <= 1/8 of the temporaries",
                    f"{memory:.3f} ({local['temp_bytes'] / MIB:.0f} vs "
                    f"{dense['temp_bytes'] / MIB:.0f} MiB)", verdict(memory <= 1 / 8)])
  for kind in ("local(129)", "local(33)", "kernel(256)"):
    a, b = get.get((kind, 1024)), get.get((kind, 8192))
    if a and b:
      growth = b["temp_bytes"] / a["temp_bytes"]
      targets.append([f"{kind} temporaries n=1024 -> 8192: <= 9x", f"{growth:.2f}x",
                      verdict(growth <= 9)])
  kernel, floor = get.get(("kernel(256)", 4096)), get.get(("kernel(256)/products", 4096))
  if kernel and floor:
    over = kernel["seconds"] / floor["seconds"]
    targets.append(["kernel(256), n=4096: within 1.15x of its matrix products alone "
                    "(`kernel(256)/products`, the floor on this CPU; the issue's alternative to "
                    "3x performer-pytorch)",
                    f"{over:.2f}x ({kernel['seconds']:.3f} vs {floor['seconds']:.3f} s, one run)",
                    verdict(over <= 1.15)])
  targets += attention_pairs.report_targets(directory)
  torch_meta = ""
  if torch_rows:
    torch_meta = (f" PyTorch references: torch {torch_rows[0].get('torch')}, "
                  f"{torch_rows[0].get('threads')} threads, in a separate environment, "
                  f"{allocator(torch_meta_row)}, lucidrains without rotary embeddings "
                  f"(the function `local(129)` computes).")
  reruns = meta.get("rerun", [])
  for rerun in reruns:
    commands = "; ".join(f"`{command_line(c)}`" for c in rerun["commands"])
    torch_meta += (f" Rows of {', '.join(rerun['kinds'])}: remeasured {rerun['date']} "
                   f"({commands}).")
  if reruns:
    torch_meta += " The others: the date above."
  text = f"""## Attention kinds

Machine: {machine_line(meta)}; JAX with {allocator(meta)}.{torch_meta}
Command: `{command_line(meta['command'])}`; PyTorch: `python -m benchmarks.torch_attention` (in an
environment with torch, local-attention 1.11.2 and performer-pytorch 1.1.4).
fwd+bwd of sum(attention(q, k, v)), batch {meta['batch']}, {meta['heads']} heads x
{meta['head_dim']} dims, all positions valid; median of 3 after a warm-up.
`dense_masked(129)` is `jax.nn.dot_product_attention(local_window_size=(64, 64))`;
`kernel(256)/products` is kernel(256)'s matrix products alone in XLA, without its
exponentials and normalisation: the floor under its XLA path on this machine.
`local(w)` and `kernel(256)` rows run the C++ kernels on the CPU (local_cpu.py, kernel_cpu.py;
their temporaries include the kernels' own scratch, outside XLA's buffers, and their FLOPs are
the XLA paths', which for local heads multiply more entries); `local(129)/xla` and
`kernel(256)/xla` are the XLA paths (local.py, kernel.py) for the same functions; `/dropout`
rows drop attention weights at 0.1, as in training.

**The peers' rows and the targets table come from different runs.** The peers' rows below
are single runs of the date above; the targets compare ours with the peers in alternated
(ABBA) rounds of a later run (`benchmarks/attention_pairs.py`,
docs/benchmarks/cpu/attention_pairs/), where lucidrains and performer-pytorch took 0.332 and
0.605 s at n = 4096 against these rows' 0.977 and 1.666 s: a machine of the same name ran up
to 3.5x faster on another day (the lab notebook). Compare ratios within one run, not times
across runs.

Seconds:

{markdown_table(header, time_rows)}

XLA compiled temporaries (MiB; PyTorch rows: growth of the peak resident set):

{markdown_table(header, mem_rows)}

The XLA FLOPs and the forward-only times of the same run:
[benchmarks/details.md](benchmarks/details.md).

![time](benchmarks/attention_time.png)
![memory](benchmarks/attention_memory.png)
"""
  details = f"""## Attention kinds: FLOPs and forward-only times

The run of [../benchmarks.md](../benchmarks.md#attention-kinds) (same command and machine).

XLA FLOPs (G):

{markdown_table(header, flop_rows)}
{forward_table(header, forward_rows)}"""
  return text, targets, details


def blockwise_report_section(directory):
  """The blockwise-softmax rows: their own run, with the dense rows they are compared with."""
  meta, rows = load(directory, "attention_blockwise.jsonl")
  measured = [r for r in rows if "seconds" in r]
  if not measured:
    return "", [], ""
  kinds = list(dict.fromkeys(r["kind"] for r in measured))
  lengths = sorted({r["n"] for r in measured})
  get = {(r["kind"], r["n"]): r for r in measured}
  lookup = lambda kind, n: get.get((kind, n))
  header = ["kind"] + [f"n={n}" for n in lengths]
  time_rows = kind_rows(kinds, lengths, lookup, "seconds")
  mem_rows = kind_rows(kinds, lengths, lookup, "temp_bytes", MIB, "{:.0f}")
  intro = f"""Machine: {machine_line(meta)}. Command: `{command_line(meta['command'])}`.
A separate run from the table above (this machine's speed differs between runs: compare rows
within one table). `/blockwise(512)` = the same heads with `model.key_block_size=512`, the
CPU default (exact online softmax over blocks of 512 keys, recomputed in the backward); the rows
without it are the dense softmax (`model.key_block_size=0`). fwd+bwd, batch {meta['batch']},
{meta['heads']} heads x {meta['head_dim']} dims; dense full attention is skipped above
n = 4096. (XLA's cost analysis counts a loop body once, so FLOPs are not compared here.)"""
  longest_dense = max((n for n in lengths if lookup("full", n)), default=None)
  blocked = lookup("full/blockwise(512)", longest_dense) if longest_dense else None
  summary = ""
  if blocked:
    dense = lookup("full", longest_dense)
    summary = (f" At n = {longest_dense}, full heads: {dense['seconds']:.2f} s and "
               f"{dense['temp_bytes'] / MIB:.0f} MiB of temporaries dense, "
               f"{blocked['seconds']:.2f} s and {blocked['temp_bytes'] / MIB:.0f} MiB blockwise.")
  summary = textwrap.fill(summary.strip() + " Every kind and length:", 95)
  text = f"""## Blockwise softmax for full and conv heads

{intro}
{summary}
[benchmarks/details.md](benchmarks/details.md#blockwise-softmax-for-full-and-conv-heads).
"""
  detail = f"""## Blockwise softmax for full and conv heads

{intro}

Seconds:

{markdown_table(header, time_rows)}

XLA compiled temporaries (MiB):

{markdown_table(header, mem_rows)}
"""
  return text, [], detail


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/attention.jsonl")
  parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--max_dense_n", type=int, default=4096)
  parser.add_argument("--dense_window", type=int, default=129,
                      help="the window of the dense masked reference (129 = +-64)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--only", default="", help="comma-separated kinds (default: all)")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="dtype of q, k, v (GPU runs use bfloat16)")
  args = parser.parse_args(argv)
  lengths = [int(n) for n in args.lengths.split(",")]
  table = kinds(args.head_dim, args.dense_window)
  local_specs = local_kinds()
  kernel_specs = kernel_kinds()
  on_gpu = jax.default_backend() == "gpu"
  table.update(cudnn_kinds() if on_gpu else {})
  only = re.split(r",(?![^(]*\))", args.only)   # commas outside parentheses: conv(5,2)
  chosen = [k for k in table if not args.only or k in only]
  results = Results(args.out, {**machine(), "batch": args.batch, "heads": args.heads,
                               "head_dim": args.head_dim, "dtype": args.dtype,
                               "command": " ".join(sys.argv)})
  rng = np.random.default_rng(0)
  for n in lengths:
    shape = (args.batch, n, args.heads, args.head_dim)
    q, k, v = (jnp.asarray(rng.normal(size=shape), args.dtype) for _ in range(3))
    mask = jnp.ones((args.batch, n), bool)
    for name in chosen:
      fn, params, dense = table[name]
      if dense and n > args.max_dense_n:
        results.add(kind=name, n=n, skipped=f"n > --max_dense_n={args.max_dense_n}")
        continue
      try:
        exe, stats = compiled(fwd_bwd(fn), params, q, k, v, mask)
      except Exception as error:   # noqa: BLE001 - cuDNN refuses some shapes and dtypes
        if name not in CUDNN_COUNTERPARTS:
          raise
        results.add(kind=name, n=n, skipped=f"cuDNN: {type(error).__name__}: {error}"[:300])
        continue
      seconds = time_call(exe, params, q, k, v, mask, repeats=args.repeats)
      forward, _ = compiled(fn, params, q, k, v, mask)   # what evaluation pays
      forward_seconds = time_call(forward, params, q, k, v, mask, repeats=args.repeats)
      if name in local_specs:
        window, dilation, implementation, rate = local_specs[name]
        # FLOPs of the XLA band (XLA counts a scan body once, and no custom call): the same
        # for the kernel's rows, which multiply fewer entries (only the band's).
        with local_heads_in_one_chunk():
          stats["flops"] = compiled(fwd_bwd(local_fn(window, dilation, "xla", rate)), params, q,
                                    k, v, mask)[1]["flops"]
        if (implementation == "auto" and local_cpu.kernel_unsupported(
            q, window // 2, rate, jax.random.PRNGKey(0)) is None):
          # The kernel's own memory is outside XLA's buffers: counted in with the temporaries.
          scratch = local_cpu.scratch_bytes(n * dilation, args.head_dim)
          stats.update(temp_bytes=stats["temp_bytes"] + scratch, cpu_kernel_scratch_bytes=scratch)
      if name in kernel_specs:
        # FLOPs of the XLA path (XLA counts none in a custom call): the same function.
        stats["flops"] = compiled(fwd_bwd(kernel_fn(kernel_projection(args.head_dim), "xla")),
                                  params, q, k, v, mask)[1]["flops"]
        if kernel_specs[name] == "auto" and kernel_cpu.kernel_unsupported(q, k) is None:
          scratch = kernel_cpu.scratch_bytes(n, args.head_dim, 256)
          stats.update(temp_bytes=stats["temp_bytes"] + scratch, cpu_kernel_scratch_bytes=scratch)
      if name in CUDNN_COUNTERPARTS:   # equal work: the same outputs as our kind's
        counterpart = table[CUDNN_COUNTERPARTS[name]][0]
        difference = jnp.max(jnp.abs(forward(params, q, k, v, mask).astype(jnp.float32) -
                                     jax.jit(counterpart)(params, q, k, v, mask)
                                     .astype(jnp.float32)))
        stats[f"max_abs_diff_vs_{CUDNN_COUNTERPARTS[name]}"] = float(difference)
      results.add(kind=name, n=n, seconds=round(seconds, 5),
                  forward_seconds=round(forward_seconds, 5), **stats)


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
