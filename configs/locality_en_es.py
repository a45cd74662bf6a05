"""The efficient model of Alastruey et al. 2022 (locality of attention), MuST-C En-Es:
configs/locality_en_de.py's experiment with the per-layer windows of En-Es's contribution
analysis (Algorithm 1, layers 4-12): 5, 7, 19, 15, 13, 17, 19, 19, 25.

Run:   python run.py --config=configs/locality_en_es.py --workdir=runs/locality_en_es \
           --config.data.root=/data/MUSTC_v1.0
Expected (BLEU, mean over 5 seeds, tst-COMMON): 27.46 (s2t_transformer_s baseline 27.49).
"""

from configs import locality_en_de

WINDOWS = (5, 7, 19, 15, 13, 17, 19, 19, 25)  # encoder layers 4..12


def get_config(arg=None):
  return locality_en_de.get_config(arg, "en-es", WINDOWS, reported_bleu=27.46)
