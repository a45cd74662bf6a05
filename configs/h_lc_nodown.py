"""`s2t_multiformer_s_h_lc (no downsampling)` (Sant 2022, Appendix B): the conv subsampler keeps its
two
convolutions but with stride 1, so the encoder sees every 10 ms frame (4x longer sequences).

Layout: 12x(2*local(65)+2*conv(5,2))
The thesis trained it with max 5000 frames x update_freq 64 and lost many batches to
out-of-memory on an 11 GB RTX 2080 Ti (about 410 h per model).

Reported (MuST-C En-De tst-COMMON, App. B Table 5): BLEU 21.78; ASR WER 14.0.
(s2t_transformer_s without downsampling: WER 13.76, BLEU 22.31.)

Run:  python run.py --config=configs/h_lc_nodown.py --workdir=runs/h_lc_nodown
"""

from configs import multiformer_h_lc
from multiformer_jax import schema


def get_config(arg=None):
  """configs/multiformer_h_lc.py's experiment without downsampling (schema.no_downsampling)."""
  config = multiformer_h_lc.get_config()
  config.name = "s2t_multiformer_s_h_lc (no downsampling)"
  schema.no_downsampling(config)
  config.reported.bleu, config.reported.wer = 21.78, 14.0
  config.reported.source = ("Sant 2022 (Multiformer thesis), App. B Table 5, MuST-C En-De "
                            "tst-COMMON")
  return schema.apply_arg(config, arg)
