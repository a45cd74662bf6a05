"""Softmax attention through cuDNN's fused flash attention, where it applies.

`full` and `conv` heads form their [q_len, k_len] weights because fairseq's attention dropout
acts on them. Where no dropout is active (evaluation, or `model.attention_dropout = 0`) the
same function runs through `jax.nn.dot_product_attention(implementation="cudnn")` on a GPU in
bfloat16 or float16: one kernel, no n x n tensor (5.7x faster than our dense softmax at
n = 4096 on an H200, docs/benchmarks.md).

`model.attention_implementation` chooses:
  auto   cuDNN where it applies (GPU, bfloat16/float16, head_dim a multiple of 8 and <= 128,
         no active attention dropout), our own softmax elsewhere;
  xla    always our own softmax (dense or blockwise, `model.key_block_size`);
  cudnn  cuDNN, and an error naming the reason where it cannot apply.

Key masks are prefix masks (sequences are right-padded, masks.py), so they reach cuDNN as key
lengths, its padding mask, rather than as an [n x n] mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "xla", "cudnn")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def cudnn_unsupported(q, dropout_rate: float) -> str | None:
  """Why cuDNN's flash attention cannot compute these heads (None: it can).

  q: [batch, q_len, heads, head_dim]; dropout_rate: the attention dropout in effect now.
  """
  backend = jax.default_backend()
  if backend != "gpu":
    return f"the backend is {backend!r}; cuDNN needs 'gpu'"
  if q.dtype not in CUDNN_DTYPES:
    return (f"the compute dtype is {q.dtype}; cuDNN takes bfloat16 or float16 "
            f"(model.dtype='bfloat16')")
  head_dim = q.shape[-1]
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return f"head_dim {head_dim} is not a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}"
  if dropout_rate > 0.0:
    return (f"attention dropout {dropout_rate} is active and jax.nn.dot_product_attention has "
            f"none (model.attention_dropout=0, or evaluation)")
  return None


def use_cudnn(implementation: str, q, dropout_rate: float) -> bool:
  """Whether `implementation` ('auto' | 'xla' | 'cudnn') runs these heads through cuDNN."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"model.attention_implementation={implementation!r}; valid: "
                     f"{IMPLEMENTATIONS}")
  if implementation == "xla":
    return False
  reason = cudnn_unsupported(q, dropout_rate)
  if implementation == "cudnn" and reason:
    raise ValueError(f"model.attention_implementation='cudnn' cannot run here: {reason}. "
                     f"'auto' uses cuDNN only where it can, 'xla' never")
  return reason is None


def prefix_key_attention(q, k, v, key_mask, implementation: str = "cudnn"):
  """Softmax attention over the valid keys of a prefix key_mask [batch, k_len], through
  `jax.nn.dot_product_attention` ('cudnn', or 'xla' for the same call on any backend).

  q: [batch, q_len, heads, head_dim]; k, v: [batch, k_len, heads, head_dim]
  -> [batch, q_len, heads, head_dim]. A row with no valid key attends to its first key
  (such rows are padding, and their outputs are masked downstream). k and v are cast to q's
  dtype (conv heads compress them in float32).
  """
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  lengths = jnp.maximum(jnp.sum(key_mask, axis=1, dtype=jnp.int32), 1)   # [batch]
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                      implementation=implementation)
