"""Decoding and scoring: fairseq's beam search, the jitted translate function, sacreBLEU and
WER, evaluation from checkpoints and translation of one's own audio files."""
