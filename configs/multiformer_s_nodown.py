"""`s2t_multiformer_s (no downsampling)` (Sant 2022, Appendix B): the conv subsampler keeps its two
convolutions but with stride 1, so the encoder sees every 10 ms frame (4x longer sequences).

Layout: 2x(4*conv(5,2)) 6x(2*local(65)+2*conv(5,2)) 4x(2*full+2*conv(7,3))
The thesis trained it with max 5000 frames x update_freq 64 and lost many batches to
out-of-memory on an 11 GB RTX 2080 Ti (about 410 h per model).

Reported (MuST-C En-De tst-COMMON, App. B Table 5): BLEU 22.15; ASR WER 13.83.
(s2t_transformer_s without downsampling: WER 13.76, BLEU 22.31.)

Run:  python run.py --config=configs/multiformer_s_nodown.py --workdir=runs/multiformer_s_nodown
"""

from configs import multiformer_s
from multiformer_jax import schema


def get_config(arg=None):
  """configs/multiformer_s.py's experiment without downsampling (schema.no_downsampling)."""
  config = multiformer_s.get_config()
  config.name = "s2t_multiformer_s (no downsampling)"
  schema.no_downsampling(config)
  config.reported.bleu, config.reported.wer = 22.15, 13.83
  config.reported.source = ("Sant 2022 (Multiformer thesis), App. B Table 5, MuST-C En-De "
                            "tst-COMMON")
  return schema.apply_arg(config, arg)
