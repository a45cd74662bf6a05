"""The adapter baseline of head selection (Gong et al. 2022, after Bapna & Firat 2019):
s2t_transformer_s with a per-task bottleneck adapter (LayerNorm, 256 -> 128 -> 256, ReLU,
residual) after every encoder and decoder layer; same data and recipe as
head_selection_s2t_transformer_s. The paper reports it between the shared baseline and head
selection; the bottleneck width is not given there (128 is our choice).

Run:  python run.py --config=configs/adapters_s2t_transformer_s.py \
          --config.data.root=/data/mtedx --workdir=runs/adapters
"""

from configs import head_selection_s2t_transformer_s as head_selection


def get_config(arg=None):
  config = head_selection.multilingual("adapters_s2t_transformer_s")
  config.model.adapter_dim = 128
  config.reported.bleu = -1.0
  config.reported.source = "Gong et al. 2022 (adapter baseline; between 13.2 and 15.2)"
  from configs import default  # pylint: disable=import-outside-toplevel
  return default.apply_arg(config, arg, head_selection.VARIANTS)
