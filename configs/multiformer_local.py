"""Thesis architecture 3, `s2t_multiformer_s_local` (Sant 2022, Table 1).

Encoder: 12x(4xLocal(64))
Layout:  12x(4*local(65))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2;
Local(64) attends to 32 tokens on each side, i.e. local(65).)

Reported (MuST-C En-De tst-COMMON): BLEU 22.0; ASR WER 14.00 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_local.py --workdir=runs/multiformer_local
Tiny: python run.py --config=configs/multiformer_local.py:runlocal
      --workdir=runs/multiformer_local_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "12x(4*local(65))"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s_local"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 22.0, 14.0
  return schema.apply_arg(config, arg)
