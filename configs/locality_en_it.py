"""The efficient model of Alastruey et al. 2022 (locality of attention), MuST-C En-It:
configs/locality_en_de.py's experiment with the per-layer windows of En-It's contribution
analysis (Algorithm 1, layers 4-12): 5, 17, 13, 13, 11, 15, 21, 23, 23.

Run:   python run.py --config=configs/locality_en_it.py --workdir=runs/locality_en_it \
           --config.data.root=/data/MUSTC_v1.0
Expected (BLEU, mean over 5 seeds, tst-COMMON): 22.97 (s2t_transformer_s baseline 22.98).
"""

from configs import locality_en_de

WINDOWS = (5, 17, 13, 13, 11, 15, 21, 23, 23)  # encoder layers 4..12


def get_config(arg=None):
  return locality_en_de.get_config(arg, "en-it", WINDOWS, reported_bleu=22.97)
