"""Thesis architecture 5, `s2t_multiformer_s_conv_7_3` (Sant 2022, Table 1).

Encoder: 12x(4xConv(7,3))
Layout:  12x(4*conv(7,3))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2.)

Reported (MuST-C En-De tst-COMMON): BLEU 21.91; ASR WER 13.86 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_conv_7_3.py --workdir=runs/multiformer_conv_7_3
Tiny: python run.py --config=configs/multiformer_conv_7_3.py:runlocal
      --workdir=runs/multiformer_conv_7_3_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "12x(4*conv(7,3))"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s_conv_7_3"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 21.91, 13.86
  return schema.apply_arg(config, arg)
