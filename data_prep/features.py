"""Kaldi-compatible log-mel filterbank features, CMVN and SpecAugment (fairseq's recipe).

fbank: 80 bins, 25 ms window / 10 ms shift, povey window, pre-emphasis 0.97, no dither, on
the waveform scaled to the 16-bit range (kaldi-native-fbank, as torchaudio's kaldi.fbank).
"""

import dataclasses
import math

import numpy as np

NUM_MEL_BINS = 80
VARIANCE_FLOOR = 1e-10


def fbank(samples: np.ndarray, sample_rate: int = 16000,
          num_mel_bins: int = NUM_MEL_BINS) -> np.ndarray:
  """float samples in [-1, 1] -> [frames, num_mel_bins] float32."""
  import kaldi_native_fbank as knf  # pylint: disable=import-outside-toplevel
  opts = knf.FbankOptions()
  opts.frame_opts.samp_freq = sample_rate
  opts.frame_opts.dither = 0.0
  opts.frame_opts.frame_length_ms = 25.0
  opts.frame_opts.frame_shift_ms = 10.0
  opts.frame_opts.preemph_coeff = 0.97
  opts.frame_opts.window_type = "povey"
  opts.mel_opts.num_bins = num_mel_bins
  computer = knf.OnlineFbank(opts)
  computer.accept_waveform(sample_rate, (np.asarray(samples, np.float32) * 32768.0).tolist())
  computer.input_finished()
  frames = computer.num_frames_ready
  if frames == 0:
    return np.zeros((0, num_mel_bins), np.float32)
  return np.stack([computer.get_frame(i) for i in range(frames)]).astype(np.float32)


def utterance_cmvn(features: np.ndarray) -> np.ndarray:
  """fairseq UtteranceCMVN: per-utterance mean and std (variance floored at 1e-10)."""
  mean = features.mean(axis=0)
  var = np.maximum((features.astype(np.float64) ** 2).mean(axis=0) - mean.astype(np.float64) ** 2,
                   VARIANCE_FLOOR)
  return ((features - mean) / np.sqrt(var)).astype(np.float32)


@dataclasses.dataclass
class GlobalCMVNStats:
  """Running sums for fairseq's GlobalCMVN (mean/std over training frames)."""
  count: int = 0
  total: np.ndarray | None = None
  total_sq: np.ndarray | None = None

  def add(self, features: np.ndarray):
    f = features.astype(np.float64)
    self.total = f.sum(0) if self.total is None else self.total + f.sum(0)
    self.total_sq = (f ** 2).sum(0) if self.total_sq is None else self.total_sq + (f ** 2).sum(0)
    self.count += len(f)

  def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
    mean = self.total / max(self.count, 1)
    var = np.maximum(self.total_sq / max(self.count, 1) - mean ** 2, VARIANCE_FLOOR)
    return mean.astype(np.float32), np.sqrt(var).astype(np.float32)


def global_cmvn(features: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
  return ((features - mean) / std).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SpecAugment:
  """fairseq's SpecAugmentTransform; defaults are the "lb" policy of the S2T recipe."""
  freq_mask_n: int = 1
  freq_mask_f: int = 27
  time_mask_n: int = 1
  time_mask_t: int = 100
  time_mask_p: float = 1.0

  def __call__(self, features: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Masks with the spectrogram's mean; randomness only from `rng` (seeded by the caller
    from the run seed, epoch and utterance, so a resumed run sees the same masks)."""
    out = features.copy()
    frames, bins = out.shape
    value = features.mean()
    for _ in range(self.freq_mask_n):
      f = int(rng.integers(0, self.freq_mask_f))
      f0 = int(rng.integers(0, max(bins - f, 1)))
      if f:
        out[:, f0:f0 + f] = value
    max_t = min(self.time_mask_t, math.floor(frames * self.time_mask_p))
    if max_t < 1:
      return out
    for _ in range(self.time_mask_n):
      t = int(rng.integers(0, max_t))
      t0 = int(rng.integers(0, max(frames - t, 1)))
      if t:
        out[t0:t0 + t, :] = value
    return out
