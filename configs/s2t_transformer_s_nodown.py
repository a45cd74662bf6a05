"""`s2t_transformer_s` without downsampling (Sant 2022, Appendix B): the full-attention baseline
of h_lc_nodown and multiformer_s_nodown. The conv subsampler keeps its two convolutions with
stride 1, so the encoder attends over every 10 ms frame (4x longer sequences, 16x the
attention matrix). Batch: 5000 frames x update_freq 64 (thesis App. B).

Reported (MuST-C En-De tst-COMMON, the thesis's run): ASR WER 13.76, BLEU 22.31.

Run:  python run.py --config=configs/s2t_transformer_s_nodown.py --workdir=runs/s2t_transformer_s_nodown
"""

from configs import default


def get_config(arg=None):
  config = default.get_config()
  config.name = "s2t_transformer_s (no downsampling)"
  config.model.conv_strides = (1, 1)
  config.model.update(default.NODOWN_MEMORY_OPTIONS)
  default.batch_per_update(config, *default.NODOWN_BATCH)
  config.reported.bleu = 22.31
  config.reported.wer = 13.76
  config.reported.source = "Sant 2022, Appendix B, MuST-C En-De tst-COMMON"
  return default.apply_arg(config, arg)
