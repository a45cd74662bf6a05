"""The MT stage's model: the source transcript's ASR pieces embedded and read by a few
full-attention Transformer layers, then the speech model's decoder (the config's).

Its decoder has the ST model's names and shapes, so the ST stage can start from it
(`st.decoder_init="mt"`: an MT-pretrained decoder), and its translations measure what the
corpus's (transcript, translation) pairs teach a decoder of this size (benchmarks/text_mt_ceiling.py)."""

from __future__ import annotations

import math

import flax.linen as nn

from multiformer_common.token_ids import PAD_ID
from multiformer_jax.model.decoder import Decoder
from multiformer_jax.model.encoder import EncoderLayer
from multiformer_jax.model.feedforward import layer_norm
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.model.positions import padded_positions


class MTModel(nn.Module):
  """Source pieces [batch, S] -> target logits [batch, U, vocab] through the config's decoder."""
  config: ModelConfig
  source_vocab: int

  def setup(self):
    self.embed_source = nn.Embed(self.source_vocab, self.config.d_model)
    self.layers = [EncoderLayer(self.config, layer, i, name=f"layers_{i}")
                   for i, layer in enumerate(self.config.layout)]
    self.layer_norm = layer_norm("layer_norm")
    self.decoder = Decoder(self.config, name="decoder")

  def encode(self, source, deterministic: bool = True):
    """source [batch, S] -> (encoded [batch, S, d], mask [batch, S])."""
    mask = source != PAD_ID
    x = math.sqrt(self.config.d_model) * self.embed_source(source)
    x = x + padded_positions(mask, self.config.d_model)
    for layer in self.layers:
      x = layer(x, mask, deterministic)
    return self.layer_norm(x), mask

  def __call__(self, source, prev_tokens, deterministic: bool = True):
    encoded, mask = self.encode(source, deterministic)
    return self.decoder(prev_tokens, encoded, mask, deterministic)

  def cross_kv(self, encoded):
    return self.decoder.cross_kv(encoded)

  def decode_step(self, tokens, index, cache, cross_kv, mask):
    return self.decoder.decode_step(tokens, index, cache, cross_kv, mask)
