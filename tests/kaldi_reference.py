"""A plain numpy implementation of Kaldi's fbank (compute-fbank-feats defaults as used by
fairseq: snip_edges, remove DC offset, pre-emphasis 0.97, povey window, power spectrum, 80
triangular mel bins from 20 Hz to Nyquist, log with FLT_EPSILON floor; no dither)."""

import numpy as np


def mel(f):
  return 1127.0 * np.log(1.0 + f / 700.0)


def mel_banks(num_bins, fft_size, rate, low=20.0):
  high = rate / 2
  mel_low, mel_high = mel(low), mel(high)
  delta = (mel_high - mel_low) / (num_bins + 1)
  fft_mels = mel(np.arange(fft_size // 2) * rate / fft_size)       # [fft_size/2]
  banks = np.zeros((num_bins, fft_size // 2))
  for b in range(num_bins):
    left, center, right = (mel_low + (b + i) * delta for i in range(3))
    up = (fft_mels - left) / (center - left)
    down = (right - fft_mels) / (right - center)
    banks[b] = np.where((fft_mels > left) & (fft_mels < right), np.minimum(up, down), 0.0)
  return banks


def kaldi_fbank(samples, rate=16000, num_bins=80):
  x = np.asarray(samples, np.float64) * 32768.0
  length, shift = int(rate * 0.025), int(rate * 0.010)
  if len(x) < length:
    return np.zeros((0, num_bins))
  frames = 1 + (len(x) - length) // shift
  fft_size = 1 << (length - 1).bit_length()
  window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / (length - 1))) ** 0.85
  banks = mel_banks(num_bins, fft_size, rate)
  out = np.zeros((frames, num_bins))
  for t in range(frames):
    frame = x[t * shift:t * shift + length].copy()
    frame -= frame.mean()
    frame[1:] -= 0.97 * frame[:-1].copy()
    frame[0] -= 0.97 * frame[0]
    spectrum = np.abs(np.fft.rfft(frame * window, fft_size)) ** 2
    out[t] = np.log(np.maximum(banks @ spectrum[:fft_size // 2], np.finfo(np.float32).eps))
  return out
