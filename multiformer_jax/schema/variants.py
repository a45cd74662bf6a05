"""What experiments share beyond the base config: the `arg` of
`--config=configs/file.py:arg`, the tiny CPU variant, a paper's batch per update and the
no-downsampling models' settings.

`arg` is a comma-separated list of variant names and key=value pairs, e.g.
`configs/s2t_v2.py:runlocal` (the tiny CPU variant of the experiment) or
`configs/s2t_v2.py:runlocal,train.seed=2`.
"""

from __future__ import annotations

from multiformer_common.settings import ConfigError
from multiformer_jax.data.input_pipeline import SPEECH_STAGES

# The no-downsampling models (4x longer encoder sequences) keep the loop-based memory options
# on every backend: the thesis lost batches to out-of-memory on an 11 GB GPU, and with them a
# 20 000-frame batch compiles to 3.3-3.7 GiB on an H100 in bf16 (11-21 GiB without).
NODOWN_MEMORY_OPTIONS = {"key_block_size": 512, "ffn_token_chunk": 1024}
# Their batch (thesis App. B): 5000 frames x update_freq 64 = 320k frames per update.
NODOWN_BATCH = (5000, 64)


def batch_per_update(config, max_frames: int, update_freq: int):
  """A paper's batch: `max_frames` x `update_freq` padded source frames per update in both
  stages, whatever the device count: `max_frames` per device and micro-batch (what the
  paper's GPU held), the micro-batches per update derived (update_freq on one device)."""
  config.data.max_frames = max_frames
  config.data.frames_per_update = max_frames * update_freq
  for stage in SPEECH_STAGES:
    config[stage].update_freq = 0
  return config


def no_downsampling(config):
  """Thesis App. B: the conv subsampler's two convolutions with stride 1 (the encoder sees
  every 10 ms frame), the memory options, and 5000 frames x 64 per update."""
  config.model.conv_strides = (1, 1)
  config.model.update(NODOWN_MEMORY_OPTIONS)
  return batch_per_update(config, *NODOWN_BATCH)


def runlocal(config):
  """Shrinks an experiment to a CPU-sized model with the same head-layout structure, one
  batch per update."""
  m = config.model
  m.d_model, m.ffn_dim, m.conv_channels = 64, 128, 128
  m.decoder_layers = 2
  config.data.frames_per_update = 0
  for stage in SPEECH_STAGES:
    config[stage].update_freq = 1
  return config


VARIANTS = {"runlocal": runlocal}


def apply_arg(config, arg, variants=None):
  """Applies `arg` ('runlocal', 'model.dropout=0.3', ... comma-separated) to `config`;
  `variants` adds an experiment's own named variants to the shared ones."""
  known = {**VARIANTS, **(variants or {})}
  for item in filter(None, (arg or "").split(",")):
    item = item.strip()
    if "=" in item:
      key, value = item.split("=", 1)
      node = config
      *path, leaf = key.strip().split(".")
      for part in path:
        node = node[part]
      node[leaf] = _parse_value(node[leaf], value.strip(), key)
    elif item in known:
      config = known[item](config)
    else:
      raise ConfigError(f"unknown config variant {item!r}; valid: {sorted(known)} or "
                        f"key=value")
  return config


def _parse_value(current, text, key):
  """`text` converted to the type of the current value (tuples written as 5:5 or asr:st)."""
  if isinstance(current, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ConfigError(f"config {key}={text!r}: expected true or false")
    return text.lower() in ("true", "1")
  if isinstance(current, (tuple, list)):
    kind = type(current[0]) if current else int
    return tuple(kind(v) for v in text.split(":"))
  try:
    return type(current)(text)
  except ValueError:
    raise ConfigError(f"config {key}={text!r}: expected a {type(current).__name__} like "
                      f"{current!r}") from None
