"""fairseq's `s2t_transformer_s` on MuST-C: the baseline of all three papers, and its recipe.

Encoder: 12x(4xFull) with q/k/v biases (fairseq MultiheadAttention), conv subsampler 5,5
stride 2 (1024 channels), d=256, FFN 2048, 6 decoder layers; about 31M parameters with an
8000-piece vocabulary.

Run:   python run.py --config=configs/s2t_transformer_s.py --workdir=runs/s2t_transformer_s \
           --config.data.root=/data/MUSTC_v1.0
Tiny:  python run.py --config=configs/s2t_transformer_s.py:runlocal --workdir=runs/s2t_tiny
Expected (MuST-C tst-COMMON BLEU, fairseq): En-De 22.7, En-Es 27.2, En-Fr 32.9, En-It 22.7;
the Multiformer thesis's own run: BLEU 22.25, ASR WER 13.53. This toolkit has not trained it on
MuST-C (README: "Real MuST-C").
"""

from multiformer_jax import schema

LAYOUT = "12x(4*full)"


def get_config(arg=None):
  config = schema.base_config()
  config.name = "s2t_transformer_s"
  m = config.model
  m.d_model, m.ffn_dim = 256, 2048
  m.encoder_layers, m.decoder_layers = 12, 6
  m.encoder_heads, m.decoder_heads = 4, 4
  m.conv_kernels, m.conv_strides = (5, 5), (2, 2)
  m.encoder_layout = LAYOUT
  m.qkv_bias = True                          # fairseq's MultiheadAttention
  # fairseq's MuST-C recipe: --max-tokens 40000 x --update-freq 8 = 320k frames per update.
  schema.batch_per_update(config, max_frames=40000, update_freq=8)
  # 50 000 updates a stage, as the thesis and the locality paper trained it (fairseq's own
  # MuST-C config: 100 000).
  for stage, lr in (("asr", 1e-3), ("st", 2e-3)):
    s = config[stage]
    s.lr, s.lr_scheduler, s.warmup_updates, s.max_updates = lr, "inverse_sqrt", 10000, 50000
  config.st.encoder_init = "average"         # the ASR stage's last 10 checkpoints averaged
  config.eval.checkpoint, config.eval.average_last = "average", 10   # fairseq's README
  config.reported.bleu, config.reported.wer = 22.7, 13.53
  config.reported.source = ("MuST-C En-De tst-COMMON; BLEU: fairseq S2T (Wang et al. 2020); ASR "
                            "WER: the Multiformer thesis's run (Sant 2022, App. A Table 3)")
  return schema.apply_arg(config, arg)
