"""The Transformer decoder with teacher forcing and cached incremental decoding.

Incremental decoding keeps a self-attention K/V cache per layer ({'k','v'}: [batch,
max_len, heads, head_dim]) and takes the cross-attention K/V of every layer precomputed once
per utterance (`cross_kv`). Beam search passes queries for batch*beam hypotheses against the
per-utterance K/V: the beams of an utterance share them and nothing is tiled.

With `model.decoder_candidates` (head selection) self-attention projects to H' candidate heads
(cached, all of them) and each example uses the H selected for its task; with
`model.adapter_dim` a per-task adapter follows each layer. Task ids are per row (hypothesis).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from multiformer_jax.model.attention.full import softmax_attention
from multiformer_jax.model.attention.masks import causal_mask
from multiformer_jax.model.dropout import Dropout, add_residual
from multiformer_jax.model.feedforward import FeedForward, layer_norm
from multiformer_jax.model.head_selection import (adapt, gather_heads, layer_selections,
                                            stack_task_modules)
from multiformer_jax.model.initializers import (embedding_normal, torch_default_bias,
                                          xavier_uniform, xavier_uniform_qkv)
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.model.positions import padded_positions


class DecoderAttention(nn.Module):
  """fairseq MultiheadAttention with the K/V projection exposed for caching; with
  `num_candidates` it projects to that many heads and uses the `num_heads` selected."""
  d_model: int
  num_heads: int
  attention_dropout: float = 0.0
  dtype: jnp.dtype = jnp.float32
  num_candidates: int = 0

  def setup(self):
    projected = (self.num_candidates or self.num_heads) * (self.d_model // self.num_heads)

    def projection(name, init, bias_init, width=projected):
      return nn.Dense(width, kernel_init=init, bias_init=bias_init, dtype=self.dtype,
                      name=name)
    bias = torch_default_bias(self.d_model)
    self.q_proj = projection("q_proj", xavier_uniform_qkv, bias)
    self.k_proj = projection("k_proj", xavier_uniform_qkv, bias)
    self.v_proj = projection("v_proj", xavier_uniform_qkv, bias)
    self.out_proj = projection("out_proj", xavier_uniform, nn.initializers.zeros, self.d_model)
    self.dropout = Dropout(self.attention_dropout)

  def _split(self, x):
    heads = self.num_candidates or self.num_heads
    return x.reshape(x.shape[:2] + (heads, self.d_model // self.num_heads))

  def project_kv(self, x):
    """[batch, time, d] -> k, v: [batch, time, heads, head_dim]."""
    return self._split(self.k_proj(x)), self._split(self.v_proj(x))

  def attend(self, x, k, v, mask, deterministic: bool = True, selection=None):
    """x: [batch*beams, q_len, d] against k, v: [batch, k_len, heads, head_dim].

    mask: bool broadcastable to [batch, heads, q_len, k_len] (batch of the keys).
    When x has `beams` times the batch of k, query row b*beams+i uses utterance b's keys.
    selection: (indices, weights) [batch, H] of the selected candidates (head selection).
    """
    q = self._split(self.q_proj(x))                      # [batch*beams, q_len, heads, hd]
    batch = k.shape[0]
    beams = q.shape[0] // batch
    if beams > 1:
      # [batch, beams*q_len, heads, hd]: beams share the utterance's keys and values.
      q = q.reshape((batch, beams * q.shape[1]) + q.shape[2:])
      mask = jnp.tile(mask, (1, 1, beams, 1)) if mask.shape[2] > 1 else mask
    out, _ = softmax_attention(q, k, v, mask, self.dropout, deterministic)
    if self.num_candidates:
      out = gather_heads(out, *selection)               # [batch, q_len, H, head_dim]
    out = out.reshape(x.shape[0], x.shape[1], self.d_model)
    return self.out_proj(out)


class DecoderLayer(nn.Module):
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.self_attn_layer_norm = layer_norm("self_attn_layer_norm")
    self.self_attn = DecoderAttention(cfg.d_model, cfg.decoder_heads, cfg.attention_dropout,
                                      cfg.compute_dtype, cfg.decoder_candidates,
                                      name="self_attn")
    self.encoder_attn_layer_norm = layer_norm("encoder_attn_layer_norm")
    self.encoder_attn = DecoderAttention(cfg.d_model, cfg.decoder_heads, cfg.attention_dropout,
                                         cfg.compute_dtype, name="encoder_attn")
    self.final_layer_norm = layer_norm("final_layer_norm")
    self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.dropout, cfg.activation_dropout,
                           cfg.compute_dtype, name="ffn")
    self.dropout = Dropout(cfg.dropout)

  def __call__(self, x, self_kv, self_mask, cross_kv, cross_mask, deterministic=True,
               selection=None):
    """One layer. self_kv: the self-attention keys/values to attend to (the whole prefix)."""
    h = self.self_attn.attend(self.self_attn_layer_norm(x), *self_kv, self_mask, deterministic,
                              selection)
    x = add_residual(x, self.dropout(h, deterministic=deterministic))
    h = self.encoder_attn.attend(self.encoder_attn_layer_norm(x), *cross_kv, cross_mask,
                                 deterministic)
    x = add_residual(x, self.dropout(h, deterministic=deterministic))
    return add_residual(x, self.ffn(self.final_layer_norm(x), deterministic))

  def self_kv(self, x):
    return self.self_attn.project_kv(self.self_attn_layer_norm(x))

  def cross_kv(self, encoded):
    return self.encoder_attn.project_kv(encoded)


class Decoder(nn.Module):
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.d_model,
                                 embedding_init=embedding_normal(cfg.d_model, cfg.pad_id),
                                 name="embed_tokens")
    self.dropout = Dropout(cfg.dropout)
    self.layers = [DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.decoder_layers)]
    self.layer_norm = layer_norm("layer_norm")
    self.output_projection = nn.Dense(
        cfg.vocab_size, use_bias=False, dtype=cfg.compute_dtype,
        kernel_init=nn.initializers.normal(cfg.d_model ** -0.5), name="output_projection")
    self.head_selector, self.adapters = stack_task_modules(cfg, "decoder")

  def _embed(self, tokens, offset, deterministic):
    not_pad = tokens != self.config.pad_id
    x = self.embed_tokens(tokens) * not_pad[..., None]   # the pad row stays zero, no gradient
    x = math.sqrt(self.config.d_model) * x + padded_positions(not_pad, self.config.d_model,
                                                              offset)
    return self.dropout(x.astype(self.config.compute_dtype), deterministic=deterministic)

  def _logits(self, x):
    return self.output_projection(self.layer_norm(x)).astype(jnp.float32)

  def cross_kv(self, encoded):
    """Per layer (k, v) of the encoder output: computed once per utterance."""
    return tuple(layer.cross_kv(encoded) for layer in self.layers)

  def __call__(self, prev_tokens, encoded, encoder_mask, deterministic: bool = True,
               tasks=None, temperature=None):
    """Teacher forcing: prev_tokens [batch, len] (EOS + tokens) -> logits [batch, len, vocab].
    tasks: [batch] task ids (default 0)."""
    if tasks is None:
      tasks = jnp.zeros(prev_tokens.shape[:1], jnp.int32)
    selections = layer_selections(self.head_selector, self.config.decoder_layers, tasks,
                                  temperature, deterministic)
    x = self._embed(prev_tokens, 0, deterministic)
    length = prev_tokens.shape[1]
    key_valid = (prev_tokens != self.config.pad_id)[:, None, None, :]
    self_mask = causal_mask(length)[None, None] & key_valid    # [batch, 1, len, len]
    cross_mask = encoder_mask[:, None, None, :]
    for i, (layer, cross) in enumerate(zip(self.layers, self.cross_kv(encoded))):
      x = layer(x, layer.self_kv(x), self_mask, cross, cross_mask, deterministic, selections[i])
      x = adapt(self.adapters, i, x, tasks)
    return self._logits(x)

  def decode_step(self, tokens, index, cache, cross_kv, encoder_mask, tasks=None):
    """One incremental step for every hypothesis.

    tokens: [n, 1] the previous token of each of n = batch*beams hypotheses; index: scalar
    step (0 for the first token, EOS); cache: from `init_cache(n, max_len)`; cross_kv and
    encoder_mask: per utterance (batch rows); tasks: [n] task ids (default 0).
    Returns (logits [n, vocab], new cache).
    """
    if tasks is None:
      tasks = jnp.zeros(tokens.shape[:1], jnp.int32)
    selections = layer_selections(self.head_selector, self.config.decoder_layers, tasks)
    x = self._embed(tokens, index, True)                            # [n, 1, d]
    max_len = cache[0]["k"].shape[1]
    self_mask = (jnp.arange(max_len) <= index)[None, None, None, :]  # [1, 1, 1, max_len]
    cross_mask = encoder_mask[:, None, None, :]
    new_cache = []
    for i, (layer, layer_cache, cross) in enumerate(zip(self.layers, cache, cross_kv)):
      k_new, v_new = layer.self_kv(x)                               # [n, 1, heads, hd]
      k = jax.lax.dynamic_update_slice_in_dim(layer_cache["k"], k_new.astype(
          layer_cache["k"].dtype), index, axis=1)
      v = jax.lax.dynamic_update_slice_in_dim(layer_cache["v"], v_new.astype(
          layer_cache["v"].dtype), index, axis=1)
      new_cache.append({"k": k, "v": v})
      x = layer(x, (k, v), self_mask, cross, cross_mask, True, selections[i])
      x = adapt(self.adapters, i, x, tasks)
    return self._logits(x)[:, 0], tuple(new_cache)


def init_cache(config: ModelConfig, batch: int, max_len: int):
  """Empty self-attention caches: per layer {'k','v'} of [batch, max_len, heads, head_dim]."""
  heads = config.decoder_candidates or config.decoder_heads
  shape = (batch, max_len, heads, config.d_model // config.decoder_heads)
  zeros = jnp.zeros(shape, config.compute_dtype)
  return tuple({"k": zeros, "v": zeros} for _ in range(config.decoder_layers))
