"""Which fused kernel computes the softmax attention of `full` and `conv` heads; cuDNN's call.

`full` and `conv` heads form their [q_len, k_len] weights because fairseq's attention dropout
acts on them. Where no dropout is active (evaluation, or `model.attention_dropout = 0`) the
same function runs through `jax.nn.dot_product_attention(implementation="cudnn")` on a GPU in
bfloat16 or float16: one kernel, no n x n tensor (5.7x faster than our dense softmax at
n = 4096 on an H200, docs/benchmarks.md).

While attention dropout is active, our Pallas kernel (flash.py) computes the same function,
dropout included, without the n x n tensor either (2.4x faster than our dense softmax with
dropout at the s2t_transformer_s encoder's 250 positions on an H200).

`model.attention_implementation` chooses:
  auto   cuDNN where it applies (GPU, bfloat16/float16, head_dim a multiple of 8 and <= 128,
         no active attention dropout), our Pallas kernel where dropout is active and it
         applies, our own softmax elsewhere;
  xla    always our own softmax (dense or blockwise, `model.key_block_size`);
  cudnn  cuDNN, and an error naming the reason where it cannot apply;
  flash  our Pallas kernel (GPU, bfloat16/float16, head_dim 16/32/64/128), dropout or not,
         and an error naming the reason where it cannot apply.

Key masks are prefix masks (sequences are right-padded, masks.py), so they reach cuDNN as key
lengths, its padding mask, rather than as an [n x n] mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.attention.flash import kernel_unsupported

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "flash")
FUSED_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def _gpu_half_unsupported(q, kernel: str) -> str | None:
  """The backend and dtype that both fused kernels need; None where they are met."""
  backend = jax.default_backend()
  if backend != "gpu":
    return f"the backend is {backend!r}; {kernel} needs 'gpu'"
  if q.dtype not in FUSED_DTYPES:
    return (f"the compute dtype is {q.dtype}; {kernel} takes bfloat16 or float16 "
            f"(model.dtype='bfloat16')")
  return None


def cudnn_unsupported(q, dropout_rate: float) -> str | None:
  """Why cuDNN's flash attention cannot compute these heads (None: it can).

  q: [batch, q_len, heads, head_dim]; dropout_rate: the attention dropout in effect now.
  """
  reason = _gpu_half_unsupported(q, "cuDNN")
  if reason:
    return reason
  head_dim = q.shape[-1]
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return f"head_dim {head_dim} is not a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}"
  if dropout_rate > 0.0:
    return (f"attention dropout {dropout_rate} is active and jax.nn.dot_product_attention has "
            f"none (model.attention_dropout=0, or evaluation)")
  return None


def flash_unsupported(q, k) -> str | None:
  """Why our Pallas kernel cannot compute these heads here (None: it can).
  q: [batch, q_len, heads, head_dim]; k: [batch, k_len, heads, head_dim]."""
  return _gpu_half_unsupported(q, "the Pallas kernel") or kernel_unsupported(q, k)


def _possible_or_refused(implementation: str, kernel: str, reason: str | None) -> bool:
  """Whether the kernel named `kernel` runs (reason None); forcing it where it cannot
  raises with the reason."""
  if implementation == kernel and reason:
    raise InvalidValue(f"model.attention_implementation={kernel!r} cannot run here: {reason}. "
                     f"'auto' uses the fused kernels only where they can, 'xla' never")
  return reason is None


def use_cudnn(implementation: str, q, dropout_rate: float) -> bool:
  """Whether `implementation` runs these heads through cuDNN."""
  if implementation not in IMPLEMENTATIONS:
    raise InvalidValue(f"model.attention_implementation={implementation!r}; valid: "
                     f"{IMPLEMENTATIONS}")
  if implementation not in ("auto", "cudnn"):
    return False
  return _possible_or_refused(implementation, "cudnn", cudnn_unsupported(q, dropout_rate))


def use_flash(implementation: str, q, k, dropout_rate: float) -> bool:
  """Whether `implementation` runs these heads through our Pallas kernel (flash.py); asked
  where cuDNN was not chosen. 'auto' takes it only while attention dropout is active."""
  if implementation not in ("auto", "flash") or (implementation == "auto" and not dropout_rate):
    return False
  return _possible_or_refused(implementation, "flash", flash_unsupported(q, k))


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
