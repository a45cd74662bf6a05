"""Every section of an experiment's config that no library class owns, each key declared once
with its default, its meaning and the values it takes: `train`, the stages `asr`, `st` and
`mt`, `eval`, the corpus keys of `data`, and `reported`. The rest is declared by the classes
that use it: `model` by model.model_config.ModelConfig, `data`'s batching keys by
data.input_pipeline.PipelineConfig, `data.embedded` by data_prep.embedded.spec.CorpusSpec.
"""

from __future__ import annotations

import dataclasses

from data_prep import corpora
from multiformer_common.settings import setting
from multiformer_jax.data.input_pipeline import SPEECH_STAGES
from multiformer_jax.experiment import MT_STAGE
from multiformer_jax.runtime.checkpoints import SELECTIONS

LR_SCHEDULERS = ("inverse_sqrt", "polynomial_decay")
PARALLEL_MODES = ("pmap", "jit")
# What data.corpus names: a corpus reader's, the embedded corpus, or fairseq (a root fairseq's
# prep scripts wrote, read in place).
CORPORA = (*corpora.READERS, "embedded", "fairseq")


@dataclasses.dataclass(frozen=True)
class Reported:
  """What the paper reports for this architecture (MuST-C tst-COMMON), for results tables."""
  bleu: float = setting(-1.0, "the paper's BLEU (-1: none)")
  wer: float = setting(-1.0, "the paper's ASR WER (-1: none)")
  source: str = setting("", "where the figures come from")
  averages: str = setting("", "how the paper averaged checkpoints for them")


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """The corpus and its preparation (data_prep/prepare.py); the batching keys of `data` are
  PipelineConfig's, `data.embedded` is CorpusSpec's."""
  prepared_dir: str = setting("data/prepared/mustc_en_de",
                              "python -m data_prep.prepare --out ...: run.py prepares it from "
                              "data.corpus and data.root if it is not prepared yet (resumable)")
  corpus: str = setting(
      "mustc", "the corpus read from data.root (embedded: built into root first from "
      "data.embedded.*, then read as mustc; fairseq: a root fairseq's prep scripts wrote, read "
      "in place); several readers' corpora, comma-separated, are prepared as one multi-domain "
      "dataset, one root each")
  root: str = setting("", "the corpus download directory")
  pairs: str = setting("en-de", "comma-separated language pairs (X-X: ASR data, e.g. mTEDx's)")
  eval_only_pairs: str = setting("", "pairs prepared for dev and test only: zero-shot "
                                 "directions")
  asr_vocab: int = setting(5000, "SentencePiece pieces of the transcripts (fairseq's MuST-C "
                           "recipe)", at_least=1)
  st_vocab: int = setting(8000, "SentencePiece pieces of the translations", at_least=1)
  train_split: str = setting("train", "the training split")
  dev_split: str = setting("dev", "the split of the dev loss and dev scoring")
  test_split: str = setting("tst-COMMON", "the split evaluated after training")
  speed_perturb: str = setting("", "training utterances at each of these speeds, e.g. "
                               "'0.9,1.0,1.1' (Kaldi's speed perturbation, done when "
                               "preparing)")
  speed_perturb_domains: str = setting("", "comma-separated: only these domains' utterances "
                                       "are perturbed (e.g. 'queen,uqm': the embedded "
                                       "corpus's recorded speech)")
  extra_test_splits: str = setting("", "comma-separated: also prepared, and evaluated after "
                                   "training beside data.test_split (e.g. tst-unseen-synth)")
  frames_per_update: int = setting(
      0, "padded source frames per update, the recipe's (the thesis: 320000) whatever the "
      "device count: micro-batches per update = this / (data.max_frames x devices), with "
      "{stage}.update_freq = 0; 0 = {stage}.update_freq batches of data.max_frames", at_least=0)
  loader_workers: int = setting(
      -1, "background processes assembling training batches; 0 = in the training loop; -1 = "
      "by backend: 0 on CPU (they would take the step's cores), every core but one with an "
      "accelerator", at_least=-1)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Training, shared by every stage."""
  stages: tuple = setting(("asr", "st"), "the speech stages run in order (the MT stage runs "
                          "before st when st.decoder_init or st.text_encoder is 'mt'); a "
                          "finished stage is skipped on rerun", choices=SPEECH_STAGES)
  parallel: str = setting("pmap", "data parallel over every device: pmap, or jit with "
                          "sharding", choices=PARALLEL_MODES)
  seed: int = setting(1, "the parameters' initialisation and dropout")
  log_every: int = setting(10, "updates between log lines and scalars (also a host sync)",
                           at_least=1)
  adam_b1: float = setting(0.9, "Adam's beta1", at_least=0.0, below=1.0)
  adam_b2: float = setting(0.999, "Adam's beta2", at_least=0.0, below=1.0)
  adam_eps: float = setting(1e-8, "Adam's epsilon", above=0.0)
  clip_norm: float = setting(10.0, "gradient clipping by global norm (0 = off)", at_least=0.0)
  label_smoothing: float = setting(0.1, "of the cross-entropy", at_least=0.0, below=1.0)
  max_consecutive_nonfinite: int = setting(
      10, "stop after this many consecutive skipped (non-finite) updates", at_least=1)
  early_stop_patience: int = setting(
      0, "end a stage after this many evaluations without a better dev loss (fairseq "
      "--patience); 0 = train to max_updates", at_least=0)
  kl_weight: float = setting(0.0, "head selection: weight of the KL term (0 in the paper's "
                             "recipe)", at_least=0.0)
  selection_temperature_decay: float = setting(
      0.0, "head selection: tau(u) = max(min, tau0 * exp(-decay * u)); 0 = fixed", at_least=0.0)
  selection_temperature_min: float = setting(0.5, "head selection: the lowest temperature",
                                             above=0.0)
  selection_lr_multiplier: float = setting(
      1.0, "head selection: learning rate of the selection logits / the model's (1 = the "
      "reference's)", above=0.0)
  compilation_cache: str = setting("~/.cache/multiformer_jax/jax",
                                   "persistent XLA compilation cache; '' = off")
  checkpoint_every_minutes: float = setting(
      30.0, "progress checkpoints, on a period of their own whatever {stage}.eval_every: a "
      "killed run loses at most this much (only the newest is kept, only to resume); 0 = not "
      "on that count; decided on process 0's clock, agreed by every process", at_least=0.0)
  checkpoint_every_updates: int = setting(0, "the same period in updates; 0 = not on that "
                                          "count", at_least=0)


@dataclasses.dataclass(frozen=True)
class StageSettings:
  """The schedule and bookkeeping of one stage (fairseq's recipe: 50k updates)."""
  lr: float = setting(1e-3, "peak learning rate of the schedule", at_least=0.0)
  lr_scheduler: str = setting("inverse_sqrt", "fairseq's inverse_sqrt, or polynomial_decay "
                              "(linear to 0 at max_updates: for runs whose length is fixed in "
                              "advance)", choices=LR_SCHEDULERS)
  warmup_updates: int = setting(10000, "linear warmup from 0", at_least=0)
  max_updates: int = setting(50000, "updates of the stage", at_least=0)
  update_freq: int = setting(8, "gradient accumulation (fairseq --update-freq): batches of "
                             "data.max_frames per update; 0 = derived from "
                             "data.frames_per_update and the device count", at_least=0)
  pairs: str = setting("", "comma-separated pairs this stage trains and is evaluated on; '' = "
                       "every prepared pair (ASR) / every translation pair (ST). An X-X pair "
                       "(mTEDx's es-es ...) is ASR data only")
  ctc_weight: float = setting(
      0.0, "hybrid CTC/attention loss weight (ESPnet's mtlalpha), 0 in the papers' recipes; "
      "ASR: CTC on the transcript; ST: on the source transcript in the ASR vocabulary "
      "(multi-task encoder)", at_least=0.0, below=1.0)
  eval_every: int = setting(1000, "updates between dev evaluations and checkpoints; -1 = once "
                            "per epoch of the training data (fairseq's default)")
  keep_last: int = setting(10, "checkpoints kept besides the best (by dev loss); at least the "
                           "number averaged (eval.average_last)", at_least=1)
  init_from: str = setting("", "workdir of another run: its same stage's parameters "
                           "initialise this one's (tensors it lacks stay fresh); overrides "
                           "the ST encoder carry from this run's ASR stage")
  init_from_checkpoint: str = setting(
      "latest", "which checkpoint(s) of that run (averaging eval.average_last / "
      "eval.average_around_best)", choices=SELECTIONS)
  train_only: str = setting("", "comma-separated substrings of parameter names to train (e.g. "
                            "'adapters_'); the others are frozen. '' = train everything")
  frozen: str = setting("", "comma-separated substrings of parameter names kept fixed (e.g. "
                        "'encoder/subsample', the conv subsampler); their gradients are not "
                        "computed. '' = none")


@dataclasses.dataclass(frozen=True)
class STSettings(StageSettings):
  """The ST stage: a stage, and what it starts from."""
  lr: float = setting(2e-3, "peak learning rate of the schedule", at_least=0.0)
  encoder_init: str = setting(
      "average", "the ASR stage's checkpoint(s) the encoder starts from, averaged as "
      "evaluation averages (eval.average_last, eval.average_around_best)", choices=SELECTIONS)
  decoder_init: str = setting("", "'mt': start the ST decoder from the MT stage's; '' = fresh",
                              choices=("", MT_STAGE))
  text_encoder: str = setting(
      "", "'mt': the MT stage's encoder stacked on the speech encoder, reading the "
      "distribution of the ST stage's CTC head over the source pieces (SATE's adaptor; needs "
      "st.ctc_weight > 0); '' = none", choices=("", MT_STAGE))


@dataclasses.dataclass(frozen=True)
class MTSettings(StageSettings):
  """The MT stage, run before ST where st.decoder_init or st.text_encoder is 'mt': an MT model
  on the corpus's (transcript, translation) pairs whose decoder starts the ST stage's
  (fairseq's MT recipe) and whose encoder the ST stage can stack on its speech encoder. The ST
  stage reads its best checkpoint by dev loss; mt.pairs and mt.ctc_weight stay unset (the ST
  stage's pairs; no CTC head)."""
  lr: float = setting(5e-4, "peak learning rate of the schedule", at_least=0.0)
  warmup_updates: int = setting(4000, "linear warmup from 0", at_least=0)
  max_updates: int = setting(20000, "updates of the stage", at_least=0)
  update_freq: int = setting(1, "batches of mt.batch pairs per update", at_least=1)
  batch: int = setting(128, "sentence pairs per batch", at_least=1)
  length: int = setting(0, "pieces per side (longer sides cut); 0 = the training pairs' 99th "
                        "percentile, at most 128", at_least=0)
  num_buckets: int = setting(3, "batch widths (length quantiles), one compiled update each",
                             at_least=1)
  encoder_layers: int = setting(3, "full-attention text encoder (the model's width and heads)",
                                at_least=1)
  dropout: float = setting(0.3, "of the MT model", at_least=0.0, below=1.0)
  score_dev: bool = setting(True, "dev BLEU at every evaluation (beam mt.beam)")
  beam: int = setting(5, "of the dev BLEU's search", at_least=1)
  text_only: bool = setting(False, "also train on the prepared text without speech (prepare's "
                            "text_only: the embedded corpus's game lines not held out)")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """Evaluation: which checkpoints, the search, and what is decoded when."""
  checkpoint: str = setting("average", "which checkpoint(s) are evaluated", choices=SELECTIONS)
  average_last: int = setting(10, "'average': the mean of the last N contiguous checkpoints",
                              at_least=1)
  average_around_best: int = setting(
      7, "'around_best': the mean of the N around the best by dev loss (the thesis's 7); the "
      "stage keeps them whatever keep_last", at_least=1)
  beam: int = setting(5, "beam size", at_least=1)
  length_penalty: float = setting(1.0, "fairseq's --lenpen")
  max_len_a: float = setting(0.0, "max target tokens = a * source frames + b", at_least=0.0)
  max_len_b: int = setting(200, "max target tokens = a * source frames + b", at_least=0)
  min_len: int = setting(1, "fairseq --min-len: EOS masked before this many tokens",
                         at_least=0)
  unk_penalty: float = setting(0.0, "fairseq --unkpen: subtracted from <unk>'s "
                               "log-probability")
  no_repeat_ngram_size: int = setting(
      0, "fairseq --no-repeat-ngram-size: a token repeating an n-gram of the hypothesis is "
      "masked; 0 = off, else n >= 2", at_least=0)
  no_repeat_ngram_stages: tuple = setting(("st",), "the stages whose searches block repeats",
                                          choices=SPEECH_STAGES)
  ctc_weight: float = setting(
      0.0, "joint CTC/attention decoding (ESPnet's decode ctc_weight) for models with a CTC "
      "head ({stage}.ctc_weight > 0); 0 = attention only", at_least=0.0, at_most=1.0)
  lm_weight: float = setting(
      0.0, "rescore each utterance's n-best (all `beam` hypotheses) with a word n-gram LM of "
      "the stage's training targets, interpolated Kneser-Ney (evaluation/word_lm.py); 0 = no "
      "LM (the papers')", at_least=0.0)
  lm_stages: tuple = setting(("asr",), "the stages whose evaluation rescores, when lm_weight "
                             "> 0", choices=SPEECH_STAGES)
  lm_order: int = setting(3, "the word LM's n", at_least=1)
  lm_unigram: str = setting("wordfreq", "what the LM's unigram level backs off to: the "
                            "wordfreq package's word frequencies in that language, or "
                            "uniform", choices=("wordfreq", "uniform"))
  rate_norm_target: float = setting(
      0.0, "speaking-rate normalisation (evaluation/rate_norm.py): an utterance whose CTC "
      "greedy path has more pieces per encoder position than this is stretched in time by the "
      "ratio before the search; 0 = off; needs a CTC head", at_least=0.0)
  rate_norm_max_stretch: float = setting(1.4, "the largest stretch (the stretched batch's "
                                         "frame factor)", at_least=1.0, at_most=4.0)
  rate_norm_stages: tuple = setting(("asr", "st"), "the stages whose searches normalise, when "
                                    "on", choices=SPEECH_STAGES)
  batch_frames: int = setting(20000, "padded source frames per evaluation batch", at_least=1)
  num_buckets: int = setting(4, "batch shapes when decoding (each compiles the beam search)",
                             at_least=1)
  after_training: bool = setting(False, "run.py evaluates every stage on data.test_split at "
                                 "the end")
  score_dev: bool = setting(False, "training also decodes the dev split at every evaluation "
                            "and logs its WER (ASR) or BLEU (ST): learning curves in task "
                            "terms")
  score_dev_beam: int = setting(1, "beam of that decode (the search is otherwise eval.*'s)",
                                at_least=1)


# The sections this module declares: {config section: its class}.
SECTIONS = {"reported": Reported, "train": TrainSettings, "asr": StageSettings,
            "st": STSettings, "mt": MTSettings, "eval": EvalSettings}
