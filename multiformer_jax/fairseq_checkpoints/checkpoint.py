"""Import of fairseq S2T checkpoints into this model: the s2t_transformer family, fairseq's
head_selection_s2t_transformer (examples/attention_head_selection) and the thesis's
s2t_multiformer family (thesis.py).

fairseq's published MuST-C models can then be evaluated and analysed here. The mapping is
pure numpy; a `.pt` file is read by safe_pickle.py (no torch, no code run from the file).

One deliberate difference remains with fairseq's own forward pass, only for padded batches:
this subsampler re-zeroes padded frames between its convolutions (fairseq's output depends on
what an utterance is batched with); model.subsampler_masks_padding=False computes fairseq's.
For an unpadded utterance the encoder outputs and decoder logits equal fairseq's.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_jax.fairseq_checkpoints import safe_pickle, thesis
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.model.attention.multi import group_name
from multiformer_jax.model.model_config import ModelConfig

HEAD_SELECTION_ARCH = "head_selection_s2t_transformer"
# What a task is, by its --task-type (speech_to_text_head_selection: each stack's task ids are
# the sorted source / target languages, or the sorted domains, of the training subsets'
# names): this model's task tag of each stack.
HEAD_SELECTION_TASK_TAGS = {"lang": {"encoder": "source_lang", "decoder": "target_lang"},
                            "domain": {"encoder": "domain", "decoder": "domain"}}
# Where its state dict keeps each stack's selection logits.
SELECTOR_LOGITS = {"encoder": "encoder.attn_head_selector.head_logits",
                   "decoder": "decoder.self_attn_head_selector.head_logits"}
# Buffers, and the fused copies fairseq 0.12 keeps beside each encoder layer's weights for its
# "BetterTransformer" fast path (in_proj_weight = cat(q, k, v), fc1_weight = fc1.weight, ...).
_IGNORED = re.compile(r".*(_float_tensor|version|\.(in_proj|out_proj|fc1|fc2)_(weight|bias))$")


class FairseqImportError(InvalidValue):
  """A checkpoint that is not an importable fairseq S2T Transformer."""


def _arg(args: Mapping[str, Any], name: str, default):
  value = args.get(name, default)
  return default if value is None else value


def model_config_from_fairseq(args: Mapping[str, Any], state_dict: Mapping[str, np.ndarray],
                              **overrides) -> ModelConfig:
  """The ModelConfig of a fairseq checkpoint from its model args and weights."""
  arch = str(args.get("arch", "s2t_transformer"))
  if not arch.startswith(("s2t_transformer", HEAD_SELECTION_ARCH)) and \
      arch not in thesis.THESIS_ARCHS:
    raise FairseqImportError(
        f"checkpoint architecture {arch!r} is not importable; supported: the s2t_transformer "
        f"family (s2t_transformer_s, _m, _l, ...), fairseq's {HEAD_SELECTION_ARCH}(_s) and "
        f"the thesis's s2t_multiformer family ({', '.join(thesis.THESIS_ARCHS)})")
  heads = int(_arg(args, "encoder_attention_heads", 4))
  encoder_layers = int(_arg(args, "encoder_layers", 12))
  kernels = _ints(_arg(args, "conv_kernel_sizes", "5,5"), "conv-kernel-sizes")
  strides = (2,) * len(kernels)
  layout = f"{encoder_layers}x({heads}*full)"
  thesis_values = {}
  if arch in thesis.THESIS_ARCHS:
    layers, kernels, strides = _thesis_encoder(args, state_dict)
    encoder_layers, heads = len(layers), sum(g.num_heads for g in layers[0])
    layout = layout_lib.format_layout(layers)
    # Also sets qkv_bias, attention_init and subsampler_masks_padding (THESIS_SETTINGS).
    thesis_values = {"semantics": "thesis"}
  values = dict(
      vocab_size=int(state_dict["decoder.embed_tokens.weight"].shape[0]),
      input_dim=int(_arg(args, "input_feat_per_channel", 80)) *
      int(_arg(args, "input_channels", 1)),
      d_model=int(_arg(args, "encoder_embed_dim", 256)),
      ffn_dim=int(_arg(args, "encoder_ffn_embed_dim", 2048)),
      encoder_layers=encoder_layers,
      decoder_layers=int(_arg(args, "decoder_layers", 6)),
      encoder_heads=heads,
      decoder_heads=int(_arg(args, "decoder_attention_heads", 4)),
      encoder_layout=layout,
      conv_kernels=kernels,
      conv_strides=strides,
      conv_channels=int(_arg(args, "conv_channels", 1024)),
      dropout=float(_arg(args, "dropout", 0.1)),
      attention_dropout=float(_arg(args, "attention_dropout", 0.1)),
      activation_dropout=float(_arg(args, "activation_dropout", 0.1)),
      qkv_bias=True,
      dtype="float32",     # fairseq's outputs, on every backend (fairseq evaluates in float32)
  )
  if int(_arg(args, "decoder_ffn_embed_dim", values["ffn_dim"])) != values["ffn_dim"]:
    raise FairseqImportError("encoder and decoder FFN widths differ; this model uses one ffn_dim")
  if not _arg(args, "encoder_normalize_before", True) or \
      not _arg(args, "decoder_normalize_before", True):
    raise FairseqImportError("only pre-LN (normalize_before) S2T Transformers are importable")
  if _arg(args, "share_decoder_input_output_embed", False):
    raise FairseqImportError("tied decoder embeddings are not supported (s2t_transformer "
                             "does not tie them)")
  values.update(thesis_values)
  if arch.startswith(HEAD_SELECTION_ARCH):
    values.update(_head_selection_values(args, state_dict, encoder_layers, heads))
  values.update(overrides)
  return ModelConfig(**values)


def _head_selection_values(args, state_dict, encoder_layers: int, heads: int) -> dict:
  """The ModelConfig values of fairseq's examples/attention_head_selection model."""
  if _arg(args, "dec_enc_attn_head_select", False):
    raise FairseqImportError("--dec-enc-attn-head-select: head selection in the decoder's "
                             "encoder attention is not implemented here (encoder and decoder "
                             "self-attention are)")
  values = {"selection_strategy": str(_arg(args, "attn_head_select_strategy", "group")),
            "selection_subset_order": "score"}
  task_type = str(_arg(args, "task_type", "lang"))
  if task_type not in HEAD_SELECTION_TASK_TAGS:
    raise FairseqImportError(f"--task-type {task_type!r}; speech_to_text_head_selection's are "
                             f"{', '.join(HEAD_SELECTION_TASK_TAGS)}")
  for side, flag, total in (("encoder", "encoder_attn_head_select",
                             "total_encoder_attention_heads"),
                            ("decoder", "decoder_self_attn_head_select",
                             "total_decoder_attention_heads")):
    if not _arg(args, flag, False):
      continue
    logits = state_dict.get(SELECTOR_LOGITS[side])
    if logits is None:
      raise FairseqImportError(f"--{flag.replace('_', '-')} but no {side} head_logits in the "
                               f"checkpoint")
    values[f"{side}_candidates"] = int(_arg(args, total, 8))
    values[f"{side}_num_tasks"] = int(logits.shape[0])
    values[f"{side}_task_tag"] = HEAD_SELECTION_TASK_TAGS[task_type][side]
  values["num_tasks"] = max(values.get("encoder_num_tasks", 1), values.get("decoder_num_tasks", 1))
  if "encoder_candidates" in values:
    values["encoder_layout"] = f"{encoder_layers}x({values['encoder_candidates']}*full)"
  return values


def _ints(text, name: str) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in str(text).split(",") if v.strip())
  except ValueError:
    raise FairseqImportError(f"--{name} {text!r} is not a comma-separated list of integers")


def _thesis_encoder(args, state_dict):
  """(layout, subsampler kernels, strides) of an s2t_multiformer checkpoint."""
  if not args.get("arg_supremo"):
    raise FairseqImportError(f"checkpoint architecture {args.get('arch')!r} without "
                             f"'arg_supremo': cannot tell its encoder's heads")
  kernels = _ints(args.get("conv_ks", ""), "conv-ks")
  strides = _ints(args.get("conv_strides", ""), "conv-strides")
  if not kernels or len(kernels) != len(strides):
    raise FairseqImportError(
        f"--conv-ks {args.get('conv_ks')!r} and --conv-strides {args.get('conv_strides')!r}: "
        f"this model needs a conv subsampler of at least one layer, one stride per kernel (the "
        f"thesis's Identity2D, no subsampler, is not supported)")
  layers_present = 1 + max((int(k.split(".")[2]) for k in state_dict
                            if k.startswith("encoder.transformer_layers.")), default=-1)
  fast_features = {int(k.split(".")[2]): v.shape[0] for k, v in state_dict.items()
                   if k.startswith("encoder.transformer_layers.")
                   and k.endswith(".projection_matrix")}
  try:
    layers = thesis.thesis_layout(str(args["arg_supremo"]), fast_features)
  except thesis.ArgSupremoError as e:
    raise FairseqImportError(str(e)) from None
  if len(layers) != layers_present:
    raise FairseqImportError(f"--arg-supremo describes {len(layers)} encoder layers, the "
                             f"checkpoint's weights {layers_present}")
  counts = {sum(g.num_heads for g in layer) for layer in layers}
  if len(counts) != 1:
    raise FairseqImportError(f"the encoder layers have different head counts {sorted(counts)}; "
                             f"this model has one head count (and head_dim) for every layer")
  return layers, kernels, strides


def _linear(sd, prefix):
  out = {"kernel": np.asarray(sd[f"{prefix}.weight"]).T}        # torch [out, in] -> [in, out]
  if f"{prefix}.bias" in sd:
    out["bias"] = np.asarray(sd[f"{prefix}.bias"])
  return out


def _layer_norm(sd, prefix):
  return {"scale": np.asarray(sd[f"{prefix}.weight"]), "bias": np.asarray(sd[f"{prefix}.bias"])}


def _attention(sd, prefix):
  return {n: _linear(sd, f"{prefix}.{n}") for n in ("q_proj", "k_proj", "v_proj", "out_proj")}


def _conv(sd, prefix):
  """A torch Conv1d [out, in, k] -> flax's [k, in, out] (a depthwise one: [k, 1, channels])."""
  return {"kernel": np.transpose(sd[f"{prefix}.weight"], (2, 1, 0)), "bias": sd[f"{prefix}.bias"]}


def _thesis_attention(sd, prefix, layer, config):
  """The thesis's MultiheadMultiAttention (wq/wk/wv without bias, wo, `attentions.j`) -> this
  model's self-attention of `layer`, heads moved from the thesis's channel order to the
  layout's (thesis.py)."""
  head_dim = config.d_model // config.encoder_heads
  heads, modules = thesis.thesis_head_order(layer)
  params = {}
  for ours, theirs in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv")):
    if f"{prefix}.{theirs}.bias" in sd:
      raise FairseqImportError(f"{prefix}.{theirs} has a bias; the thesis's projections have none")
    params[ours] = {"kernel": thesis.head_rows(sd[f"{prefix}.{theirs}.weight"], heads, head_dim,
                                               axis=0).T}
  params["out_proj"] = {"kernel": thesis.head_rows(sd[f"{prefix}.wo.weight"], heads, head_dim,
                                                   axis=1).T,
                        "bias": sd[f"{prefix}.wo.bias"]}
  for g, (group, module) in enumerate(zip(layer, modules)):
    p = f"{prefix}.attentions.{module}"
    kind = group.kind
    if isinstance(kind, layout_lib.KernelHeads):
      params[group_name(g, kind)] = {"projection": sd[f"{p}.projection_matrix"]}
    elif isinstance(kind, layout_lib.ConvHeads):
      conv = {}
      for name in ("conv_k", "conv_v"):
        if kind.conv_type == "separable":
          conv[name] = {"conv": _conv(sd, f"{p}.{name}.0"), "pointwise": _conv(sd, f"{p}.{name}.1")}
        else:
          conv[name] = {"conv": _conv(sd, f"{p}.{name}")}
      params[group_name(g, kind)] = conv
  return params


def _ffn(sd, prefix):
  return {"fc1": _linear(sd, f"{prefix}.fc1"), "fc2": _linear(sd, f"{prefix}.fc2")}


def _shared_selector(sd, name: str, layers: str, num_layers: int):
  """A head-selection stack's logits, which fairseq's state dict also lists under every
  layer's attention (one shared module): the copies must be the same."""
  logits = sd[name]
  for i in range(num_layers):
    copy = f"{layers}.{i}.self_attn.attn_head_selector.head_logits"
    # Reading the copy (sd[copy]) also marks it used.
    if copy in sd and not np.array_equal(sd[copy], logits):
      raise FairseqImportError(f"{copy} differs from {name}; fairseq shares one selector")
  return logits


def convert_state_dict(state_dict: Mapping[str, Any], config: ModelConfig) -> dict:
  """fairseq state dict (arrays) -> this model's params; every fairseq weight is used once."""
  sd = {k: np.asarray(v, np.float32) for k, v in state_dict.items() if not _IGNORED.match(k)}
  used = set()

  class Tracking(dict):
    def __getitem__(self, key):
      if key not in sd:
        raise FairseqImportError(f"fairseq weight {key!r} missing from the checkpoint")
      used.add(key)
      return sd[key]

    def __contains__(self, key):
      return key in sd
  t = Tracking()

  subsample = {}
  for i in range(len(config.conv_kernels)):
    prefix = f"encoder.subsample.conv_layers.{i}"
    subsample[f"conv_layers_{i}"] = _conv(t, prefix)
  encoder = {"subsample": subsample, "layer_norm": _layer_norm(t, "encoder.layer_norm")}
  if config.encoder_candidates:
    encoder["head_selector"] = {"logits": _shared_selector(
        t, SELECTOR_LOGITS["encoder"], "encoder.transformer_layers",
        config.encoder_layers)}
  for i in range(config.encoder_layers):
    p = f"encoder.transformer_layers.{i}"
    is_thesis = f"{p}.self_attn.wq.weight" in t
    encoder[f"layers_{i}"] = {
        "self_attn": (_thesis_attention(t, f"{p}.self_attn", config.layout[i], config)
                      if is_thesis else _attention(t, f"{p}.self_attn")),
        "self_attn_layer_norm": _layer_norm(t, f"{p}.self_attn_layer_norm"),
        "final_layer_norm": _layer_norm(t, f"{p}.final_layer_norm"),
        "ffn": _ffn(t, p)}
  decoder = {"embed_tokens": {"embedding": t["decoder.embed_tokens.weight"]},
             "layer_norm": _layer_norm(t, "decoder.layer_norm"),
             "output_projection": {"kernel": t["decoder.output_projection.weight"].T}}
  if config.decoder_candidates:
    decoder["head_selector"] = {"logits": _shared_selector(
        t, SELECTOR_LOGITS["decoder"], "decoder.layers",
        config.decoder_layers)}
  for i in range(config.decoder_layers):
    p = f"decoder.layers.{i}"
    decoder[f"layers_{i}"] = {
        "self_attn": _attention(t, f"{p}.self_attn"),
        "self_attn_layer_norm": _layer_norm(t, f"{p}.self_attn_layer_norm"),
        "encoder_attn": _attention(t, f"{p}.encoder_attn"),
        "encoder_attn_layer_norm": _layer_norm(t, f"{p}.encoder_attn_layer_norm"),
        "final_layer_norm": _layer_norm(t, f"{p}.final_layer_norm"),
        "ffn": _ffn(t, p)}
  unused = sorted(set(sd) - used)
  if unused:
    raise FairseqImportError(f"fairseq weights not understood by this model: {unused[:8]}"
                             f"{' ...' if len(unused) > 8 else ''}")
  return {"encoder": encoder, "decoder": decoder}


def _as_dict(value) -> dict:
  """A fairseq config node as a dict: a Mapping or omegaconf DictConfig (`items`) or an
  argparse Namespace (`vars`)."""
  if hasattr(value, "items"):
    return dict(value.items())
  return dict(vars(value))


def fairseq_model_args(checkpoint: Mapping[str, Any], path: str) -> dict:
  """The model arguments of a loaded fairseq checkpoint: `cfg['model']` (fairseq >= 0.10) or
  `args` (older), each a dict, DictConfig or Namespace."""
  if checkpoint.get("cfg") is not None:
    cfg = checkpoint["cfg"]
    model = cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None)
    if model is not None:
      return _as_dict(model)
  if checkpoint.get("args") is not None:
    return _as_dict(checkpoint["args"])
  raise FairseqImportError(f"{path} has neither 'cfg' with a 'model' section nor 'args': "
                           f"cannot tell its architecture")


def read_fairseq_checkpoint(path: str, trust_pickle: bool = False):
  """Reads a fairseq `.pt` checkpoint -> (model args, state dict of arrays, the update count
  or 0): built from what fairseq checkpoints hold only, refusing anything else
  (safe_pickle.py; no torch needed); with `trust_pickle`, fully unpickled by torch, running
  whatever code it names."""
  checkpoint = safe_pickle.load_unsafe(path) if trust_pickle else safe_pickle.load(path)
  if not isinstance(checkpoint, dict) or "model" not in checkpoint:
    raise FairseqImportError(f"{path} has no 'model' weights; it holds "
                             f"{sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__}")
  state_dict = {k: np.asarray(v, np.float32) for k, v in checkpoint["model"].items()}
  checkpoint = {k: safe_pickle.plain(checkpoint.get(k))
                for k in ("cfg", "args", "optimizer_history")}
  args = fairseq_model_args(checkpoint, path)
  history = checkpoint.get("optimizer_history") or [{}]
  updates = int(history[-1].get("num_updates", 0) or 0) if isinstance(history[-1], dict) else 0
  return args, state_dict, updates


def load_fairseq_checkpoint(path: str, trust_pickle: bool = False, **overrides):
  """Reads a fairseq `.pt` checkpoint (read_fairseq_checkpoint) -> (ModelConfig, params, the
  update count or 0)."""
  args, state_dict, updates = read_fairseq_checkpoint(path, trust_pickle)
  config = model_config_from_fairseq(args, state_dict, **overrides)
  return config, convert_state_dict(state_dict, config), updates


def head_selection_tasks(args: Mapping[str, Any]) -> dict[str, tuple[str, ...]] | None:
  """{'encoder' | 'decoder': task names in id order} of a head-selection checkpoint whose args
  name its training subsets (--train-subset train_SRC_TGT_DOMAIN,...), as
  speech_to_text_head_selection numbers them; None when they are not recorded."""
  subsets = args.get("train_subset")
  if not str(args.get("arch", "")).startswith(HEAD_SELECTION_ARCH) or not subsets:
    return None
  fields = []
  for subset in str(subsets).split(","):
    parts = subset.strip().split("_")
    if len(parts) != 4:
      raise FairseqImportError(f"--train-subset {subset!r} is not split_src_tgt_domain, the "
                               f"form speech_to_text_head_selection reads task ids from")
    fields.append(parts[1:])
  by_tag = {"source_lang": sorted({f[0] for f in fields}),
            "target_lang": sorted({f[1] for f in fields}),
            "domain": sorted({f[2] for f in fields})}
  tags = HEAD_SELECTION_TASK_TAGS[str(_arg(args, "task_type", "lang"))]
  return {side: tuple(by_tag[tag]) for side, tag in tags.items()}
