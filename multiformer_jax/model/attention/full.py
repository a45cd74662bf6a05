"""`full` heads: scaled dot-product softmax attention over every valid key."""

import flax.linen as nn
import jax.numpy as jnp

from multiformer_jax.model.attention.blockwise import blockwise_attention
from multiformer_jax.model.attention.flash import flash_attention
from multiformer_jax.model.attention.fused import prefix_key_attention, use_cudnn, use_flash
from multiformer_jax.model.attention.masks import masked_softmax
from multiformer_jax.model.dropout import Dropout


def attention_weights(q, k, mask):
  """Softmax weights [batch, heads, q_len, k_len] (float32) of scaled dot-product attention."""
  scale = q.shape[-1] ** -0.5
  logits = jnp.einsum("bqhd,bkhd->bhqk", q * scale, k,
                      preferred_element_type=jnp.float32)  # [batch, heads, q_len, k_len]
  return masked_softmax(logits, mask)


def softmax_attention(q, k, v, mask, dropout=None, deterministic=True):
  """Scaled dot-product attention.

  q: [batch, q_len, heads, head_dim]; k, v: [batch, k_len, heads, head_dim];
  mask: bool, broadcastable to [batch, heads, q_len, k_len].
  dropout: a Dropout module applied to the attention weights (fairseq's attention dropout).
  Returns ([batch, q_len, heads, head_dim], weights [batch, heads, q_len, k_len]).
  """
  weights = attention_weights(q, k, mask)
  if dropout is not None:
    weights = dropout(weights, deterministic=deterministic)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)
  return out, weights


def key_masked_attention(module: nn.Module, q, k, v, key_mask, key_block_size: int,
                         dropout: Dropout, deterministic: bool, implementation: str = "xla"):
  """Softmax attention over the valid keys of a prefix key_mask [batch, k_len]: cuDNN's fused
  attention or our Pallas kernel where `implementation` picks them (fused.py, flash.py), else
  one dense softmax, or blockwise over `key_block_size` keys (blockwise.py) when > 0. The
  kernel draws the dense form's dropout mask (`dropout`'s key), the blockwise form its own
  from `module`'s dropout rng."""
  rate = 0.0 if deterministic else dropout.rate
  if use_cudnn(implementation, q, rate):
    return prefix_key_attention(q, k, v, key_mask)
  if use_flash(implementation, q, k, rate):
    return flash_attention(q, k, v, key_mask, rate, dropout.key() if rate > 0.0 else None)
  if key_block_size:
    rng = module.make_rng("dropout") if rate > 0.0 else None
    return blockwise_attention(q, k, v, key_mask, key_block_size, rate, rng)
  out, _ = softmax_attention(q, k, v, key_mask[:, None, None, :], dropout, deterministic)
  return out


class FullAttention(nn.Module):
  """Masked softmax attention; takes unscaled q, k, v of one head group."""
  attention_dropout: float = 0.0
  key_block_size: int = 0     # > 0: exact blockwise softmax, O(q_len x block) memory
  implementation: str = "xla"  # auto | xla | cudnn (fused.py)

  @nn.compact
  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    return key_masked_attention(self, q, k, v, key_mask, self.key_block_size,
                                Dropout(self.attention_dropout), deterministic,
                                self.implementation)

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, k_len]: the weight of each value in each output (no dropout)."""
    return attention_weights(q, k, key_mask[:, None, None, :])
