"""The S2T encoder: conv subsampler, scaled input + sinusoids, pre-LN Multiformer layers.

Multilingual / multi-domain models (multiformer_jax/model/head_selection.py) take a task id per
example: with `model.encoder_candidates` each layer uses the heads selected for the example's
task, with `model.adapter_dim` a per-task adapter follows each layer.
"""

import math

import flax.linen as nn
import jax.numpy as jnp

from multiformer_jax.model import layout as layout_lib
from multiformer_jax.model.attention.masks import lengths_to_mask
from multiformer_jax.model.attention.multi import MultiHeadMultiAttention
from multiformer_jax.model.dropout import Dropout, add_residual
from multiformer_jax.model.feedforward import FeedForward, layer_norm
from multiformer_jax.model.head_selection import adapt, layer_selections, stack_task_modules
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.model.positions import padded_positions
from multiformer_jax.model.subsampler import Conv1dSubsampler


class EncoderLayer(nn.Module):
  """h = x + Dropout(MHMA(LN(x))); y = h + FFN(LN(h))."""
  config: ModelConfig
  layer_layout: layout_lib.LayerLayout
  layer_index: int = 0

  def setup(self):
    cfg = self.config
    self.self_attn_layer_norm = layer_norm("self_attn_layer_norm")
    self.self_attn = MultiHeadMultiAttention(
        cfg.d_model, self.layer_layout, cfg.attention_dropout, cfg.kernel_redraw,
        cfg.kernel_seed * 7919 + self.layer_index, cfg.local_block_size, cfg.qkv_bias,
        cfg.compute_dtype, cfg.encoder_heads if cfg.encoder_candidates else 0,
        cfg.resolved_key_block_size, cfg.attention_implementation, cfg.attention_init,
        name="self_attn")
    self.dropout = Dropout(cfg.dropout)
    self.final_layer_norm = layer_norm("final_layer_norm")
    self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.dropout, cfg.activation_dropout,
                           cfg.compute_dtype, cfg.resolved_ffn_token_chunk, name="ffn")

  def __call__(self, x, mask, deterministic: bool = True, selection=None):
    h = self.self_attn(self.self_attn_layer_norm(x), mask, deterministic, selection)
    x = add_residual(x, self.dropout(h, deterministic=deterministic))
    return add_residual(x, self.ffn(self.final_layer_norm(x), deterministic))


class Encoder(nn.Module):
  """features [batch, frames, input_dim], lengths [batch] ->
  (encoded [batch, frames', d_model], mask [batch, frames'] bool)."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.subsample = Conv1dSubsampler(cfg.conv_channels, cfg.d_model, cfg.conv_kernels,
                                      cfg.conv_strides, cfg.compute_dtype,
                                      cfg.subsampler_masks_padding, name="subsample")
    self.dropout = Dropout(cfg.dropout)
    self.layers = [EncoderLayer(cfg, layer, i, name=f"layers_{i}")
                   for i, layer in enumerate(cfg.layout)]
    self.layer_norm = layer_norm("layer_norm")
    self.head_selector, self.adapters = stack_task_modules(cfg, "encoder")

  def embed(self, features, lengths, deterministic: bool = True):
    """Subsampler + scale + positions + dropout: the input of layer 0, and its mask."""
    x, lengths = self.subsample(features.astype(self.config.compute_dtype), lengths)
    mask = lengths_to_mask(lengths, x.shape[1])
    x = math.sqrt(self.config.d_model) * x + padded_positions(mask, self.config.d_model)
    return self.dropout(x, deterministic=deterministic), mask

  def __call__(self, features, lengths, deterministic: bool = True, tasks=None,
               temperature=None):
    """tasks: [batch] int task ids (default 0); temperature: the Gumbel-sigmoid temperature
    (default model.selection_temperature)."""
    x, mask = self.embed(features, lengths, deterministic)
    if tasks is None:
      tasks = jnp.zeros(features.shape[:1], jnp.int32)
    selections = layer_selections(self.head_selector, self.config.encoder_layers, tasks,
                                  temperature, deterministic)
    for i, (layer, selection) in enumerate(zip(self.layers, selections)):
      x = adapt(self.adapters, i, layer(x, mask, deterministic, selection), tasks)
    x = self.layer_norm(x) * mask[..., None]
    return x, mask
