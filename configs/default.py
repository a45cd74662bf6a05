"""The default configuration: every key, documented. Experiments override a few of them.

Every experiment file defines `get_config(arg=None)`; `arg` is the text after ':' in
`--config=configs/file.py:arg`, a comma-separated list of variant flags and key=value pairs,
e.g. `configs/s2t_v2.py:runlocal` (the tiny CPU variant of the experiment).
"""

import ml_collections

# The thesis's Local(64): each token attends to the 64/2 = 32 tokens on each side.
THESIS_LOCAL = "local(65)"


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.name = "default"
  # What the paper reports for this architecture (MuST-C tst-COMMON), for results tables.
  config.reported = ml_collections.ConfigDict({"bleu": -1.0, "wer": -1.0, "source": ""})

  # --- model: every field of multiformer_jax.model_config.ModelConfig ---------------------
  m = config.model = ml_collections.ConfigDict()
  m.vocab_size = 8000          # target vocabulary incl. the 4 fairseq specials (set by data)
  m.input_dim = 80             # fbank channels
  m.d_model = 256              # embedding / attention width
  m.ffn_dim = 2048             # feed-forward hidden width
  m.encoder_layers = 12
  m.decoder_layers = 6
  m.encoder_heads = 4          # heads per encoder layer (the layout's heads must sum to it)
  m.decoder_heads = 4
  # Head layout of the encoder, thesis notation (multiformer_jax/layout.py):
  # full | local(w[,d]) | kernel[(m)] | conv[(k,s[,type])], e.g. 12x(2*local(65)+2*conv(5,2)).
  m.encoder_layout = "12x(4*full)"
  m.conv_kernels = (5, 5)      # subsampler Conv1d kernels, one per layer
  m.conv_strides = (2, 2)      # subsampler strides; (1, 1) = no downsampling (thesis App. B)
  m.conv_channels = 1024       # subsampler hidden channels (before GLU)
  m.dropout = 0.1
  m.attention_dropout = 0.1
  m.activation_dropout = 0.1
  m.kernel_redraw = "fixed"    # kernel heads: 'fixed' (from kernel_seed) or 'step' (each step)
  m.kernel_seed = 0
  m.local_block_size = 0       # local heads: query block size, 0 = automatic
  m.qkv_bias = True            # bias in the q/k/v projections (fairseq: yes; thesis code: no)
  m.dtype = "float32"          # compute dtype: float32 | bfloat16 (params stay float32)
  m.max_target_positions = 1024
  m.bos_id = 0                 # fairseq dictionary specials
  m.pad_id = 1
  m.eos_id = 2
  m.unk_id = 3

  return apply_arg(config, arg)


def runlocal(config):
  """Shrinks an experiment to a CPU-sized model with the same head-layout structure."""
  m = config.model
  m.d_model, m.ffn_dim, m.conv_channels = 64, 128, 128
  m.decoder_layers = 2
  return config


VARIANTS = {"runlocal": runlocal}


def apply_arg(config, arg):
  """Applies `arg` ('runlocal', 'model.dropout=0.3', ... comma-separated) to `config`."""
  for item in filter(None, (arg or "").split(",")):
    item = item.strip()
    if "=" in item:
      key, value = item.split("=", 1)
      node = config
      *path, leaf = key.strip().split(".")
      for part in path:
        node = node[part]
      node[leaf] = _parse_value(node[leaf], value.strip(), key)
    elif item in VARIANTS:
      config = VARIANTS[item](config)
    else:
      raise ValueError(f"unknown config variant {item!r}; valid: {sorted(VARIANTS)} or "
                       f"key=value")
  return config


def _parse_value(current, text, key):
  """`text` converted to the type of the current value (tuples written as 5:5)."""
  if isinstance(current, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"config {key}={text!r}: expected true or false")
    return text.lower() in ("true", "1")
  if isinstance(current, (tuple, list)):
    return tuple(int(v) for v in text.split(":"))
  try:
    return type(current)(text)
  except ValueError:
    raise ValueError(f"config {key}={text!r}: expected a {type(current).__name__} like "
                     f"{current!r}") from None


def multiformer(name, layout, reported_bleu, reported_wer=-1.0, arg=None, **model):
  """A thesis architecture (Sant 2022, Table 1): s2t_transformer_s with a Multiformer encoder.

  The thesis code has no bias in the q/k/v projection; everything else is s2t_transformer_s.
  """
  config = get_config()
  config.name = name
  config.model.encoder_layout = layout
  config.model.qkv_bias = False
  config.model.update(model)
  config.reported.bleu = reported_bleu
  config.reported.wer = reported_wer
  config.reported.source = "Sant 2022 (Multiformer thesis), MuST-C En-De tst-COMMON"
  return apply_arg(config, arg)
