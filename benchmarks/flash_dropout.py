"""Softmax attention with attention dropout: our Pallas kernel (model/attention/flash.py) against
the dense softmax with its dropout mask in memory, fwd+bwd, and how far their results differ.

    python -m benchmarks.flash_dropout --out docs/benchmarks/flash_dropout.jsonl \
        [--shapes 320x250,8x4096] [--heads 4] [--head_dim 64] [--rate 0.1] [--dtype bfloat16]

Per shape (batch x length, self-attention with the key masks of lengths from `length` down to
3/4 of it): with dropout, both forms draw the same mask from the same key, so the kernel's
output and gradients must equal the dense ones up to rounding (`max_abs_diff_*`, against the
values' mean magnitude `*_abs_mean`); the seconds of the jitted gradient of
sum(out * cotangent) for the dense form with dropout ('xla'), the kernel with dropout ('flash'),
and without dropout the kernel ('flash_no_dropout') and cuDNN's fused attention ('cudnn', GPU
only). The kernel needs a GPU; --interpret runs it in Pallas' interpreter (slow; a check of
the script on a CPU).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import Results, machine, time_call
from multiformer_jax.model import dropout as dropout_lib
from multiformer_jax.model.attention.flash import flash_attention
from multiformer_jax.model.attention.full import attention_weights
from multiformer_jax.model.attention.fused import prefix_key_attention


def dense(q, k, v, key_mask, rate, rng):
  """The `full` heads' dense path with its attention dropout (full.softmax_attention)."""
  weights = attention_weights(q, k, key_mask[:, None, None, :])
  if rate > 0.0:
    weights = dropout_lib.dropout(weights, rate, rng)
  return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)


def gradient(attend, cotangent):
  """jit of (q, k, v) -> (out, dq, dk, dv) of sum(attend(q, k, v) * cotangent)."""
  def loss(q, k, v):
    out = attend(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * cotangent), out
  def out_and_grads(q, k, v):
    grads, out = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return (out, *grads)
  return jax.jit(out_and_grads)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/flash_dropout.jsonl")
  parser.add_argument("--shapes", default="320x250,8x4096")
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--rate", type=float, default=0.1)
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--interpret", action="store_true")
  args = parser.parse_args(argv)
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
  dtype = jnp.dtype(args.dtype)
  rng = jax.random.PRNGKey(7)
  for shape in args.shapes.split(","):
    batch, length = (int(n) for n in shape.split("x"))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v = (jax.random.normal(key, (batch, length, args.heads, args.head_dim), dtype)
               for key in keys[:3])
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    lengths = np.linspace(length, 3 * length // 4, batch).astype(np.int32)
    key_mask = jnp.asarray(np.arange(length)[None, :] < lengths[:, None])

    def flash(rate):
      return lambda q, k, v: flash_attention(q, k, v, key_mask, rate, rng,
                                             interpret=args.interpret)
    forms = {"xla": lambda q, k, v: dense(q, k, v, key_mask, args.rate, rng),
             "flash": flash(args.rate), "flash_no_dropout": flash(0.0)}
    if jax.default_backend() == "gpu" and dtype != jnp.float32:
      forms["cudnn"] = lambda q, k, v: prefix_key_attention(q, k, v, key_mask)
    row = {"batch": batch, "length": length, "heads": args.heads, "head_dim": args.head_dim,
           "rate": args.rate, "dtype": args.dtype}
    want = None
    valid = np.asarray(key_mask)                                   # [batch, length]
    for name, attend in forms.items():
      fn = gradient(attend, cotangent)
      got = [np.asarray(x, np.float32) for x in jax.block_until_ready(fn(q, k, v))]
      # out, dq: valid query rows; dk, dv: valid keys (the rest are padding).
      got = [x[valid] for x in got]
      if want is None:
        want = got
        for label, x in zip(("out", "dq", "dk", "dv"), got):
          row[f"{label}_abs_mean"] = float(np.abs(x).mean())
      elif name == "flash":
        for label, x, y in zip(("out", "dq", "dk", "dv"), got, want):
          row[f"max_abs_diff_{label}"] = float(np.abs(x - y).max())
      row[f"seconds_{name}"] = round(time_call(fn, q, k, v, repeats=args.repeats), 6)
    row["flash_speedup_over_xla"] = round(row["seconds_xla"] / row["seconds_flash"], 3)
    results.add(**row)


if __name__ == "__main__":
  main()
