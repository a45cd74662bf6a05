"""The S2T model (encoder + decoder) and the small public API to build and run it."""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax.model import decoder as decoder_lib
from multiformer_jax.model.decoder import Decoder
from multiformer_jax.model.encoder import Encoder
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.model.stacked import StackedTextEncoder


class S2TModel(nn.Module):
  """Speech-to-text Transformer with a Multiformer encoder.

  Call with (features [batch, frames, input_dim], lengths [batch], prev_tokens [batch, len])
  for teacher-forced logits [batch, len, vocab]; `encode`, `decode`, `cross_kv` and
  `decode_step` are the pieces (use `model.apply(variables, ..., method=...)`).
  Multilingual / multi-domain models also take `tasks`: [batch] task ids for both stacks, or
  a pair (encoder ids, decoder ids) [batch] each when the stacks are keyed differently
  (default 0), and, in training, the head-selection `temperature`. With `ctc_head` the call also sows the CTC
  logits of the encoder output and its mask into the "ctc" collection (`mutable=["ctc"]`).
  With `text_encoder_layers` a text encoder stacked on the speech encoder reads the CTC head's
  distribution (model/stacked.py) and the decoder reads the stack; the CTC head stays on the
  speech encoder.
  """
  config: ModelConfig

  def setup(self):
    self.encoder = Encoder(self.config, name="encoder")
    self.decoder = Decoder(self.config, name="decoder")
    if self.config.ctc_head:
      self.ctc_proj = nn.Dense(self.config.ctc_size, name="ctc_proj")
    if self.config.text_encoder_layers:
      self.text_encoder = StackedTextEncoder(self.config, name="text_encoder")

  def encode(self, features, lengths, deterministic: bool = True, tasks=None, temperature=None):
    """-> (what the decoder reads [batch, frames', d_model], its mask [batch, frames']). Sows
    the CTC logits of the speech encoder's output where the "ctc" collection is mutable."""
    encoded, mask = self.encoder(features, lengths, deterministic, tasks, temperature)
    stacked = self.config.text_encoder_layers
    if self.config.ctc_head and (stacked or self.is_mutable_collection("ctc")):
      ctc_logits = self.ctc_proj(encoded)
      self.sow("ctc", "logits", (ctc_logits.astype(jnp.float32), mask))
      if stacked:
        encoded = self.text_encoder(encoded, ctc_logits, mask, deterministic)
    return encoded, mask

  def decode(self, prev_tokens, encoded, encoder_mask, deterministic: bool = True, tasks=None,
             temperature=None):
    return self.decoder(prev_tokens, encoded, encoder_mask, deterministic, tasks, temperature)

  def cross_kv(self, encoded):
    return self.decoder.cross_kv(encoded)

  def ctc_log_probs(self, encoded):
    """The CTC head's log-probabilities [batch, frames', vocab] (models with `ctc_head`)."""
    return jax.nn.log_softmax(self.ctc_proj(encoded).astype(jnp.float32))

  def decode_step(self, tokens, index, cache, cross_kv, encoder_mask, tasks=None):
    return self.decoder.decode_step(tokens, index, cache, cross_kv, encoder_mask, tasks)

  def __call__(self, features, lengths, prev_tokens, deterministic: bool = True, tasks=None,
               temperature=None):
    encoder_tasks, decoder_tasks = split_tasks(tasks)
    encoded, mask = self.encode(features, lengths, deterministic, encoder_tasks, temperature)
    return self.decode(prev_tokens, encoded, mask, deterministic, decoder_tasks, temperature)


def split_tasks(tasks):
  """(encoder task ids, decoder task ids) from one array for both stacks or a pair."""
  if isinstance(tasks, (tuple, list)):
    encoder_tasks, decoder_tasks = tasks
    return encoder_tasks, decoder_tasks
  return tasks, tasks


def model_config_from(config: Any) -> ModelConfig:
  """A ModelConfig from a ModelConfig, a full experiment ConfigDict (uses `.model`) or a
  mapping of model keys."""
  if isinstance(config, ModelConfig):
    return config
  if hasattr(config, "model") and not isinstance(config, Mapping):
    config = config.model
  elif isinstance(config, Mapping) and "model" in config:
    config = config["model"]
  return ModelConfig.from_dict(config)


def build_model(config: Any) -> S2TModel:
  """Builds the model from a config (see `model_config_from`); validates it first."""
  return S2TModel(model_config_from(config))


def init_params(model: S2TModel, key, batch: int = 1, frames: int = 16, tokens: int = 4):
  """Initial parameters for `model` from `key` (shapes do not depend on the dummy sizes). The
  dummy inputs are host arrays: made on the device, each would be a small program to compile."""
  cfg = model.config
  features = np.zeros((batch, frames, cfg.input_dim), np.float32)
  lengths = np.full((batch,), frames, np.int32)
  prev = np.full((batch, tokens), cfg.eos_id, np.int32)
  return jitted_init(model)({"params": key}, features, lengths, prev)["params"]


@functools.lru_cache(maxsize=16)
def jitted_init(model: nn.Module):
  """model.init, jitted once per model (an equal config is an equal model; S2TModel and the MT
  stage's MTModel alike): a process that initialises the same model again (each stage of a
  run, each test) reuses its program."""
  return jax.jit(model.init)


def init_cache(model_or_config, batch: int, max_len: int):
  cfg = model_or_config.config if isinstance(model_or_config, S2TModel) else model_or_config
  return decoder_lib.init_cache(cfg, batch, max_len)


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
