"""The quickstart: a scaled-down thesis v2 Multiformer, ASR then ST, on the embedded corpus.

Builds the embedded English->German corpus (espeak-ng speech over translated message catalogs),
prepares it, trains the ASR stage, carries the encoder into the ST stage, and evaluates both
on the held-out speakers (tst-COMMON), all on a 2-core CPU.

Layout: 3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2)): thesis v2 at half depth, d=128.

Run:  python run.py --config=configs/quickstart.py --workdir=runs/quickstart
"""

from configs import default


def get_config(arg=None):
  config = default.get_config()
  config.name = "quickstart_v2"
  m = config.model
  m.encoder_layers = 6
  m.encoder_layout = "3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))"
  m.qkv_bias = False
  m.d_model, m.ffn_dim, m.conv_channels = 128, 512, 256
  m.decoder_layers, m.decoder_heads = 2, 4
  d = config.data
  d.embedded = True
  d.root = "data/embedded"
  d.prepared_dir = "data/prepared/embedded_en_de"
  d.asr_vocab, d.st_vocab = 500, 500
  d.max_frames, d.num_buckets = 16000, 4
  for stage in (config.asr, config.st):
    stage.lr = 2e-3
    stage.warmup_updates = 60
    stage.max_updates = 200
    stage.eval_every = 50
    stage.keep_last = 4
  config.st.encoder_init = "best"
  e = config.eval
  e.checkpoint, e.average_last = "average", 3
  e.after_training = True
  e.max_len_b = 60
  e.num_buckets = 1
  return default.apply_arg(config, arg)
