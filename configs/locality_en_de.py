"""The efficient model of Alastruey et al. 2022 (locality of attention), MuST-C En-De.

Full attention in encoder layers 1-3, local attention in layers 4-12 with the per-layer
windows chosen by the contribution analysis (Algorithm 1): 5, 5, 9, 13, 11, 15, 19, 17, 21.
Otherwise fairseq's s2t_transformer_s and its recipe (configs/s2t_transformer_s.py, App. C:
40000 frames x update_freq 8).

Run:   python run.py --config=configs/locality_en_de.py --workdir=runs/locality_en_de \
           --config.data.root=/data/MUSTC_v1.0
Expected (BLEU, mean over 5 seeds, tst-COMMON): 22.49 (s2t_transformer_s baseline 22.53).
"""

from configs import s2t_transformer_s
from multiformer_jax import schema

WINDOWS = (5, 5, 9, 13, 11, 15, 19, 17, 21)  # encoder layers 4..12


def layout(windows) -> str:
  """3x(4*full) 1x(4*local(w4)) ... 1x(4*local(w12))."""
  return "3x(4*full) " + " ".join(f"1x(4*local({w}))" for w in windows)


def get_config(arg=None, pair="en-de", windows=WINDOWS, reported_bleu=22.49):
  """s2t_transformer_s's experiment on MuST-C `pair` with the local windows `windows`."""
  config = s2t_transformer_s.get_config()
  config.name = f"locality_{pair.replace('-', '_')}"
  config.model.encoder_layout = layout(windows)
  config.data.pairs = pair
  config.data.prepared_dir = f"data/prepared/mustc_{pair.replace('-', '_')}"
  config.reported.bleu, config.reported.wer = reported_bleu, -1.0
  config.reported.source = f"Alastruey et al. 2022, MuST-C {pair} tst-COMMON (mean of 5 seeds)"
  return schema.apply_arg(config, arg)
