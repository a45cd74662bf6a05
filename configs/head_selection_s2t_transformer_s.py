"""Head selection (Gong et al. 2022), `head_selection_s2t_transformer_s`: multilingual ST.

s2t_transformer_s with 8 candidate heads in every encoder layer and in every decoder
self-attention, 4 of them used per task (language pair) and layer, group strategy,
Gumbel-sigmoid temperature 5, KL weight 0 (the published commands). The paper's recipe: lr 5e-4,
Adam (0.9, 0.98) eps 1e-6, dropout 0.3, inverse-sqrt warmup 10k, 32k-frame batches, clip-norm 10,
label smoothing 0.1, 400 epochs (here: max_updates). Data: mTEDx's ST directions, one-to-many,
with target-language tags (fairseq --prefix-size 1).

Reported (mTEDx multilingual ST, average BLEU over directions): 13.2 without selection ->
15.2 with group selection; multilingual ASR WER 49.0 -> 40.0.

Variants (`:name`, comma-separated with key=value):
  subset    the subset strategy;  domain  tasks are domains: mTEDx + Europarl-ST X -> en;
  noisy     the reference's noisy inference;  runlocal  a CPU-sized model.
The baselines are their own experiments: multilingual_s2t_transformer_s.py (no selection) and
adapters_s2t_transformer_s.py (per-task adapters).

Run:  python run.py --config=configs/head_selection_s2t_transformer_s.py \
          --config.data.root=/data/mtedx --workdir=runs/head_selection
CPU:  python run.py --config=configs/head_selection_embedded.py --workdir=runs/hs_embedded
"""

from configs import default

MTEDX_ST_PAIRS = "es-en,es-fr,es-it,es-pt,fr-en,fr-es,fr-pt,pt-en,pt-es,it-en,it-es,ru-en,el-en"


def multilingual(name: str, arg=None, variants=None):
  """s2t_transformer_s with the paper's multilingual recipe and mTEDx data, no selection."""
  config = default.get_config()
  config.name = name
  m = config.model
  m.dropout = 0.3
  m.task_tag = "pair"
  d = config.data
  d.corpus, d.pairs = "mtedx", MTEDX_ST_PAIRS
  d.prepared_dir = "data/prepared/mtedx_st"
  d.train_split, d.dev_split, d.test_split = "train", "valid", "test"
  d.max_frames = 32000
  d.target_lang_tag = True
  t = config.train
  t.adam_b2, t.adam_eps = 0.98, 1e-6
  for stage in (config.asr, config.st):
    stage.lr = 5e-4
    stage.warmup_updates = 10000
    stage.max_updates = 100000
  config.reported.bleu = 13.2
  config.reported.wer = 49.0
  config.reported.source = ("Gong et al. 2022, mTEDx multilingual (average over directions), "
                            "no head selection")
  return default.apply_arg(config, arg, {**VARIANTS, **(variants or {})})


def subset(config):
  config.model.selection_strategy = "subset"
  return config


def domain(config):
  """Multi-domain: mTEDx and Europarl-ST prepared as one dataset (data.root: both roots,
  comma-separated), X -> en directions present in both, a task per corpus."""
  config.model.task_tag = "domain"
  d = config.data
  d.corpus, d.pairs = "mtedx,europarl_st", "es-en,fr-en,it-en,pt-en"
  d.dev_split, d.test_split = "dev", "test"      # mTEDx's valid is read as dev
  d.target_lang_tag = False                      # one target language
  d.prepared_dir = "data/prepared/mtedx_europarl_st"
  return config


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
  m.selection_strategy = "group"
  m.selection_temperature = 5.0
  config.train.kl_weight = 0.0
  config.reported.bleu = 15.2
  config.reported.wer = 40.0
  config.reported.source = ("Gong et al. 2022, mTEDx multilingual (average over directions), "
                            "group head selection")
  return default.apply_arg(config, arg, VARIANTS)
