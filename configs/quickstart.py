"""The quickstart: a scaled-down thesis v2 Multiformer, ASR then ST, on the embedded corpus.

Builds the embedded English->Spanish corpus (Bible verses, World English Bible against
Reina-Valera 1909, spoken by espeak-ng and flite voices), prepares it, trains the ASR stage
(hybrid CTC/attention), a text model on the corpus's pairs whose decoder and encoder start the
ST stage's, and the ST stage (the ASR encoder with a CTC loss on the source transcript, the text
model's encoder stacked on it), then evaluates both on held-out speakers and sentences
(tst-COMMON) and on tst-COMMON's sentences spoken by a synthesizer no training utterance uses
(festival: tst-unseen-synth), all on a 2-core CPU.
`:ding` is the English->German corpus of the Ding dictionary's example sentences and the
message catalogs, espeak-ng only. docs/quickstart.md has what it reaches and the recipes tried.

Layout: 3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2)): thesis v2 at half depth, d=128.

Run:  python run.py --config=configs/quickstart.py --workdir=runs/quickstart
      python run.py --config=configs/quickstart.py:long --workdir=runs/quickstart_long
      python run.py --config=configs/quickstart.py:ding --workdir=runs/quickstart_ding
"""

from configs import default

# Updates per stage: the default aims at 20 minutes on 2 CPU cores, `long` at 60. 7500 ASR
# updates instead of 6000 (about 2.5 min more): dev WER 13.39 -> 11.99, tst-COMMON 21.13 -> 18.74
# (docs/notes/2026-11-28-asr-ctc-weight-and-updates.md).
UPDATES = {"asr": 7500, "st": 4300}
EVAL_EVERY = {"asr": 1000, "st": 1000}
LONG_UPDATES = {"asr": 16000, "st": 7000}
LONG_EVAL_EVERY = 2000
MT_UPDATES = 1000            # the text stage's, 64 sentence pairs each
OTHER_SYNTHESIZER_SHARE = 0.5


def get_config(arg=None):
  config = default.get_config()
  config.name = "quickstart_v2"
  m = config.model
  m.encoder_layers = 6
  m.encoder_layout = "3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))"
  m.qkv_bias = False
  m.d_model, m.ffn_dim = 128, 512
  # A conv subsampler of 128 hidden channels, not 256: an ASR update costs 17% fewer FLOPs, and
  # 6000 of them (the time of about 5000 at 256) read tst-COMMON WER 20.96 against 27.24 after
  # 4000 at 256 (docs/notes/2026-11-28-asr-updates-and-text-stage.md).
  m.conv_channels = 128
  # Three stride-2 convolutions (8x: 12.5 encoder positions a second) instead of fairseq's two:
  # the corpus's speech carries a median of 8.7 ASR pieces a second, and the shorter sequences
  # learn more per update and run faster (docs/notes/quickstart-ding-recipe-trials.md). The 1%
  # of training utterances with fewer positions than CTC needs add no CTC loss (zero_infinity)
  # and still train the decoder.
  m.conv_kernels, m.conv_strides = (5, 5, 5), (2, 2, 2)
  m.decoder_layers, m.decoder_heads = 2, 4
  # No dropout, no SpecAugment: runs this short underfit (measured on the Ding corpus at about
  # five ASR and four ST epochs, docs/notes/quickstart-ding-recipe-trials.md); in :long too
  # (its docstring).
  m.dropout = m.attention_dropout = m.activation_dropout = 0.0
  d = config.data
  d.embedded = True
  d.embedded_target, d.pairs = "es", "en-es"
  d.embedded_text = "bible"
  d.embedded_synthesizers, d.embedded_unseen_synthesizer = "espeak,flite", "festival"
  # Voices beyond espeak-ng's: flite speaks half of the training utterances, each training
  # voice at one rate and pitch; four rates and pitches per voice measured worse
  # (docs/quickstart.md). tst-unseen-synth is festival's voices whose speaker no training voice
  # shares: ked_diphone (kal_diphone is flite's kal16's speaker).
  d.embedded_other_synthesizer_share = OTHER_SYNTHESIZER_SHARE
  d.embedded_speakers_per_variant = 1
  d.extra_test_splits = "tst-unseen-synth"
  d.embedded_speakers_per_sentence = 1
  d.embedded_max_heldout = 300
  d.root = "data/embedded_en_es"
  d.prepared_dir = "data/prepared/embedded_en_es"
  d.asr_vocab, d.st_vocab = 300, 1000
  d.specaugment = False
  d.max_frames, d.num_buckets = 6000, 4
  config.train.adam_b2 = 0.98
  for stage, lr in (("asr", 4e-3), ("st", 3e-3)):
    s = config[stage]
    s.lr = lr
    s.lr_scheduler = "polynomial_decay"
    s.warmup_updates = 100
    s.max_updates = UPDATES[stage]
    s.update_freq = 1
    s.eval_every = EVAL_EVERY[stage]
    s.keep_last = 4
  # 0.3 and 0.7 read dev WER 14.06 and 14.47 against 13.39 after 6000 updates
  # (docs/notes/2026-11-28-asr-ctc-weight-and-updates.md).
  config.asr.ctc_weight = 0.5
  # CTC on the source transcript in the ST stage too (ESPnet-ST's multi-task encoder loss):
  # dev BLEU 3.80 against 2.10 without at update 1000 (docs/notes/2026-11-27-recipe-trials.md).
  config.st.ctc_weight = 0.3
  config.st.encoder_init = "best"
  # The ST stage keeps the ASR stage's conv subsampler fixed and skips its backward pass: 1.2x
  # the updates in the same time (5000 instead of 4000), dev BLEU 9.47 -> 10.10 on the same ASR
  # and text stages (docs/notes/2026-11-27-tcmalloc-and-frozen-subsampler.md).
  config.st.frozen = "encoder/subsample"
  # The ST decoder starts from a text model's trained on the corpus's (transcript,
  # translation) pairs: tst-COMMON BLEU 5.26 -> 6.53, tst-unseen-synth 2.80 -> 4.02 on the same
  # ASR stage (docs/quickstart.md).
  config.st.decoder_init = "mt"
  # And the text model's encoder stacked on the speech encoder, reading the ST stage's CTC
  # distribution over the source pieces (SATE's adaptor, model/stacked.py): the decoder reads
  # what it learned to translate. On the same ASR and text stages: dev BLEU 10.10 -> 13.90,
  # tst-COMMON 6.90 -> 9.68, tst-unseen-synth 5.34 -> 8.07
  # (docs/notes/2026-11-27-stacked-text-encoder.md).
  config.st.text_encoder = "mt"
  mt = config.mt
  mt.lr, mt.lr_scheduler, mt.warmup_updates = 3e-3, "polynomial_decay", 100
  mt.max_updates, mt.batch, mt.eval_every = MT_UPDATES, 64, 500
  mt.encoder_layers = 2
  # No dropout: 500 updates without reach the dev BLEU that 1000 with 0.3 did (10.46 against
  # 9.88). Under the stacked encoder 1000 such updates (its dev BLEU 14.57 against 10.54) and
  # 700 fewer ST updates raised the ST model's dev BLEU on two ASR stages, 13.90 -> 14.26 and
  # 12.86 -> 14.23 (docs/notes/2026-11-28-asr-updates-and-text-stage.md).
  mt.dropout = 0.0
  e = config.eval
  # The last checkpoint: the learning rate has decayed to 0 there, these runs stop long before
  # convergence, and averaging the last two measured worse
  # (docs/notes/quickstart-ding-recipe-trials.md). The ST stage's dev loss can stop falling
  # while its dev BLEU still rises (one run: the best by dev loss read dev BLEU 9.28, the last
  # 10.35; docs/notes/2026-11-27-tcmalloc-and-frozen-subsampler.md).
  e.checkpoint = "latest"
  e.after_training = True
  e.max_len_b = 60
  e.num_buckets = 1
  # Beam 20: the dev WER of four trained ASR models (two of each variant) fell by 0.2-1.0
  # against beam 5 (docs/notes/quickstart-ding-recipe-trials.md); ST's dev BLEU did not move.
  e.beam = 20
  # fairseq's length penalty 1.3: the searches' output was 7-11% short of the references; dev
  # BLEU rose by 0.07-0.28 on four ST models and dev WER fell 19.64 -> 19.27 on one ASR model
  # (0.7 / 1.6 / 2.0: 19.98 / 19.46 / 19.77; docs/notes/2026-11-28-asr-updates-and-text-stage.md).
  e.length_penalty = 1.3
  e.score_dev, e.score_dev_beam = True, 5   # dev WER / BLEU on the learning curves
  # Joint CTC/attention decoding of the ASR stage (ESPnet's); 0.2 had the lowest dev WER of
  # 0.1-0.7 in both variants (docs/notes/quickstart-ding-recipe-trials.md); on the Bible corpus
  # 0.3 gained 0.45 on one model and lost 0.34 on another
  # (docs/notes/2026-11-28-asr-ctc-weight-and-updates.md). The ST model's CTC head spells the
  # source, so its search is attention alone.
  e.ctc_weight = 0.2
  # The ASR stage's 20-best rescored with a word trigram LM of the training transcripts whose
  # unigram level backs off to English word frequencies (wordfreq): dev WER fell by 3.3-6.4 in
  # all four models tried, weight 0.3 the lowest of 0.1-0.6
  # (docs/notes/quickstart-ding-recipe-trials.md). ST's dev BLEU did not move with a German one,
  # so ST decodes without.
  e.lm_weight, e.lm_stages = 0.3, ("asr",)
  # Speaking-rate normalisation (evaluation/rate_norm.py): an utterance whose CTC greedy path
  # has more than 0.5 pieces per encoder position is stretched in time before the ASR search.
  # The ASR stage's dev WER: 11.99 off, 12.49 / 11.58 / 11.60 / 11.86 at 0.45 / 0.5 / 0.55 /
  # 0.6 (docs/notes/2026-11-28-speaking-rate-normalisation.md). Not in the ST search: dev BLEU
  # 15.36 off against 15.08 at 0.5 with this recipe's model, 16.44 against 15.78 with `:long`'s
  # (docs/notes/2026-11-28-additive-noise.md).
  e.rate_norm_target, e.rate_norm_stages = 0.5, ("asr",)
  # The ST search never repeats a 4-gram of pieces (fairseq's --no-repeat-ngram-size): the
  # undertrained decoder otherwise loops on letter pieces ("ENTONCENTONCEN..."). Dev BLEU of one
  # model: 8.35 without, 7.93 / 8.39 / 8.86 / 8.80 / 8.68 with n = 2 / 3 / 4 / 5 / 6.
  e.no_repeat_ngram_size, e.no_repeat_ngram_stages = 4, ("st",)
  return default.apply_arg(config, arg, {"long": long, "ding": ding})


def long(config):
  """The 60-minute variant: the main job with LONG_UPDATES instead of UPDATES, still without
  SpecAugment. With SpecAugment's `sm` masks (16000 + 6000 updates, the earlier `:long`) this
  d=128 model's ASR dev WER after 16000 updates was the main job's after 4000, and the ST
  stage's masks alone cost 2 tst-COMMON BLEU (4.95 against 6.93 with the same ASR stage);
  docs/notes/2026-11-27-long-without-masks.md. Its ST stage's dev BLEU flattened after 6000
  updates (13.16 / 13.61 / 13.35 at 6000 / 8000 / 8500) while the ASR stage's dev WER still fell
  at 12000: minutes go from ST to ASR (16000 + 7000)."""
  for stage, updates in LONG_UPDATES.items():
    config[stage].max_updates = updates
    config[stage].eval_every = LONG_EVAL_EVERY
  config.name += "_long"
  return config


def ding(config):
  """English->German: the Ding dictionary's example sentences and the message catalogs (15500 /
  300 / 300 segments), espeak-ng voices only, no tst-unseen-synth, no ST CTC and no text stage:
  the main job before the Bible corpus. Combine with long: `:ding,long`."""
  d = config.data
  d.embedded_target, d.pairs = "de", "en-de"
  d.embedded_text = "catalogs,ding"
  d.embedded_synthesizers, d.embedded_unseen_synthesizer = "espeak", ""
  d.extra_test_splits = ""
  d.embedded_other_synthesizer_share = 0.0
  d.root = "data/embedded_ding"
  d.prepared_dir = "data/prepared/embedded_ding_en_de"
  config.st.ctc_weight = 0.0
  config.st.decoder_init = config.st.text_encoder = ""
  config.name = config.name.replace("quickstart_v2", "quickstart_v2_ding")
  return config
