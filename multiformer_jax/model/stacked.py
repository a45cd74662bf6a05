"""A text encoder stacked on the speech encoder (SATE's adaptor, Xu et al. 2021).

The ST model's CTC head spells the source transcript in the ASR pieces; its distribution at
each encoder position weights the MT model's source embeddings (a soft embedding of what was
heard), the speech encoder's own output is added through a projection that starts at zero, and
the MT model's encoder layers read the sum. Started from the MT stage's encoder
(`st.text_encoder="mt"`), the stack hands the MT stage's decoder the kind of input it learned
to translate, instead of acoustic states it never saw. Blank (id 0) has a row of its own,
learned in the ST stage: the MT model's source never holds id 0.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from multiformer_jax.model.encoder import EncoderLayer
from multiformer_jax.model.feedforward import layer_norm
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.model.positions import padded_positions


def text_layers_config(config: ModelConfig, layers: int, dropout: float) -> ModelConfig:
  """`config` with an encoder of `layers` full-attention layers of its width and heads and
  `dropout` everywhere, no CTC head (the MT model's encoder; the decoder's shapes stay)."""
  heads = config.encoder_heads
  return dataclasses.replace(
      config, encoder_layers=layers, encoder_layout=f"{layers}x({heads}*full)",
      encoder_candidates=0, adapter_dim=0, ctc_head=False, ctc_vocab_size=0,
      text_encoder_layers=0, dropout=dropout, attention_dropout=dropout,
      activation_dropout=dropout)


class StackedTextEncoder(nn.Module):
  """(encoded [batch, T, d], ctc_logits [batch, T, V], mask [batch, T]) -> [batch, T, d].

  Names match the MT model's encoder (embed_source, layers_i, layer_norm), so its
  parameters load as they are."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    text_cfg = text_layers_config(cfg, cfg.text_encoder_layers, cfg.dropout)
    self.embed_source = nn.Embed(cfg.ctc_size, cfg.d_model)
    self.acoustic = nn.Dense(cfg.d_model, kernel_init=nn.initializers.zeros, name="acoustic")
    self.layers = [EncoderLayer(text_cfg, layer, i, name=f"layers_{i}")
                   for i, layer in enumerate(text_cfg.layout)]
    self.layer_norm = layer_norm("layer_norm")

  def __call__(self, encoded, ctc_logits, mask, deterministic: bool = True):
    d = self.config.d_model
    pieces = jax.nn.softmax(ctc_logits.astype(jnp.float32), axis=-1)      # [batch, T, V]
    soft = pieces.astype(encoded.dtype) @ self.embed_source.embedding.astype(encoded.dtype)
    x = math.sqrt(d) * soft + self.acoustic(encoded)                        # [batch, T, d]
    x = x + padded_positions(mask, d).astype(x.dtype)
    for layer in self.layers:
      x = layer(x, mask, deterministic)
    return self.layer_norm(x) * mask[..., None]
