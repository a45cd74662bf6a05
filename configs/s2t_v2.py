"""Thesis architecture 10, `s2t_multiformer_s_v2` (Sant 2022, Table 1).

Encoder: 6x(1xLocal(64) + 3xConv(5,2)) + 6x(2xLocal(64) + 2xConv(5,2))
Layout:  6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2))
(d=256, FFN 2048, 4 heads, 12 encoder / 6 decoder layers, conv subsampler 5,5 stride 2;
Local(64) attends to 32 tokens on each side, i.e. local(65).)

The best architecture of the thesis ("v2"), designed from the W_o analysis of h_lc.

Reported (MuST-C En-De tst-COMMON): BLEU 22.63; ASR WER 13.74.

Run:  python run.py --config=configs/s2t_v2.py --workdir=runs/s2t_v2
Tiny: python run.py --config=configs/s2t_v2.py:runlocal --workdir=runs/s2t_v2_tiny
"""

from configs import default


def get_config(arg=None):
  return default.multiformer("s2t_multiformer_s_v2", "6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2))", reported_bleu=22.63, reported_wer=13.74,
                             arg=arg)
