"""Head selection (Gong et al. 2022), `head_selection_s2t_transformer_s`: multilingual ST.

s2t_transformer_s with 8 candidate heads in every encoder layer and in every decoder
self-attention, 4 of them used per task (language pair) and layer, group strategy,
Gumbel-sigmoid temperature 5, KL weight 0 (the published commands). The paper's recipe: lr 5e-4,
Adam (0.9, 0.98) eps 1e-6, dropout 0.3, inverse-sqrt warmup 10k, 320k frames per update (§4.2:
40000 x update_freq 8 here), clip-norm 10, label smoothing 0.1, 250 ASR / 400 ST epochs
(here: max_updates). Data: mTEDx prepared once: the ASR stage trains on the 8 languages' ASR
data (ar, de, el, es, fr, it, pt, ru), the ST stage on the 10 translation directions with
training data, one-to-many with target-language tags (fairseq --prefix-size 1), and evaluation
covers the 13 test directions: AVG-A / AVG-T / AVG-Z as in Table 4. Encoder heads are selected
per source language, decoder heads per target language.

Reported (mTEDx multilingual ST, average BLEU over all directions, Table 4): 13.2 without
selection -> 15.2 with group selection; multilingual ASR WER 49.0 -> 40.0 (Table 2). Every
config and variant reports its row of Tables 2-5 (PAPER below).

Variants (`:name`, comma-separated with key=value):
  subset    the subset strategy;  domain  tasks are domains: mTEDx + CoVoST 2 + Europarl-ST
            X -> en;
  noisy     the reference's noisy inference;  runlocal  a CPU-sized model.
The baselines are their own experiments: multilingual_s2t_transformer_s.py (no selection) and
adapters_s2t_transformer_s.py (per-task adapters).

Run:  python run.py --config=configs/head_selection_s2t_transformer_s.py \
          --config.data.root=/data/mtedx --workdir=runs/head_selection
CPU:  python run.py --config=configs/head_selection_embedded.py --workdir=runs/hs_embedded
"""

from multiformer_jax import schema

# mTEDx: 10 translation directions with training data, 3 with dev and test only (the paper's
# zero-shot directions, AVG-Z), and the ASR data of its 8 languages (the X-X "pairs").
MTEDX_ST_PAIRS = "es-en,es-fr,es-it,es-pt,fr-en,fr-es,fr-pt,pt-en,ru-en,el-en"
MTEDX_ZERO_SHOT_PAIRS = "it-en,it-es,pt-es"
MTEDX_ASR_PAIRS = "ar-ar,de-de,el-el,es-es,fr-fr,it-it,pt-pt,ru-ru"

# Gong et al. 2022, transcribed: {setting: {model: (ASR WER, ST BLEU, ST averages, tables)}}.
# Multilingual: ASR Table 2 (AVG of 8 languages), ST Table 4 (AVG-A over the 13 directions,
# AVG-T over the 10 training ones, AVG-Z over the 3 zero-shot ones; the adapters cannot translate
# the zero-shot directions: their BLEU is AVG-T). Multi-domain: ASR Table 3 (mTEDx), ST Table 5
# (TEDx AVG-A / AVG-T / AVG-Z; CoVoST and EuroParl in the source text).
PAPER = {
    "multilingual": {
        "shared": (49.0, 13.2, "AVG-A 13.2 · AVG-T 14.6 · AVG-Z 8.5",
                   "Table 2 and Table 4 (AVG-A), S2T Transformer"),
        "adapters": (41.1, 14.8, "AVG-A — · AVG-T 14.8 · AVG-Z —",
                     "Table 2 and Table 4 (AVG-T: training directions), Adapter"),
        "group": (40.0, 15.2, "AVG-A 15.2 · AVG-T 16.7 · AVG-Z 10.4",
                  "Table 2 and Table 4 (AVG-A), Group strategy"),
        "subset": (44.7, 13.3, "AVG-A 13.3 · AVG-T 14.7 · AVG-Z 8.5",
                   "Table 2 and Table 4 (AVG-A), Subset strategy")},
    "domain": {
        "shared": (42.7, 13.7, "AVG-A 13.7 · AVG-T 13.6 · AVG-Z 13.9",
                   "Table 3 and Table 5 (TEDx AVG-A; CoVoST 17.3, EuroParl 19.0), "
                   "S2T Transformer (joint)"),
        "adapters": (41.7, 14.0, "AVG-A 14.0 · AVG-T 14.3 · AVG-Z 13.2",
                     "Table 3 and Table 5 (TEDx AVG-A; CoVoST 17.9, EuroParl 20.0), Adapter"),
        "group": (41.0, 15.6, "AVG-A 15.6 · AVG-T 15.9 · AVG-Z 14.8",
                  "Table 3 and Table 5 (TEDx AVG-A; CoVoST 19.6, EuroParl 20.8), "
                  "Group strategy"),
        "subset": (41.8, 13.8, "AVG-A 13.8 · AVG-T 14.3 · AVG-Z 13.1",
                   "Table 3 and Table 5 (TEDx AVG-A; CoVoST 17.9, EuroParl 19.2), "
                   "Subset strategy")}}


def set_reported(config):
  """config.reported from PAPER for what the config is: shared heads, adapters or head
  selection (group / subset), multilingual or multi-domain (task_tag domain)."""
  m = config.model
  setting = "domain" if "domain" in (m.task_tag, m.encoder_task_tag) else "multilingual"
  model = ("adapters" if m.adapter_dim else m.selection_strategy
           if (m.encoder_candidates or m.decoder_candidates) else "shared")
  wer, bleu, averages, where = PAPER[setting][model]
  config.reported.wer, config.reported.bleu, config.reported.averages = wer, bleu, averages
  config.reported.source = f"Gong et al. 2022, mTEDx: {where}"
  return config


def multilingual(name: str, arg=None, variants=None):
  """s2t_transformer_s with the paper's multilingual recipe and mTEDx data, no selection."""
  config = schema.base_config()
  config.name = name
  m = config.model
  m.dropout = 0.3
  d = config.data
  # One prepared dataset: multilingual ASR over the 8 languages, then ST over the translation
  # directions (13 in dev and test, 10 trained on); the ST encoder starts from the ASR one.
  d.corpus = "mtedx"
  d.pairs = f"{MTEDX_ST_PAIRS},{MTEDX_ASR_PAIRS}"
  d.eval_only_pairs = MTEDX_ZERO_SHOT_PAIRS
  config.asr.pairs = MTEDX_ASR_PAIRS
  d.prepared_dir = "data/prepared/mtedx"
  d.train_split, d.dev_split, d.test_split = "train", "valid", "test"
  d.target_lang_tag = True
  schema.batch_per_update(config, 40000, 8)     # "a batch size of 320k tokens" (§4.2)
  t = config.train
  t.adam_b2, t.adam_eps = 0.98, 1e-6
  # "we stop the model training when the model does not improve on the validation set for 10
  # epochs ... average checkpoints of the last 10 epochs" (§4.2.1): evaluate and save every
  # epoch, patience 10, average the last 10 (max_updates only caps the 250 / 400 epochs).
  t.early_stop_patience = 10
  for stage in (config.asr, config.st):
    stage.lr = 5e-4
    stage.warmup_updates = 10000
    stage.max_updates = 100000
    stage.eval_every = -1
  set_reported(config)
  return schema.apply_arg(config, arg, {**VARIANTS, **(variants or {})})


def subset(config):
  config.model.selection_strategy = "subset"
  return set_reported(config)


def domain(config):
  """Multi-domain: mTEDx, CoVoST 2 and Europarl-ST prepared as one dataset (data.root: the
  three roots, comma-separated), the X -> en directions all three have, a task per corpus."""
  m = config.model
  m.task_tag, m.encoder_task_tag, m.decoder_task_tag = "domain", "", ""
  d = config.data
  d.corpus, d.pairs = "mtedx,covost2,europarl_st", "es-en,fr-en,it-en,pt-en"
  d.eval_only_pairs = ""
  config.asr.pairs = ""                          # ASR on the source side of the same data
  d.dev_split, d.test_split = "dev", "test"      # mTEDx's valid is read as dev
  d.target_lang_tag = False                      # one target language
  d.prepared_dir = "data/prepared/mtedx_covost2_europarl_st"
  return set_reported(config)


def noisy(config):
  config.model.selection_inference = "noisy"
  return config


VARIANTS = {"subset": subset, "domain": domain, "noisy": noisy}


def get_config(arg=None):
  config = multilingual("head_selection_s2t_transformer_s")
  m = config.model
  m.encoder_layout = "12x(8*full)"       # the candidates: 8 full heads of head_dim 256/4
  m.encoder_candidates = 8
  m.decoder_candidates = 8
  # "the encoder selects heads by source language, the decoder by target language" (§4.2.1;
  # the reference's --task-type lang): a zero-shot direction combines an encoder selection
  # learned from the source language's ASR and other directions with a decoder selection
  # learned from the target language's.
  m.encoder_task_tag, m.decoder_task_tag = "source_lang", "target_lang"
  m.selection_strategy = "group"
  m.selection_temperature = 5.0
  config.train.kl_weight = 0.0
  set_reported(config)
  return schema.apply_arg(config, arg, VARIANTS)
