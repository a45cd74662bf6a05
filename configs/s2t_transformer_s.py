"""fairseq's `s2t_transformer_s`: the baseline of all three papers.

Encoder: 12x(4xFull) with q/k/v biases (fairseq MultiheadAttention), conv subsampler 5,5
stride 2 (1024 channels), d=256, FFN 2048, 6 decoder layers; about 31M parameters with an
8000-piece vocabulary.

Reported (MuST-C tst-COMMON BLEU, fairseq): En-De 22.7, En-Es 27.2, En-Fr 32.9, En-It 22.7;
the Multiformer thesis's own run: BLEU 22.25, ASR WER 13.53.

Run:  python run.py --config=configs/s2t_transformer_s.py --workdir=runs/s2t_transformer_s
"""

from configs import default


def get_config(arg=None):
  config = default.get_config()
  config.name = "s2t_transformer_s"
  default.batch_per_update(config, 40000, 8)      # fairseq's MuST-C recipe: 320k frames
  config.reported.bleu = 22.7
  config.reported.wer = 13.53
  config.reported.source = ("MuST-C En-De tst-COMMON; BLEU: fairseq S2T (Wang et al. 2020); ASR "
                            "WER: the Multiformer thesis's run (Sant 2022, App. A Table 3)")
  return default.apply_arg(config, arg)
