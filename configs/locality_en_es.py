"""The efficient model of Alastruey et al. 2022 (locality of attention), MuST-C En-Es.

Full attention in encoder layers 1-3, local attention in layers 4-12 with the per-layer
windows chosen by the contribution analysis (Algorithm 1): 5, 7, 19, 15, 13, 17, 19, 19, 25.

Layout: 3x(4*full) 1x(4*local(5)) 1x(4*local(7)) 1x(4*local(19)) 1x(4*local(15)) 1x(4*local(13)) 1x(4*local(17)) 1x(4*local(19)) 1x(4*local(19)) 1x(4*local(25))

Reported (BLEU, mean over 5 seeds, tst-COMMON): 27.46 (s2t_transformer_s baseline 27.49).

Run:  python run.py --config=configs/locality_en_es.py --workdir=runs/locality_en_es
"""

from configs import default

WINDOWS = (5, 7, 19, 15, 13, 17, 19, 19, 25)  # encoder layers 4..12


def get_config(arg=None):
  return default.locality("en-es", WINDOWS, reported_bleu=27.46, arg=arg)
