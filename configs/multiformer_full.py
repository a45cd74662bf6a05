"""Thesis architecture 1, `s2t_multiformer_s_full` (Sant 2022, Table 1).

Encoder: 12x(4xFull)
Layout:  12x(4*full)
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2.)

Reported (MuST-C En-De tst-COMMON): BLEU 22.2; ASR WER 13.47 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_full.py --workdir=runs/multiformer_full
Tiny: python run.py --config=configs/multiformer_full.py:runlocal
      --workdir=runs/multiformer_full_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "12x(4*full)"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s_full"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 22.2, 13.47
  return schema.apply_arg(config, arg)
