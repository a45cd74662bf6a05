"""The frozen model configuration, built once from the `model` section of a ConfigDict.

Every model hyper-parameter is a field here and nowhere else: modules read this object, configs
set its fields by name (configs/default.py documents each), and unknown or mistyped keys fail
at build time with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from data_prep.common.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.model.attention.fused import IMPLEMENTATIONS
from multiformer_jax.model.attention.kernel import REDRAW_POLICIES
from multiformer_jax.model.head_selection import INFERENCE_MODES, STRATEGIES

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
TASK_TAGS = ("", "source_lang", "target_lang", "domain", "pair")
DROPOUT_RATES = ("dropout", "attention_dropout", "activation_dropout")   # each in [0, 1)
# model.key_block_size / model.ffn_token_chunk = AUTO: the faster form for the backend. Blockwise
# softmax on CPU, the dense softmax on GPU/TPU, where a loop of small matmuls is slower
# (measurements: docs/benchmarks.md). The FFN unchunked on every backend (its custom VJP,
# feedforward.py, makes it the faster form on CPU too); chunks stay a memory option (the
# no-downsampling configs set 1024).
AUTO = -1
CPU_KEY_BLOCK_SIZE = 512
CPU_FFN_TOKEN_CHUNK = 0


class ConfigError(ValueError):
  """A model config value that cannot be used, naming the key and what is valid."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int = 8000
  input_dim: int = 80
  d_model: int = 256
  ffn_dim: int = 2048
  encoder_layers: int = 12
  decoder_layers: int = 6
  encoder_heads: int = 4
  decoder_heads: int = 4
  encoder_layout: str = "12x(4*full)"
  conv_kernels: tuple[int, ...] = (5, 5)
  conv_strides: tuple[int, ...] = (2, 2)
  conv_channels: int = 1024
  subsampler_masks_padding: bool = True
  dropout: float = 0.1
  attention_dropout: float = 0.1
  activation_dropout: float = 0.1
  kernel_redraw: str = "fixed"
  kernel_seed: int = 0
  local_block_size: int = 0
  key_block_size: int = AUTO
  ffn_token_chunk: int = AUTO
  attention_implementation: str = "auto"   # auto | xla | cudnn | flash (fused.py, local.py,
                                           # kernel.py)
  qkv_bias: bool = True
  dtype: str = "float32"
  max_target_positions: int = 1024
  # Multilingual / multi-domain models (multiformer_jax/model/head_selection.py).
  task_tag: str = ""               # what a task is: source_lang | target_lang | domain | pair
  encoder_task_tag: str = ""       # the encoder's task key ('' = task_tag)
  decoder_task_tag: str = ""       # the decoder's task key ('' = task_tag)
  num_tasks: int = 1               # tasks of a stack whose count is not given below
  encoder_num_tasks: int = 0       # set from the training data (0 = num_tasks)
  decoder_num_tasks: int = 0       # set from the training data (0 = num_tasks)
  encoder_candidates: int = 0      # H' candidate heads per encoder layer (0 = no selection)
  decoder_candidates: int = 0      # H' candidates in decoder self-attention (0 = no selection)
  selection_strategy: str = "group"
  selection_temperature: float = 5.0
  selection_inference: str = "deterministic"
  adapter_dim: int = 0             # per-task adapter bottleneck after every layer (0 = none)
  ctc_head: bool = False           # a linear CTC projection of the encoder output (hybrid
                                   # CTC/attention training; the stage's ctc_weight weights it)
  ctc_vocab_size: int = 0          # 0: the CTC head spells the decoder's vocabulary; > 0: the
                                   # size of another one (ST's CTC on the source transcript in
                                   # the ASR vocabulary)
  text_encoder_layers: int = 0     # > 0: full-attention layers stacked on the encoder, fed the
                                   # CTC head's distribution over source pieces (stacked.py)
  bos_id: int = BOS_ID           # the vocabularies' specials (data_prep.common.token_ids)
  pad_id: int = PAD_ID
  eos_id: int = EOS_ID
  unk_id: int = UNK_ID

  def __post_init__(self):
    # Normalise sequences (ConfigDicts hold lists) so the dataclass stays hashable.
    for name in ("conv_kernels", "conv_strides"):
      object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
    self.validate()

  def validate(self):
    if self.dtype not in (*COMPUTE_DTYPES, "auto"):
      raise ConfigError(f"model.dtype={self.dtype!r}; valid: {sorted(COMPUTE_DTYPES)} or "
                        f"'auto' (bfloat16 on a GPU or TPU, float32 on a CPU)")
    if self.attention_implementation not in IMPLEMENTATIONS:
      raise ConfigError(f"model.attention_implementation={self.attention_implementation!r}; "
                        f"valid: {IMPLEMENTATIONS}")
    if self.kernel_redraw not in REDRAW_POLICIES:
      raise ConfigError(f"model.kernel_redraw={self.kernel_redraw!r}; valid: {REDRAW_POLICIES}")
    if len(self.conv_kernels) != len(self.conv_strides) or not self.conv_kernels:
      raise ConfigError(f"model.conv_kernels={self.conv_kernels} and model.conv_strides="
                        f"{self.conv_strides} must be non-empty and of the same length")
    if any(k < 1 for k in self.conv_kernels) or any(s < 1 for s in self.conv_strides):
      raise ConfigError(f"subsampler kernels {self.conv_kernels} and strides "
                        f"{self.conv_strides} must be >= 1")
    for name in DROPOUT_RATES:
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ConfigError(f"model.{name}={getattr(self, name)} must be in [0, 1)")
    if self.d_model % self.decoder_heads:
      raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.decoder_heads="
                        f"{self.decoder_heads}")
    if self.d_model % 2:
      raise ConfigError(f"model.d_model={self.d_model} must be even (sinusoidal positions)")
    if self.text_encoder_layers < 0 or (self.text_encoder_layers and not self.ctc_head):
      raise ConfigError(f"model.text_encoder_layers={self.text_encoder_layers}: >= 0, and > 0 "
                        f"only with a CTC head (its distribution over source pieces is what "
                        f"the stacked text encoder reads)")
    self.validate_selection()
    self.layout  # parses and validates the encoder layout

  def validate_selection(self):
    for name in ("task_tag", "encoder_task_tag", "decoder_task_tag"):
      if getattr(self, name) not in TASK_TAGS:
        raise ConfigError(f"model.{name}={getattr(self, name)!r}; valid: {TASK_TAGS} ('' = "
                          f"{'one task' if name == 'task_tag' else 'model.task_tag'})")
    if self.num_tasks < 1:
      raise ConfigError(f"model.num_tasks={self.num_tasks} must be >= 1")
    for side in ("encoder", "decoder"):
      if getattr(self, f"{side}_num_tasks") < 0:
        raise ConfigError(f"model.{side}_num_tasks={getattr(self, f'{side}_num_tasks')} must be "
                          f">= 1 (0 = model.num_tasks)")
    if self.selection_strategy not in STRATEGIES:
      raise ConfigError(f"model.selection_strategy={self.selection_strategy!r}; valid: "
                        f"{STRATEGIES}")
    if self.selection_inference not in INFERENCE_MODES:
      raise ConfigError(f"model.selection_inference={self.selection_inference!r}; valid: "
                        f"{INFERENCE_MODES}")
    if self.selection_temperature <= 0:
      raise ConfigError(f"model.selection_temperature={self.selection_temperature} must be > 0")
    if self.local_block_size < 0:
      raise ConfigError(f"model.local_block_size={self.local_block_size} must be >= 0 "
                        f"(0 = automatic)")
    for name, zero in (("key_block_size", "dense softmax"), ("ffn_token_chunk", "unchunked")):
      if getattr(self, name) < AUTO:
        raise ConfigError(f"model.{name}={getattr(self, name)} must be >= 0 (0 = {zero}) or "
                          f"{AUTO} (automatic: by backend)")
    if self.adapter_dim < 0:
      raise ConfigError(f"model.adapter_dim={self.adapter_dim} must be >= 0 (0 = no adapters)")
    for side, heads in (("encoder", self.encoder_heads), ("decoder", self.decoder_heads)):
      candidates = getattr(self, f"{side}_candidates")
      if candidates and (candidates < heads or candidates % heads):
        raise ConfigError(
            f"model.{side}_candidates={candidates} must be a multiple of model.{side}_heads="
            f"{heads} (H of H' candidates; the group strategy splits them into H groups), "
            f"e.g. {2 * heads}; 0 = no head selection")
    if self.encoder_candidates and self.d_model % self.encoder_heads:
      raise ConfigError(f"model.d_model={self.d_model} is not divisible by "
                        f"model.encoder_heads={self.encoder_heads}")

  def stack_num_tasks(self, side: str) -> int:
    return getattr(self, f"{side}_num_tasks") or self.num_tasks

  @property
  def resolved_key_block_size(self) -> int:
    """key_block_size with AUTO resolved for the default backend (0 = dense softmax)."""
    return _resolve(self.key_block_size, CPU_KEY_BLOCK_SIZE)

  @property
  def resolved_ffn_token_chunk(self) -> int:
    """ffn_token_chunk with AUTO resolved for the default backend (0 = unchunked)."""
    return _resolve(self.ffn_token_chunk, CPU_FFN_TOKEN_CHUNK)

  @functools.cached_property
  def layout(self) -> layout_lib.Layout:
    if self.encoder_candidates:   # the layout lists the candidates; head_dim = d / H
      try:
        return layout_lib.parse_layout(self.encoder_layout, self.encoder_layers,
                                       self.encoder_candidates)
      except layout_lib.LayoutError as e:
        raise layout_lib.LayoutError(
            f"{e}\n(with head selection the layout lists the model.encoder_candidates="
            f"{self.encoder_candidates} candidate heads of each layer, of which "
            f"model.encoder_heads={self.encoder_heads} are used)") from None
    return layout_lib.parse_layout(self.encoder_layout, self.encoder_layers, self.encoder_heads,
                                   self.d_model)

  @property
  def ctc_size(self) -> int:
    """The CTC head's output size."""
    return self.ctc_vocab_size or self.vocab_size

  @property
  def ctc_scores_output(self) -> bool:
    """Whether the CTC head spells the decoder's own vocabulary, so that its prefix scores can
    join the beam search (an ST model's source-transcript CTC cannot)."""
    return self.ctc_head and not self.ctc_vocab_size

  @property
  def compute_dtype(self):
    """The dtype activations and matrix products are computed in (parameters stay float32):
    model.dtype, with 'auto' = bfloat16 with an accelerator, float32 on a CPU."""
    if self.dtype == "auto":
      return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return COMPUTE_DTYPES[self.dtype]

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """From a mapping (e.g. `config.model`); unknown keys and wrong types are errors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = dict(values.items())
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise ConfigError(f"unknown model config key(s) {unknown}; valid keys: {sorted(fields)}")
    typed = {}
    for name, value in values.items():
      default = fields[name].default
      if isinstance(default, bool):
        ok = isinstance(value, bool)
      elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
      elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
      elif isinstance(default, str):
        ok = isinstance(value, str)
      else:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value)
      if not ok:
        raise ConfigError(f"model.{name}={value!r} has type {type(value).__name__}; expected "
                          f"{type(default).__name__} like {default!r}")
      typed[name] = value
    return cls(**typed)

  def to_dict(self) -> dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _resolve(value: int, cpu_value: int) -> int:
  if value != AUTO:
    return value
  return cpu_value if jax.default_backend() == "cpu" else 0
