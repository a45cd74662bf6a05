"""`s2t_transformer_s` without downsampling (Sant 2022, Appendix B): the baseline of h_lc_nodown
and multiformer_s_nodown. The conv subsampler keeps its two convolutions with stride 1, so the
encoder attends over every 10 ms frame (4x longer sequences, 16x the attention matrix).
Batch: 5000 frames x update_freq 64 (thesis App. B).

Run:   python run.py --config=configs/s2t_transformer_s_nodown.py \
           --workdir=runs/s2t_transformer_s_nodown --config.data.root=/data/MUSTC_v1.0
Expected (MuST-C En-De tst-COMMON, the thesis's run): ASR WER 13.76, BLEU 22.31.
"""

from configs import s2t_transformer_s
from multiformer_jax import schema


def get_config(arg=None):
  """configs/s2t_transformer_s.py's experiment without downsampling (schema.no_downsampling)."""
  config = s2t_transformer_s.get_config()
  config.name = "s2t_transformer_s (no downsampling)"
  schema.no_downsampling(config)
  config.reported.bleu, config.reported.wer = 22.31, 13.76
  config.reported.source = "Sant 2022, Appendix B, MuST-C En-De tst-COMMON"
  return schema.apply_arg(config, arg)
