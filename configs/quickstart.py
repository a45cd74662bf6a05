"""The quickstart: a scaled-down thesis v2 Multiformer, ASR then ST, on the embedded corpus.

Builds the embedded English->German corpus (espeak-ng speech over translated message catalogs),
prepares it, trains the ASR stage, carries the encoder into the ST stage, and evaluates both
on the held-out speakers (tst-COMMON), all on a 2-core CPU.

Layout: 6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2)) at d=128 (thesis v2 structure).

Run:  python run.py --config=configs/quickstart.py --workdir=runs/quickstart
"""

from configs import default


def get_config(arg=None):
  config = default.get_config()
  config.name = "quickstart_v2"
  m = config.model
  m.encoder_layout = "6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2))"
  m.qkv_bias = False
  m.d_model, m.ffn_dim, m.conv_channels = 128, 512, 256
  m.encoder_layers, m.decoder_layers, m.decoder_heads = 12, 3, 4
  d = config.data
  d.embedded = True
  d.root = "data/embedded"
  d.prepared_dir = "data/prepared/embedded_en_de"
  d.asr_vocab, d.st_vocab = 500, 500
  d.max_frames = 12000
  for stage in (config.asr, config.st):
    stage.warmup_updates = 150
    stage.eval_every = 100
    stage.keep_last = 3
  config.asr.max_updates = 600
  config.st.max_updates = 600
  config.st.encoder_init = "best"
  config.eval.checkpoint = "best"
  config.eval.after_training = True
  config.eval.max_len_b = 60
  return default.apply_arg(config, arg)
