"""Attention kinds: fwd+bwd time, XLA compiled temporary memory and FLOPs against n.

    python benchmarks/attention.py --out docs/benchmarks/attention.jsonl \
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

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (Results, compiled, local_heads_in_one_chunk, machine,  # noqa: E402
                               time_call)
from multiformer_jax.model.attention.blockwise import blockwise_attention  # noqa: E402
from multiformer_jax.model.attention.conv import ConvAttention  # noqa: E402
from multiformer_jax.model.attention.full import softmax_attention  # noqa: E402
from multiformer_jax.model.attention.kernel import (favor_attention, heads_major,  # noqa: E402
                                                    orthogonal_gaussian_features,
                                                    with_ones_column)
from multiformer_jax.model.attention import kernel_cpu, local_cpu  # noqa: E402
from multiformer_jax.model.attention.local import local_attention  # noqa: E402
from multiformer_jax.runtime.host_memory import set_up_host_allocator  # noqa: E402
from multiformer_jax.runtime.xla_flags import add_default_xla_flags  # noqa: E402

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
