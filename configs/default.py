"""The default configuration: every key, documented. Experiments override a few of them.

Every experiment file defines `get_config(arg=None)`; `arg` is the text after ':' in
`--config=configs/file.py:arg`, a comma-separated list of variant flags and key=value pairs,
e.g. `configs/s2t_v2.py:runlocal` (the tiny CPU variant of the experiment).
"""

import ml_collections

from data_prep.embedded import spec as embedded_spec

# The thesis's Local(64): each token attends to the 64/2 = 32 tokens on each side.
THESIS_LOCAL = "local(65)"
# The no-downsampling models (4x longer encoder sequences) keep the loop-based memory options
# on every backend: the thesis lost batches to out-of-memory on an 11 GB GPU, and with them a
# 20 000-frame batch compiles to 3.3-3.7 GiB on an H100 in bf16 (11-21 GiB without).
NODOWN_MEMORY_OPTIONS = {"key_block_size": 512, "ffn_token_chunk": 1024}
# Their batch (thesis App. B): 5000 frames x update_freq 64 = 320k frames per update.
NODOWN_BATCH = (5000, 64)


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.name = "default"
  # What the paper reports for this architecture (MuST-C tst-COMMON), for results tables.
  config.reported = ml_collections.ConfigDict({"bleu": -1.0, "wer": -1.0, "source": "",
                                               "averages": ""})

  # --- model: multiformer_jax.model.model_config.ModelConfig's fields (the vocabulary size and
  # the task counts are set from the prepared data) ------------------------------------------
  m = config.model = ml_collections.ConfigDict()
  m.input_dim = 80             # fbank channels
  m.d_model = 256              # embedding / attention width
  m.ffn_dim = 2048             # feed-forward hidden width
  m.encoder_layers = 12
  m.decoder_layers = 6
  m.encoder_heads = 4          # heads per encoder layer (the layout's heads must sum to it)
  m.decoder_heads = 4
  # Head layout of the encoder, thesis notation (multiformer_jax/model/layout.py):
  # full | local(w[,d]) | kernel[(m)] | conv[(k,s[,type])], e.g. 12x(2*local(65)+2*conv(5,2)).
  m.encoder_layout = "12x(4*full)"
  m.conv_kernels = (5, 5)      # subsampler Conv1d kernels, one per layer
  m.conv_strides = (2, 2)      # subsampler strides; (1, 1) = no downsampling (thesis App. B)
  m.conv_channels = 1024       # subsampler hidden channels (before GLU)
  m.subsampler_masks_padding = True  # zero padded frames before each subsampler conv; False =
                               # fairseq's, whose output for an utterance depends on its
                               # batch-mates' padding (to reproduce fairseq's training)
  m.dropout = 0.1
  m.attention_dropout = 0.1
  m.activation_dropout = 0.1
  m.kernel_redraw = "fixed"    # kernel heads: 'fixed' (from kernel_seed) or 'step' (each step)
  m.kernel_seed = 0
  m.local_block_size = 0       # local heads: query block size, 0 = automatic
  m.key_block_size = -1        # full/conv heads: exact softmax over blocks of this many keys,
                               # recomputed in the backward (O(n x block) memory); 0 = one
                               # dense softmax; -1 = by backend: 512 on CPU (faster there too),
                               # 0 on GPU/TPU (faster there: docs/benchmarks.md)
  m.ffn_token_chunk = -1       # encoder FFN: computed this many tokens at a time, the hidden
                               # layer recomputed in the backward (less memory); 0 = one
                               # unchunked FFN (the faster); -1 = by backend: 0 everywhere now
  m.attention_implementation = "auto"  # full/conv heads on a GPU in bfloat16: 'auto' = cuDNN's
                               # fused attention where no attention dropout is active
                               # (evaluation, attention_dropout=0), our Pallas kernel with the
                               # dropout inside where it is; our softmax elsewhere; 'xla' =
                               # always ours; 'cudnn' / 'flash' = that kernel or an error.
                               # Local and kernel heads on the CPU: C++ kernels
                               # (docs/kernels.md), unless 'xla'
  m.qkv_bias = True            # bias in the q/k/v projections (fairseq: yes; thesis code: no)
  m.dtype = "auto"             # compute dtype: float32 | bfloat16 (params stay float32) |
                               # auto: bfloat16 on a GPU or TPU, float32 on a CPU
  m.max_target_positions = 1024
  # Multilingual / multi-domain (Gong et al. 2022; multiformer_jax/model/head_selection.py). A task is
  # a value of task_tag in the data: source_lang | target_lang | domain | pair ('' = one task).
  m.task_tag = ""
  m.encoder_task_tag = ""      # per stack ('' = task_tag): the paper keys encoder heads by
  m.decoder_task_tag = ""      # source_lang and decoder heads by target_lang
  m.encoder_candidates = 0     # H' candidate heads per encoder layer, encoder_heads of them used;
                               # the encoder layout then lists the H' candidates (any kinds)
  m.decoder_candidates = 0     # H' candidates in decoder self-attention (0 = no selection)
  m.selection_strategy = "group"        # subset | group
  m.selection_temperature = 5.0         # Gumbel-sigmoid temperature (train.selection_* anneal)
  m.selection_inference = "deterministic"  # or 'noisy': the reference's sampling at inference
  m.adapter_dim = 0            # per-task adapters after every layer (the paper's baseline)

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
  d.target_lang_tag = False    # ST targets start with <lang:xx> (one-to-many; forced at decoding)
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
  d.max_frames = 40000         # padded source frames per batch: per global batch, x
                               # {stage}.update_freq per update; with frames_per_update set,
                               # per device (fairseq's --max-tokens)
  d.frames_per_update = 0      # padded source frames per update, the recipe's (the thesis:
                               # 320000) whatever the device count: micro-batches per update
                               # = this / (max_frames x devices), {stage}.update_freq = 0;
                               # 0 = {stage}.update_freq batches of max_frames
  d.num_buckets = 8            # source-length buckets: distinct batch shapes per split
  d.num_token_buckets = 1      # training: each source bucket split by target length into this
                               # many (fewer padded target tokens, more compiled shapes; 6:
                               # 13 % padded on MuST-C-like lengths, docs/benchmarks.md)
  d.max_source_frames = 3000
  d.cmvn = "utterance"         # utterance | global | none
  d.specaugment = True         # training split only
  d.specaugment_policy = "lb"  # lb | ld | sm | ss (the SpecAugment paper's, fairseq's names),
                               # then optional overrides: "sm,time_mask_p=0.1"
  d.loader_workers = -1        # background processes assembling training batches; 0 = in the
                               # training loop; -1 = by backend: 0 on CPU (they would take the
                               # step's cores), every core but one with an accelerator
  d.seed = 1

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

  # --- the two stages ----------------------------------------------------------------------
  config.asr = stage_config(lr=1e-3)
  config.st = stage_config(lr=2e-3)
  # ST stage: initialise the encoder from the ASR stage's latest | best | average | around_best
  # checkpoint, averaging as evaluation does (eval.average_last, eval.average_around_best).
  config.st.encoder_init = "average"
  config.st.decoder_init = ""  # "mt": start the ST decoder from the text stage's (below)
  # "mt": the text stage's encoder stacked on the speech encoder, reading the distribution of
  # the ST stage's CTC head over the source pieces (SATE's adaptor; needs st.ctc_weight > 0)
  config.st.text_encoder = ""

  # --- the text stage (only with st.decoder_init="mt" or st.text_encoder="mt"): a text-to-text
  # model on the corpus's (transcript, translation) pairs whose decoder starts the ST stage's
  # (fairseq's MT recipe) and whose encoder the ST stage can stack on its speech encoder
  mt = config.mt = ml_collections.ConfigDict()
  mt.lr = 5e-4
  mt.lr_scheduler = "inverse_sqrt"   # or "polynomial_decay", as the stages
  mt.warmup_updates = 4000
  mt.max_updates = 20000
  mt.batch = 128               # sentence pairs per update
  mt.length = 0                # pieces per side (longer sides cut); 0 = the training pairs'
                               # 99th percentile, at most 128
  mt.num_buckets = 3           # batch widths (length quantiles), one compiled update each
  mt.encoder_layers = 3        # full-attention text encoder (the model's width and heads)
  mt.dropout = 0.3
  mt.eval_every = 1000         # updates between dev perplexities (the best parameters are kept)
  mt.score_dev = True          # dev BLEU of the kept parameters at the end (beam mt.beam)
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
  return apply_arg(config, arg)


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


def runlocal(config):
  """Shrinks an experiment to a CPU-sized model with the same head-layout structure, one
  batch per update."""
  m = config.model
  m.d_model, m.ffn_dim, m.conv_channels = 64, 128, 128
  m.decoder_layers = 2
  config.data.frames_per_update = 0
  for stage in ("asr", "st"):
    config[stage].update_freq = 1
  return config


def batch_per_update(config, max_frames: int, update_freq: int):
  """A paper's batch: `max_frames` x `update_freq` padded source frames per update in both
  stages, whatever the device count: `max_frames` per device and micro-batch (what the
  paper's GPU held), the micro-batches per update derived (update_freq on one device)."""
  config.data.max_frames = max_frames
  config.data.frames_per_update = max_frames * update_freq
  for stage in ("asr", "st"):
    config[stage].update_freq = 0
  return config


VARIANTS = {"runlocal": runlocal}


def apply_arg(config, arg, variants=None):
  """Applies `arg` ('runlocal', 'model.dropout=0.3', ... comma-separated) to `config`;
  `variants` adds an experiment's own named variants to the shared ones."""
  known = {**VARIANTS, **(variants or {})}
  for item in filter(None, (arg or "").split(",")):
    item = item.strip()
    if "=" in item:
      key, value = item.split("=", 1)
      node = config
      *path, leaf = key.strip().split(".")
      for part in path:
        node = node[part]
      node[leaf] = _parse_value(node[leaf], value.strip(), key)
    elif item in known:
      config = known[item](config)
    else:
      raise ValueError(f"unknown config variant {item!r}; valid: {sorted(known)} or "
                       f"key=value")
  return config


def _parse_value(current, text, key):
  """`text` converted to the type of the current value (tuples written as 5:5)."""
  if isinstance(current, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"config {key}={text!r}: expected true or false")
    return text.lower() in ("true", "1")
  if isinstance(current, (tuple, list)):
    return tuple(int(v) for v in text.split(":"))
  try:
    return type(current)(text)
  except ValueError:
    raise ValueError(f"config {key}={text!r}: expected a {type(current).__name__} like "
                     f"{current!r}") from None


def multiformer(name, layout, reported_bleu, reported_wer=-1.0, arg=None, **model):
  """A thesis architecture (Sant 2022, Table 1): s2t_transformer_s with a Multiformer encoder.

  The thesis code has no bias in the q/k/v projection; everything else is s2t_transformer_s,
  trained with the thesis's 20000 frames x update_freq 16 = 320k frames per update (§5.2).
  """
  config = get_config()
  batch_per_update(config, 20000, 16)
  config.name = name
  config.model.encoder_layout = layout
  config.model.qkv_bias = False
  config.model.update(model)
  config.reported.bleu = reported_bleu
  config.reported.wer = reported_wer
  config.reported.source = ("Sant 2022 (Multiformer thesis), MuST-C En-De tst-COMMON: BLEU "
                            "Table 2, ASR WER App. A Table 3")
  # The thesis initialises the ST encoder from the best ASR checkpoint (§5.3) and evaluates the
  # average of the 7 checkpoints around the best (its README).
  config.st.encoder_init = "best"
  config.eval.checkpoint, config.eval.average_around_best = "around_best", 7
  return apply_arg(config, arg)


def locality(pair: str, windows, reported_bleu: float, arg=None):
  """The efficient model of Alastruey et al. 2022: full attention in encoder layers 1-3,
  local attention with the per-layer windows of Algorithm 1 in layers 4-12; fairseq's batch,
  40000 frames x update_freq 8 (App. C)."""
  config = get_config()
  batch_per_update(config, 40000, 8)
  config.name = f"locality_{pair.replace('-', '_')}"
  config.model.encoder_layout = "3x(4*full) " + " ".join(f"1x(4*local({w}))" for w in windows)
  config.reported.bleu = reported_bleu
  config.reported.source = f"Alastruey et al. 2022, MuST-C {pair} tst-COMMON (mean of 5 seeds)"
  return apply_arg(config, arg)

