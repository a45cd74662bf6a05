"""Thesis architecture 4, `s2t_multiformer_s_conv_5_2` (Sant 2022, Table 1).

Encoder: 12x(4xConv(5,2))
Layout:  12x(4*conv(5,2))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2.)

Reported (MuST-C En-De tst-COMMON): BLEU 22.36; ASR WER 13.58 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_conv_5_2.py --workdir=runs/multiformer_conv_5_2
Tiny: python run.py --config=configs/multiformer_conv_5_2.py:runlocal
      --workdir=runs/multiformer_conv_5_2_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "12x(4*conv(5,2))"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s_conv_5_2"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 22.36, 13.58
  return schema.apply_arg(config, arg)
