"""The efficient model of Alastruey et al. 2022 (locality of attention), MuST-C En-It.

Full attention in encoder layers 1-3, local attention in layers 4-12 with the per-layer
windows chosen by the contribution analysis (Algorithm 1): 5, 17, 13, 13, 11, 15, 21, 23, 23.

Layout: 3x(4*full) 1x(4*local(5)) 1x(4*local(17)) 1x(4*local(13)) 1x(4*local(13)) 1x(4*local(11)) 1x(4*local(15)) 1x(4*local(21)) 1x(4*local(23)) 1x(4*local(23))

Reported (BLEU, mean over 5 seeds, tst-COMMON): 22.97 (s2t_transformer_s baseline 22.98).

Run:  python run.py --config=configs/locality_en_it.py --workdir=runs/locality_en_it
"""

from configs import default

WINDOWS = (5, 17, 13, 13, 11, 15, 21, 23, 23)  # encoder layers 4..12


def get_config(arg=None):
  return default.locality("en-it", WINDOWS, reported_bleu=22.97, arg=arg)
