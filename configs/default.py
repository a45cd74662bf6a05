"""The default configuration: every key, documented once. Experiments override a few of them.

The model's settings and the batching's are defined, with their defaults and meaning, by the
classes that use them (model.model_config.ModelConfig, data.input_pipeline.PipelineConfig)
and the embedded corpus's by data_prep.embedded.spec.CorpusSpec: this file reads them there.
What experiments share beyond these defaults (the `arg` after ':', the tiny CPU variant, a
paper's batch per update) is configs/common.py.
"""

import ml_collections

from configs import common
from data_prep.embedded import spec as embedded_spec
from multiformer_jax.data import input_pipeline
from multiformer_jax.model import model_config

def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.name = "default"
  # What the paper reports for this architecture (MuST-C tst-COMMON), for results tables.
  config.reported = ml_collections.ConfigDict({"bleu": -1.0, "wer": -1.0, "source": "",
                                               "averages": ""})

  # --- model: every field of multiformer_jax.model.model_config.ModelConfig that a config
  # sets, with its default and meaning there (the vocabulary size and the task counts are set
  # from the prepared data)
  config.model = ml_collections.ConfigDict(model_config.config_defaults())

  # --- data: data_prep/prepare.py output, and how to batch it -----------------------------
  d = config.data = ml_collections.ConfigDict()
  d.prepared_dir = "data/prepared/mustc_en_de"   # python -m data_prep.prepare --out ...
  # If prepared_dir is not prepared yet, run.py prepares it from here (resumable):
  d.corpus = "mustc"           # mustc | mtedx | europarl_st | covost2 | embedded (built into
                               # `root` first from data.embedded.*, then read as mustc)
  d.root = ""                  # the corpus download directory
  d.pairs = "en-de"            # comma-separated language pairs (X-X: ASR data, e.g. mTEDx's)
  d.eval_only_pairs = ""       # pairs prepared for dev and test only: zero-shot directions
  # The embedded corpus (data.corpus="embedded"): every field of data_prep.embedded.spec.
  # CorpusSpec, documented there (the same settings as `python -m data_prep.embedded --help`).
  d.embedded = ml_collections.ConfigDict(embedded_spec.config_defaults())
  d.asr_vocab = 5000           # SentencePiece pieces (fairseq MuST-C recipe)
  d.st_vocab = 8000
  d.train_split = "train"
  d.dev_split = "dev"
  d.test_split = "tst-COMMON"
  d.speed_perturb = ""         # training utterances at each of these speeds, e.g. "0.9,1.0,1.1"
                               # (Kaldi's speed perturbation, done when preparing)
  d.speed_perturb_domains = ""  # comma-separated: only these domains' utterances are perturbed
                               # (e.g. "queen,uqm": the embedded corpus's recorded speech)
  d.extra_test_splits = ""     # comma-separated: also prepared, and evaluated after training
                               # beside test_split (e.g. the embedded tst-unseen-synth)
  # How batches are made: every setting of data.input_pipeline.PipelineConfig (max_frames,
  # num_buckets, num_token_buckets, max_source_frames, cmvn, specaugment, specaugment_policy,
  # seed, target_lang_tag), with its default and meaning there.
  d.update(input_pipeline.config_defaults())
  d.frames_per_update = 0      # padded source frames per update, the recipe's (the thesis:
                               # 320000) whatever the device count: micro-batches per update
                               # = this / (max_frames x devices), {stage}.update_freq = 0;
                               # 0 = {stage}.update_freq batches of max_frames
  d.loader_workers = -1        # background processes assembling training batches; 0 = in the
                               # training loop; -1 = by backend: 0 on CPU (they would take the
                               # step's cores), every core but one with an accelerator

  # --- training: shared by both stages ----------------------------------------------------
  t = config.train = ml_collections.ConfigDict()
  t.stages = ("asr", "st")     # run in order; a finished stage is skipped on rerun
  t.parallel = "pmap"          # pmap | jit (sharding); data parallel over all devices
  t.seed = 1
  t.log_every = 10             # updates between log lines / scalars (also a host sync)
  t.adam_b1 = 0.9
  t.adam_b2 = 0.999
  t.adam_eps = 1e-8
  t.clip_norm = 10.0
  t.label_smoothing = 0.1
  t.max_consecutive_nonfinite = 10   # stop after this many skipped (non-finite) updates
  t.early_stop_patience = 0    # end a stage after this many evaluations without a better dev
                               # loss (fairseq --patience); 0 = train to max_updates
  t.kl_weight = 0.0            # head selection: weight of the KL term (0 in the paper's recipe)
  t.selection_temperature_decay = 0.0   # tau(u) = max(min, tau0 * exp(-decay * u)); 0 = fixed
  t.selection_temperature_min = 0.5
  t.selection_lr_multiplier = 1.0   # learning rate of the selection logits / the model's (1 = ref.)
  t.compilation_cache = "~/.cache/multiformer_jax/jax"   # persistent XLA cache; "" = off
  # Progress checkpoints, on a period of their own whatever {stage}.eval_every: a killed run
  # loses at most this much. Only the newest is kept, and only to resume (never evaluated or
  # averaged). 0 = not on that count; decided on process 0's clock, agreed by every process.
  t.checkpoint_every_minutes = 30.0
  t.checkpoint_every_updates = 0

  # --- the stages ----------------------------------------------------------------------------
  config.asr = stage_config(lr=1e-3)
  config.st = stage_config(lr=2e-3)
  # ST stage: initialise the encoder from the ASR stage's latest | best | average | around_best
  # checkpoint, averaging as evaluation does (eval.average_last, eval.average_around_best).
  config.st.encoder_init = "average"
  config.st.decoder_init = ""  # "mt": start the ST decoder from the MT stage's (below)
  # "mt": the MT stage's encoder stacked on the speech encoder, reading the distribution of
  # the ST stage's CTC head over the source pieces (SATE's adaptor; needs st.ctc_weight > 0)
  config.st.text_encoder = ""

  # The MT stage, run before ST where st.decoder_init or st.text_encoder is "mt": an MT model
  # on the corpus's (transcript, translation) pairs whose decoder starts the ST stage's
  # (fairseq's MT recipe) and whose encoder the ST stage can stack on its speech encoder. The
  # ST stage reads its best checkpoint by dev loss; mt.pairs and mt.ctc_weight stay unset (the
  # ST stage's pairs; no CTC head).
  mt = config.mt = stage_config(lr=5e-4)
  mt.warmup_updates = 4000
  mt.max_updates = 20000
  mt.update_freq = 1           # batches of mt.batch pairs per update
  mt.batch = 128               # sentence pairs per batch
  mt.length = 0                # pieces per side (longer sides cut); 0 = the training pairs'
                               # 99th percentile, at most 128
  mt.num_buckets = 3           # batch widths (length quantiles), one compiled update each
  mt.encoder_layers = 3        # full-attention text encoder (the model's width and heads)
  mt.dropout = 0.3
  mt.score_dev = True          # dev BLEU at every evaluation (beam mt.beam)
  mt.beam = 5
  mt.text_only = False         # also train on the prepared text without speech (prepare's
                               # text_only: the embedded corpus's game lines not held out)

  # --- evaluation ----------------------------------------------------------------------------
  e = config.eval = ml_collections.ConfigDict()
  e.checkpoint = "average"     # latest | best | average | around_best
  e.average_last = 10          # "average": the mean of the last N contiguous checkpoints
  e.average_around_best = 7    # "around_best": the mean of the N around the best by dev loss
                               # (the thesis's 7); the stage keeps them whatever keep_last
  e.beam = 5
  e.length_penalty = 1.0
  e.max_len_a = 0.0            # max target tokens = a * source frames + b
  e.max_len_b = 200
  e.min_len = 1                # fairseq --min-len: EOS masked before this many tokens
  e.unk_penalty = 0.0          # fairseq --unkpen: subtracted from <unk>'s log-probability
  e.no_repeat_ngram_size = 0   # fairseq --no-repeat-ngram-size: a token repeating an n-gram of
                               # the hypothesis is masked; 0 = off, else n >= 2
  e.no_repeat_ngram_stages = ("st",)   # the stages whose searches block repeats
  e.ctc_weight = 0.0           # joint CTC/attention decoding (ESPnet's decode ctc_weight) for
                               # models with a CTC head (asr.ctc_weight > 0); 0 = attention only
  e.lm_weight = 0.0            # rescore each utterance's n-best (all `beam` hypotheses) with a
                               # word n-gram LM of the stage's training targets, interpolated
                               # Kneser-Ney (evaluation/word_lm.py); 0 = no LM (the papers')
  e.lm_stages = ("asr",)       # the stages whose evaluation rescores, when lm_weight > 0
  e.lm_order = 3
  e.lm_unigram = "wordfreq"    # wordfreq | uniform: what the LM's unigram level backs off to
                               # (the wordfreq package's word frequencies in that language)
  e.rate_norm_target = 0.0     # speaking-rate normalisation (evaluation/rate_norm.py): an
                               # utterance whose CTC greedy path has more pieces per encoder
                               # position than this is stretched in time by the ratio before
                               # the search; 0 = off; needs a CTC head
  e.rate_norm_max_stretch = 1.4   # the largest stretch (the stretched batch's frame factor)
  e.rate_norm_stages = ("asr", "st")   # the stages whose searches normalise, when on
  e.batch_frames = 20000       # padded source frames per evaluation batch
  e.num_buckets = 4            # batch shapes when decoding (each compiles the beam search)
  e.after_training = False     # run.py evaluates every stage on data.test_split at the end
  e.score_dev = False          # training also decodes the dev split at every evaluation and
                               # logs its WER (ASR) or BLEU (ST): learning curves in task terms
  e.score_dev_beam = 1         # beam of that decode (the search is otherwise eval.*'s)
  return common.apply_arg(config, arg)


def stage_config(lr):
  """The schedule and bookkeeping of one stage (fairseq's recipe: 50k updates)."""
  s = ml_collections.ConfigDict()
  s.lr = lr                    # peak learning rate of the schedule
  s.lr_scheduler = "inverse_sqrt"  # fairseq's; or "polynomial_decay" (linear to 0 at
                               # max_updates: for runs whose length is fixed in advance)
  s.warmup_updates = 10000     # linear warmup from 0
  s.max_updates = 50000
  s.update_freq = 8            # gradient accumulation (fairseq --update-freq): batches of
                               # data.max_frames per update; 0 = derived from
                               # data.frames_per_update and the device count
  s.pairs = ""                 # comma-separated pairs this stage trains and is evaluated on;
                               # '' = every prepared pair (ASR) / every translation pair (ST).
                               # An X-X pair (mTEDx's es-es ...) is ASR data only
  s.ctc_weight = 0.0           # hybrid CTC/attention loss weight (ESPnet's mtlalpha), 0 in
                               # the papers' recipes; ASR: CTC on the transcript; ST: on the
                               # source transcript in the ASR vocabulary (multi-task encoder)
  s.eval_every = 1000          # updates between dev evaluations + checkpoints; -1 = once per
                               # epoch of the training data (fairseq's default)
  s.keep_last = 10             # checkpoints kept besides the best (by dev loss); at least
                               # the number averaged (eval.average_last)
  # Two-step recipes (the adapter baseline: train a model, then only its new adapters):
  s.init_from = ""             # workdir of another run: its same stage's parameters initialise
                               # this one's (tensors it lacks stay fresh); overrides the ST
                               # encoder carry from this run's ASR stage
  s.init_from_checkpoint = "latest"   # latest | best | average | around_best of that run
                               # (averaging eval.average_last / eval.average_around_best)
  s.train_only = ""            # comma-separated substrings of parameter names to train (e.g.
                               # "adapters_"); the others are frozen. '' = train everything
  s.frozen = ""                # comma-separated substrings of parameter names kept fixed (e.g.
                               # "encoder/subsample", the conv subsampler); their gradients
                               # are not computed. '' = none
  return s
