"""Thesis architecture 9, `s2t_multiformer_s` (Sant 2022, Table 1).

Encoder: 2x(4xConv(5,2)) + 6x(2xLocal(64) + 2xConv(5,2)) + 4x(2xFull + 2xConv(7,3))
Layout:  2x(4*conv(5,2)) 6x(2*local(65)+2*conv(5,2)) 4x(2*full+2*conv(7,3))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2;
Local(64) attends to 32 tokens on each side, i.e. local(65).)

Reported (MuST-C En-De tst-COMMON): BLEU 22.42; ASR WER 13.60 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_s.py --workdir=runs/multiformer_s
Tiny: python run.py --config=configs/multiformer_s.py:runlocal --workdir=runs/multiformer_s_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "2x(4*conv(5,2)) 6x(2*local(65)+2*conv(5,2)) 4x(2*full+2*conv(7,3))"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 22.42, 13.6
  return schema.apply_arg(config, arg)
