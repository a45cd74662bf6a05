"""Thesis architecture 2, `s2t_multiformer_s_fast` (Sant 2022, Table 1).

Encoder: 12x(4xFast)
Layout:  12x(4*kernel(266))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2.)

Fast = Performer FAVOR+; the thesis code used performer-pytorch's default int(64 ln 64) = 266
features, drawn once (kernel_redraw="fixed").

Reported (MuST-C En-De tst-COMMON): BLEU 20.28; ASR WER 16.16 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_fast.py --workdir=runs/multiformer_fast
Tiny: python run.py --config=configs/multiformer_fast.py:runlocal
      --workdir=runs/multiformer_fast_tiny
"""

from configs import s2t_v2
from multiformer_jax import schema

LAYOUT = "12x(4*kernel(266))"


def get_config(arg=None):
  """The thesis's experiment (configs/s2t_v2.py) with this encoder layout."""
  config = s2t_v2.get_config()
  config.name = "s2t_multiformer_s_fast"
  config.model.encoder_layout = LAYOUT
  config.reported.bleu, config.reported.wer = 20.28, 16.16
  return schema.apply_arg(config, arg)
