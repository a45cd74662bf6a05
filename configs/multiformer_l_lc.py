"""Thesis architecture 7, `s2t_multiformer_s_l_lc` (Sant 2022, Table 1).

Encoder: 6x(4xLocal(64)) + 6x(4xConv(5,2))
Layout:  6x(4*local(65)) 6x(4*conv(5,2))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2;
Local(64) attends to 32 tokens on each side, i.e. local(65).)

Reported (MuST-C En-De tst-COMMON): BLEU 21.55; ASR WER 13.92 (App. A, Table 3).

Run:  python run.py --config=configs/multiformer_l_lc.py --workdir=runs/multiformer_l_lc
Tiny: python run.py --config=configs/multiformer_l_lc.py:runlocal --workdir=runs/multiformer_l_lc_tiny
"""

from configs import default


def get_config(arg=None):
  return default.multiformer("s2t_multiformer_s_l_lc", "6x(4*local(65)) 6x(4*conv(5,2))", reported_bleu=21.55, reported_wer=13.92,
                             arg=arg)
