"""The adapter baseline of head selection (Gong et al. 2022, §4.2, after Bapna & Firat 2019):
the second step of a two-step recipe. Step one is the shared multilingual S2T Transformer
(configs/multilingual_s2t_transformer_s.py); step two adds a per-task bottleneck adapter
(LayerNorm, 256 -> 256 -> 256, ReLU, residual; "the intermediate dimension of adapter layers is
again set as 256") after every encoder and decoder layer, initialises everything else from step
one's checkpoints and trains only the adapters ("only adapter layer parameters tuned"), in each
stage: ASR from step one's ASR, ST from step one's ST.

Reported (mTEDx): multilingual ASR WER 41.1 (Table 2, average of 8 languages); ST BLEU 14.8
averaged over the 10 training directions (Table 4, AVG-T: adapters cannot translate the
zero-shot directions).

Run:  python run.py --config=configs/multilingual_s2t_transformer_s.py \
          --config.data.root=/data/mtedx --workdir=runs/multilingual
      python run.py --config=configs/adapters_s2t_transformer_s.py \
          --config.data.root=/data/mtedx --workdir=runs/adapters \
          --config.asr.init_from=runs/multilingual --config.st.init_from=runs/multilingual
"""

from multiformer_jax import schema
from configs import head_selection_s2t_transformer_s as head_selection

STEP_ONE = "runs/multilingual"      # the baseline's workdir (override with {stage}.init_from)


def get_config(arg=None):
  config = head_selection.multilingual("adapters_s2t_transformer_s")
  config.model.adapter_dim = 256
  # Adapters per language pair ("language-specific layers" that "cannot deal with zero-shot
  # translations", §4.3.1): evaluation leaves the zero-shot directions out (results.json's
  # left_out), so AVG-T is the comparable figure.
  config.model.task_tag = "pair"
  for stage in ("asr", "st"):
    s = config[stage]
    s.init_from = STEP_ONE
    s.init_from_checkpoint = "average"   # the baseline as it is evaluated (last 10 averaged)
    s.train_only = "adapters_"
  head_selection.set_reported(config)
  return schema.apply_arg(config, arg, head_selection.VARIANTS)
