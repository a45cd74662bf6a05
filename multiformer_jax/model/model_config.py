"""The frozen model configuration, built once from the `model` section of a ConfigDict.

Every model hyper-parameter is a field here, with its default and its meaning, and nowhere
else: the experiment schema's `model` section is `config_defaults()`, modules read this object,
and unknown or mistyped keys fail at build time with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from multiformer_common import settings
from multiformer_common.settings import ConfigError, setting
from multiformer_common.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.model.attention.fused import IMPLEMENTATIONS
from multiformer_jax.model.attention.kernel import REDRAW_POLICIES
from multiformer_jax.model.head_selection import INFERENCE_MODES, STRATEGIES, SUBSET_ORDERS

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
SEMANTICS = ("exact", "thesis")
ATTENTION_INITS = ("fairseq", "pytorch")
# What model.semantics="thesis" sets besides the heads' kinds (docs/thesis_semantics.md).
THESIS_SETTINGS = {"qkv_bias": False, "attention_init": "pytorch",
                   "subsampler_masks_padding": False}
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


def derived(default, help_text: str):
  """A field set from the prepared data or the stage (experiment.model_config_for), never
  a config key."""
  return setting(default, help_text, config_key=False)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every model hyper-parameter, with its default and what it means; `config.model` holds the
  settings (`config_defaults`), the experiment fills in the derived fields."""
  vocab_size: int = derived(8000, "the decoder's vocabulary (the prepared data's)")
  input_dim: int = setting(80, "fbank channels")
  d_model: int = setting(256, "embedding / attention width")
  ffn_dim: int = setting(2048, "feed-forward hidden width")
  encoder_layers: int = setting(12, "encoder layers")
  decoder_layers: int = setting(6, "decoder layers")
  encoder_heads: int = setting(4, "heads per encoder layer (the layout's heads sum to it)")
  decoder_heads: int = setting(4, "heads per decoder attention")
  encoder_layout: str = setting(
      "12x(4*full)", "the encoder's heads in the thesis's notation (model/layout.py): full | "
      "local(w[,d]) | kernel[(m)] | conv[(k,s[,type])], e.g. 12x(2*local(65)+2*conv(5,2))")
  conv_kernels: tuple[int, ...] = setting((5, 5), "subsampler Conv1d kernels, one per layer")
  conv_strides: tuple[int, ...] = setting(
      (2, 2), "subsampler strides; (1, 1) = no downsampling (thesis App. B)")
  conv_channels: int = setting(1024, "subsampler hidden channels (before GLU)")
  subsampler_masks_padding: bool = setting(
      True, "zero padded frames before each subsampler conv; False = fairseq's subsampler, "
      "whose output for an utterance depends on its batch-mates' padding (to reproduce "
      "fairseq's training)")
  dropout: float = setting(0.1, "dropout after attention, FFN and embeddings")
  attention_dropout: float = setting(0.1, "dropout of the attention weights")
  activation_dropout: float = setting(0.1, "dropout inside the FFN")
  kernel_redraw: str = setting(
      "fixed", "kernel heads' random features: 'fixed' (from kernel_seed) or 'step' (redrawn "
      "every step)")
  kernel_seed: int = setting(0, "the kernel heads' random features' seed")
  local_block_size: int = setting(0, "local heads: query block size, 0 = automatic")
  key_block_size: int = setting(
      AUTO, "full/conv heads: exact softmax over blocks of this many keys, recomputed in the "
      "backward (O(n x block) memory); 0 = one dense softmax; -1 = by backend: 512 on CPU "
      "(faster there too), 0 on GPU/TPU (faster there: docs/benchmarks.md)")
  ffn_token_chunk: int = setting(
      AUTO, "encoder FFN computed this many tokens at a time, the hidden layer recomputed in "
      "the backward (less memory); 0 = unchunked (the faster); -1 = by backend: 0 everywhere")
  attention_implementation: str = setting(
      "auto", "full/conv heads on a GPU in bfloat16: 'auto' = cuDNN's fused attention where "
      "no attention dropout is active, our Pallas kernel with the dropout inside where it is, "
      "our softmax elsewhere; 'xla' = always ours; 'cudnn' / 'flash' = that kernel or an "
      "error. Local and kernel heads on a CPU: C++ kernels (docs/kernels.md), unless 'xla'")
  qkv_bias: bool = setting(True, "bias in the q/k/v projections (fairseq: yes; thesis code: no)")
  attention_init: str = setting(
      "fairseq", "encoder self-attention projections' initialisation: 'fairseq' (its "
      "MultiheadAttention: Xavier-uniform, q/k/v with gain 1/sqrt(2), W_o's bias 0) | 'pytorch' "
      "(nn.Linear's default, U(+-1/sqrt(d)) weights and biases: the thesis's code)")
  semantics: str = setting(
      "exact", "'exact': heads mask padding exactly, local windows are centred | 'thesis': the "
      "whole model computes what the thesis's code computes (docs/thesis_semantics.md): every "
      "local/kernel/conv head in its thesis form (model/layout.py), and qkv_bias=False, "
      "attention_init='pytorch', subsampler_masks_padding=False whatever those keys say")
  dtype: str = setting(
      "auto", "compute dtype: float32 | bfloat16 (parameters stay float32) | auto: bfloat16 "
      "on a GPU or TPU, float32 on a CPU")
  max_target_positions: int = setting(1024, "the decoder's positions (targets are cut to one "
                                      "fewer, for EOS)")
  # Multilingual / multi-domain models (Gong et al. 2022; model/head_selection.py).
  task_tag: str = setting(
      "", "what a task is, a tag of the data: source_lang | target_lang | domain | pair "
      "('' = one task)")
  encoder_task_tag: str = setting("", "the encoder's task tag ('' = task_tag; the paper: "
                                  "source_lang)")
  decoder_task_tag: str = setting("", "the decoder's task tag ('' = task_tag; the paper: "
                                  "target_lang)")
  num_tasks: int = derived(1, "tasks of a stack whose count is not given below")
  encoder_num_tasks: int = derived(0, "the encoder's tasks, from the training data "
                                   "(0 = num_tasks)")
  decoder_num_tasks: int = derived(0, "the decoder's tasks, from the training data "
                                   "(0 = num_tasks)")
  encoder_candidates: int = setting(
      0, "H' candidate heads per encoder layer, encoder_heads of them used (the layout then "
      "lists the H' candidates); 0 = no head selection")
  decoder_candidates: int = setting(0, "H' candidates in decoder self-attention (0 = none)")
  selection_strategy: str = setting("group", "subset | group")
  selection_temperature: float = setting(
      5.0, "Gumbel-sigmoid temperature (train.selection_temperature_* anneal it)")
  selection_inference: str = setting(
      "deterministic", "or 'noisy': the reference's sampling at inference")
  selection_subset_order: str = setting(
      "candidate", "the subset strategy's W_o slots: 'candidate' (the selected heads in "
      "candidate order) | 'score' (by score, highest first: the reference's, so its "
      "checkpoints import)")
  adapter_dim: int = setting(0, "per-task adapters after every layer (the paper's baseline); "
                             "0 = none")
  ctc_head: bool = derived(False, "a linear CTC projection of the encoder output (where the "
                           "stage's ctc_weight > 0)")
  ctc_vocab_size: int = derived(
      0, "0: the CTC head spells the decoder's vocabulary; > 0: the size of another one (ST's "
      "CTC on the source transcript in the ASR vocabulary)")
  text_encoder_layers: int = derived(
      0, "> 0: full-attention layers stacked on the encoder, fed the CTC head's distribution "
      "over source pieces (stacked.py)")
  bos_id: int = derived(BOS_ID, "the vocabularies' specials (multiformer_common.token_ids)")
  pad_id: int = derived(PAD_ID, "")
  eos_id: int = derived(EOS_ID, "")
  unk_id: int = derived(UNK_ID, "")

  def __post_init__(self):
    # Normalise sequences (ConfigDicts hold lists) so the dataclass stays hashable.
    for name in ("conv_kernels", "conv_strides"):
      object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
    if self.semantics == "thesis":
      for name, value in THESIS_SETTINGS.items():
        object.__setattr__(self, name, value)
    self.validate()

  def validate(self):
    if self.dtype not in (*COMPUTE_DTYPES, "auto"):
      raise ConfigError(f"model.dtype={self.dtype!r}; valid: {sorted(COMPUTE_DTYPES)} or "
                        f"'auto' (bfloat16 on a GPU or TPU, float32 on a CPU)")
    if self.attention_implementation not in IMPLEMENTATIONS:
      raise ConfigError(f"model.attention_implementation={self.attention_implementation!r}; "
                        f"valid: {IMPLEMENTATIONS}")
    if self.semantics not in SEMANTICS:
      raise ConfigError(f"model.semantics={self.semantics!r}; valid: {SEMANTICS}")
    if self.attention_init not in ATTENTION_INITS:
      raise ConfigError(f"model.attention_init={self.attention_init!r}; valid: "
                        f"{ATTENTION_INITS}")
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
    thesis_kernels = [kind for layer in self.layout for kind in layout_lib.layer_head_kinds(layer)
                      if isinstance(kind, layout_lib.KernelHeads) and kind.thesis]
    if thesis_kernels and self.kernel_redraw != "fixed":
      raise ConfigError(
          f"model.kernel_redraw={self.kernel_redraw!r} with {thesis_kernels[0]} heads: their "
          f"features are a weight of the model, drawn once (performer-pytorch's FastAttention "
          f"as the thesis's code used it); use kernel_redraw='fixed'")

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
    if self.selection_subset_order not in SUBSET_ORDERS:
      raise ConfigError(f"model.selection_subset_order={self.selection_subset_order!r}; valid: "
                        f"{SUBSET_ORDERS}")
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
    """The encoder's heads, parsed and validated; with semantics='thesis' in their thesis
    forms."""
    layout = self._parsed_layout()
    return layout_lib.thesis_layout(layout) if self.semantics == "thesis" else layout

  def _parsed_layout(self) -> layout_lib.Layout:
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
    typed = settings.typed_values(cls, dict(values.items()), "model", fields)
    return cls(**typed)

  def to_dict(self) -> dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _resolve(value: int, cpu_value: int) -> int:
  if value != AUTO:
    return value
  return cpu_value if jax.default_backend() == "cpu" else 0


def config_defaults() -> dict[str, Any]:
  """{field: default} of the fields a config sets: the model.* keys of an experiment."""
  return settings.config_defaults(ModelConfig)
