"""Thesis architecture 12, `s2t_multiformer_s_v4` (Sant 2022, Table 1).

Encoder: 6x(1xLocal(64) + 3xConv(5,2)) + 3x(2xLocal(64) + 2xConv(5,2)) + 3x(3xLocal(64) +
         1xConv(5,2))
Layout:  6x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2)) 3x(3*local(65)+1*conv(5,2))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2;
Local(64) attends to 32 tokens on each side, i.e. local(65).)

Reported (MuST-C En-De tst-COMMON): BLEU 22.28; ASR WER 13.50 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_v4.py --workdir=runs/multiformer_v4
Tiny: python run.py --config=configs/multiformer_v4.py:runlocal --workdir=runs/multiformer_v4_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "6x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2)) 3x(3*local(65)+1*conv(5,2))"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s_v4"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 22.28, 13.5
  return schema.apply_arg(config, arg)
