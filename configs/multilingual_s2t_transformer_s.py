"""The multilingual baseline of head selection: s2t_transformer_s on mTEDx's ST directions with
the paper's recipe and target-language tags, every head shared by every task.

Reported (mTEDx multilingual ST, average BLEU): 13.2; multilingual ASR WER 49.0.

Run:  python run.py --config=configs/multilingual_s2t_transformer_s.py \
          --config.data.root=/data/mtedx --workdir=runs/multilingual
"""

from configs import head_selection_s2t_transformer_s as head_selection


def get_config(arg=None):
  return head_selection.multilingual("multilingual_s2t_transformer_s", arg)
