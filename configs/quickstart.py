"""The quickstart (the README's main job): a scaled-down thesis v2 Multiformer, ASR then ST, on
the embedded corpus, on a 2-core CPU.

Builds the embedded English->Spanish corpus (Bible verses, World English Bible against
Reina-Valera 1909, spoken by espeak-ng and flite voices; Flight of the Amazon Queen's recorded
dialogue for ASR, and both games' dialogue text read by the same voices; Beneath a Steel Sky's
recorded lines and Spanish subtitles held out), prepares
it, trains the ASR stage (hybrid CTC/attention), an MT model on the corpus's pairs and the
second game's other lines whose decoder and encoder start the ST stage's, and the ST stage (the
ASR encoder with a CTC loss on the source transcript, the MT model's encoder stacked on it),
then evaluates both on held-out speakers and sentences (tst-COMMON, and band-limited as the
games' audio: tst-COMMON-5k), on tst-COMMON's sentences spoken by a synthesizer no training
utterance uses (festival: tst-unseen-synth) and on the second game's cast (dev-real,
tst-real). `:ding` is the English->German corpus of the Ding dictionary's example sentences and
the message catalogs, espeak-ng only, with the same recorded speech (German subtitles).

What it reaches: docs/quickstart.md. Why each setting is what it is (every trial with its
numbers): docs/notes/, linked from docs/quickstart.md#the-recipe.

Run:  python run.py --config=configs/quickstart.py --workdir=runs/quickstart
      python run.py --config=configs/quickstart.py:long --workdir=runs/quickstart_long
      python run.py --config=configs/quickstart.py:ding --workdir=runs/quickstart_ding
      python run.py --config=configs/quickstart.py:ding,long --workdir=runs/quickstart_ding_long
"""

from multiformer_jax import schema

UPDATES = {"asr": 11000, "st": 4300}
EVAL_EVERY = {"asr": 1000, "st": 1000}
LONG_UPDATES = {"asr": 16000, "st": 7000}    # `:long`: under an hour
LONG_EVAL_EVERY = 2000
MT_UPDATES = 1000                            # the MT stage's, 64 sentence pairs each


def get_config(arg=None):
  config = schema.base_config()
  config.name = "quickstart_v2"
  m = config.model
  m.encoder_layers = 6                       # thesis v2 at half depth, d=128
  m.encoder_layout = "3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))"
  m.qkv_bias = False                         # as the thesis's code
  m.d_model, m.ffn_dim = 128, 512
  m.conv_channels = 128                      # 17 % fewer FLOPs an ASR update than 256
  m.conv_kernels, m.conv_strides = (5, 5, 5), (2, 2, 2)   # 8x: 12.5 positions a second
  m.decoder_layers, m.decoder_heads = 2, 4
  m.dropout = m.attention_dropout = m.activation_dropout = 0.0   # runs this short underfit
  d = config.data
  d.corpus, d.pairs = "embedded", "en-es"
  e = d.embedded
  e.target, e.text = "es", "bible"
  e.synthesizers, e.unseen_synthesizer = "espeak,flite", "festival"   # festival: ked_diphone
  e.other_synthesizer_share = 0.5            # flite speaks half of the training utterances
  e.train_speakers_per_sentence = 1
  e.max_heldout = 300                        # dev and tst-COMMON: 300 verses each
  e.recorded_train, e.uqm_share = "uqm", 0.2  # + a fifth of The Ur-Quan Masters' 27 races
                                             # (ASR, 2.2 h)
  e.spoken_dialogue = "queen,sky"            # + both games' dialogue read by the training voices
                                             # (ASR; sky: its lines no real split holds)
  e.real_test, e.real_heldout = "sky", 300   # dev-real, tst-real: Beneath a Steel Sky's cast
  e.narrowband_share = 0.3                   # synthetic talks at the games' 5.5 kHz bandwidth
  d.extra_test_splits = "tst-unseen-synth,dev-real,tst-real,tst-COMMON-5k"
  d.root = "data/embedded_en_es"
  d.prepared_dir = "data/prepared/embedded_en_es"
  d.asr_vocab, d.st_vocab = 300, 1000
  d.specaugment = False                      # runs this short underfit
  d.max_frames, d.num_buckets = 6000, 4
  config.train.adam_b2 = 0.98
  for stage, lr in (("asr", 4e-3), ("st", 3e-3)):
    s = config[stage]
    s.lr = lr
    s.lr_scheduler = "polynomial_decay"      # the run's length is fixed in advance
    s.warmup_updates = 100
    s.max_updates = UPDATES[stage]
    s.update_freq = 1
    s.eval_every = EVAL_EVERY[stage]
    s.keep_last = 4
  config.asr.ctc_weight = 0.5                # the lowest dev WER of 0.3 / 0.5 / 0.7
  config.st.ctc_weight = 0.3                 # CTC on the source transcript (ESPnet-ST)
  config.st.encoder_init = "best"
  config.st.frozen = "encoder/subsample"     # no backward through it: 1.2x the ST updates
  config.st.decoder_init = "mt"              # the ST decoder starts from the MT model's
  config.st.text_encoder = "mt"              # its encoder stacked on the speech encoder (SATE)
  mt = config.mt
  mt.lr, mt.lr_scheduler, mt.warmup_updates = 3e-3, "polynomial_decay", 100
  mt.max_updates, mt.batch, mt.eval_every = MT_UPDATES, 64, 500
  mt.encoder_layers = 2
  mt.dropout = 0.0                           # 500 updates without reach 1000 with 0.3
  mt.text_only = True                        # + Beneath a Steel Sky's lines not held out (text)
  ev = config.eval
  ev.checkpoint = "latest"                   # the learning rate has decayed to 0 there
  ev.after_training = True
  ev.max_len_b = 60
  ev.num_buckets = 1
  ev.beam = 20                               # dev WER 0.2-1.0 below beam 5
  ev.length_penalty = 1.3                    # the searches' output was 7-11 % short
  ev.score_dev, ev.score_dev_beam = True, 5  # dev WER / BLEU on the learning curves
  ev.ctc_weight = 0.2                        # joint CTC/attention ASR search (ESPnet's)
  ev.lm_weight, ev.lm_stages = 0.3, ("asr",)   # the ASR 20-best rescored by a word trigram LM
  ev.rate_norm_target, ev.rate_norm_stages = 0.5, ("asr",)   # fast speakers stretched (ASR)
  ev.no_repeat_ngram_size, ev.no_repeat_ngram_stages = 4, ("st",)   # no loops of pieces (ST)
  return schema.apply_arg(config, arg, VARIANTS)


def long(config):
  """The 60-minute variant: LONG_UPDATES instead of UPDATES, still without SpecAugment."""
  for stage, updates in LONG_UPDATES.items():
    config[stage].max_updates = updates
    config[stage].eval_every = LONG_EVAL_EVERY
  config.name += "_long"
  return config


def ding(config):
  """English->German: the Ding dictionary's example sentences and the message catalogs (15500 /
  300 / 300 segments), espeak-ng voices only, no tst-unseen-synth, no ST CTC and no MT stage:
  the main job before the Bible corpus. Combine with long: `:ding,long`."""
  d = config.data
  d.pairs = "en-de"
  e = d.embedded
  e.target, e.text = "de", "catalogs,ding"
  e.synthesizers, e.unseen_synthesizer = "espeak", ""
  e.other_synthesizer_share = 0.0
  d.extra_test_splits = "dev-real,tst-real,tst-COMMON-5k"   # sky's German subtitles
  d.root = "data/embedded_ding"
  d.prepared_dir = "data/prepared/embedded_ding_en_de"
  config.st.ctc_weight = 0.0
  config.st.decoder_init = config.st.text_encoder = ""
  config.name = config.name.replace("quickstart_v2", "quickstart_v2_ding")
  return config


VARIANTS = {"long": long, "ding": ding}
