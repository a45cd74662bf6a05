"""Kaldi-compatible log-mel filterbank features, CMVN and SpecAugment (fairseq's recipe).

fbank: Kaldi's compute-fbank-feats as fairseq uses it (torchaudio's kaldi.fbank): 80 bins from
20 Hz to Nyquist, 25 ms window / 10 ms shift (snip edges), DC offset removed, pre-emphasis 0.97,
povey window, 512-point power spectrum, log floored at float32's epsilon, no dither, on the
waveform scaled to the 16-bit range. Computed for all frames at once in numpy (float64);
tests/test_data.py checks it against kaldi-native-fbank and a frame-by-frame numpy
transcription of Kaldi.
"""

import dataclasses
import functools
import math

import numpy as np

from multiformer_common.errors import InvalidValue

NUM_MEL_BINS = 80
VARIANCE_FLOOR = 1e-10
FRAME_LENGTH_S, FRAME_SHIFT_S = 0.025, 0.010
PREEMPHASIS = 0.97
LOW_FREQ = 20.0


def _mel(hz):
  return 1127.0 * np.log(1.0 + hz / 700.0)


def _mel_filter_lefts(sample_rate: int, num_mel_bins: int):
  """(left edges [bins] in mel, spacing in mel) of the triangular filters, equally spaced on
  Kaldi's mel scale from LOW_FREQ to Nyquist; a filter's centre is its left edge + spacing."""
  mel_low, mel_high = _mel(LOW_FREQ), _mel(sample_rate / 2)
  delta = (mel_high - mel_low) / (num_mel_bins + 1)
  return mel_low + np.arange(num_mel_bins) * delta, delta


@functools.lru_cache(maxsize=None)
def _fbank_constants(sample_rate: int, num_mel_bins: int):
  """(frame length, shift, FFT size, povey window [length], mel banks [fft_size/2, bins])."""
  length, shift = frame_geometry(sample_rate)
  fft_size = 1 << (length - 1).bit_length()
  n = np.arange(length)
  window = (0.5 - 0.5 * np.cos(2 * np.pi * n / (length - 1))) ** 0.85
  # Triangular filters equally spaced on Kaldi's mel scale; the FFT bins below Nyquist.
  left, delta = _mel_filter_lefts(sample_rate, num_mel_bins)
  left = left[:, None]                                                 # [bins, 1]
  center, right = left + delta, left + 2 * delta
  bin_mels = _mel(np.arange(fft_size // 2) * sample_rate / fft_size)[None, :]
  weights = np.minimum((bin_mels - left) / (center - left), (right - bin_mels) / (right - center))
  banks = np.where((bin_mels > left) & (bin_mels < right), weights, 0.0)  # [bins, fft/2]
  return length, shift, fft_size, window, np.ascontiguousarray(banks.T)


def frame_geometry(sample_rate: int = 16000) -> tuple[int, int]:
  """(window length, shift) in samples of the analysis frames: 25 ms and 10 ms."""
  return int(sample_rate * FRAME_LENGTH_S), int(sample_rate * FRAME_SHIFT_S)


def num_frames(samples: int, sample_rate: int = 16000) -> int:
  """How many frames `fbank` gives for this many samples (snip edges: whole windows only)."""
  length, shift = frame_geometry(sample_rate)
  return 0 if samples < length else 1 + (samples - length) // shift


def fbank(samples: np.ndarray, sample_rate: int = 16000,
          num_mel_bins: int = NUM_MEL_BINS) -> np.ndarray:
  """float samples in [-1, 1] -> [frames, num_mel_bins] float32."""
  length, shift, fft_size, window, banks = _fbank_constants(sample_rate, num_mel_bins)
  x = np.asarray(samples, np.float64) * 32768.0
  count = num_frames(len(x), sample_rate)
  if count == 0:
    return np.zeros((0, num_mel_bins), np.float32)
  frames = np.lib.stride_tricks.sliding_window_view(x, length)[::shift][:count]  # [T, length]
  frames = frames - frames.mean(axis=1, keepdims=True)
  emphasised = np.empty_like(frames)
  np.multiply(frames[:, :-1], -PREEMPHASIS, out=emphasised[:, 1:])
  emphasised[:, 1:] += frames[:, 1:]
  emphasised[:, 0] = frames[:, 0] * (1.0 - PREEMPHASIS)
  emphasised *= window
  spectrum = np.fft.rfft(emphasised, fft_size, axis=1)[:, :fft_size // 2]   # [T, fft/2]
  power = spectrum.real ** 2 + spectrum.imag ** 2
  energies = np.maximum(power @ banks, np.finfo(np.float32).eps)           # [T, bins]
  return np.log(energies).astype(np.float32)


def speed_perturb(samples: np.ndarray, factor: float, sample_rate: int = 16000) -> np.ndarray:
  """Kaldi's speed perturbation (sox `speed`): the audio played `factor` times as fast, tempo
  and pitch together: len(samples) / factor samples, resampled with soxr."""
  if factor <= 0:
    raise InvalidValue(f"speed perturbation factor {factor}; valid: > 0 (Kaldi: 0.9, 1.0, 1.1)")
  if factor == 1.0:
    return samples
  import soxr  # pylint: disable=import-outside-toplevel
  return soxr.resample(np.asarray(samples, np.float32), sample_rate * factor,
                       sample_rate).astype(np.float32)


def utterance_cmvn(features: np.ndarray) -> np.ndarray:
  """fairseq UtteranceCMVN: per-utterance mean and std (variance floored at 1e-10)."""
  mean = features.mean(axis=0)
  var = np.maximum((features.astype(np.float64) ** 2).mean(axis=0) - mean.astype(np.float64) ** 2,
                   VARIANCE_FLOOR)
  return ((features - mean) / np.sqrt(var)).astype(np.float32)


def utterance_cmvn_in_place(features: np.ndarray, scratch: np.ndarray | None = None):
  """utterance_cmvn of float32 `features` [frames, bins], written over them: the same
  arithmetic (bit-identical results: tests/test_loader.py) in a float64 `scratch` of at least
  that shape instead of new temporaries. The squares are summed frame after frame as numpy's
  mean over axis 0 sums them; the division is in float64, rounded once to float32."""
  frames = len(features)
  wide = (np.empty(features.shape) if scratch is None else scratch)[:frames]   # [frames, bins]
  mean = features.mean(axis=0)
  np.copyto(wide, features)
  squares = np.einsum("ij,ij->j", wide, wide)                                   # [bins]
  var = np.maximum(squares / frames - mean.astype(np.float64) ** 2, VARIANCE_FLOOR)
  np.subtract(features, mean, out=features)
  np.copyto(wide, features)
  wide /= np.sqrt(var)
  np.copyto(features, wide, casting="same_kind")


@dataclasses.dataclass
class GlobalCMVNStats:
  """Running sums for fairseq's GlobalCMVN (mean/std over training frames)."""
  count: int = 0
  total: np.ndarray | None = None
  total_sq: np.ndarray | None = None

  def add(self, features: np.ndarray):
    f = features.astype(np.float64)
    self.add_sums(len(f), f.sum(0), (f ** 2).sum(0))

  def add_sums(self, count: int, total: np.ndarray, total_sq: np.ndarray):
    """Adds the sums of frames counted elsewhere (e.g. one prepared shard's)."""
    self.total = total if self.total is None else self.total + total
    self.total_sq = total_sq if self.total_sq is None else self.total_sq + total_sq
    self.count += count

  def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
    mean = self.total / max(self.count, 1)
    var = np.maximum(self.total_sq / max(self.count, 1) - mean ** 2, VARIANCE_FLOOR)
    return mean.astype(np.float32), np.sqrt(var).astype(np.float32)


def global_cmvn(features: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
  return ((features - mean) / std).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SpecAugment:
  """fairseq's SpecAugmentTransform without time warping; defaults are the "lb" policy of the
  S2T recipe. A time mask is at most `time_mask_t` frames and at most `time_mask_p` of the
  utterance, so policies with p < 1 scale their masks to short utterances."""
  freq_mask_n: int = 1
  freq_mask_f: int = 27
  time_mask_n: int = 1
  time_mask_t: int = 100
  time_mask_p: float = 1.0

  def __post_init__(self):
    for name in ("freq_mask_n", "freq_mask_f", "time_mask_n", "time_mask_t"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise InvalidValue(f"SpecAugment {name}={value!r}; valid: an integer >= 0")
    if not 0.0 <= self.time_mask_p <= 1.0:
      raise InvalidValue(f"SpecAugment time_mask_p={self.time_mask_p!r}; valid: 0 <= p <= 1")

  @classmethod
  def from_policy(cls, policy: str) -> "SpecAugment":
    """A named policy of the SpecAugment paper (fairseq's prep scripts: lb, ld, sm, ss),
    optionally followed by field overrides: "sm" or "sm,time_mask_p=0.1,time_mask_n=1"."""
    name, *overrides = [part.strip() for part in policy.split(",")]
    if name not in SPECAUGMENT_POLICIES:
      raise InvalidValue(f"SpecAugment policy {policy!r}: {name!r} is not a policy; valid: "
                       f"{', '.join(SPECAUGMENT_POLICIES)}, each optionally followed by "
                       f"',field=value' with fields {', '.join(SPECAUGMENT_FIELDS)}")
    fields = dict(SPECAUGMENT_POLICIES[name])
    for item in overrides:
      key, sep, value = item.partition("=")
      key = key.strip()
      if not sep or key not in SPECAUGMENT_FIELDS:
        raise InvalidValue(f"SpecAugment policy {policy!r}: {item!r} is not field=value; valid "
                         f"fields: {', '.join(SPECAUGMENT_FIELDS)}")
      kind = float if key == "time_mask_p" else int
      try:
        fields[key] = kind(value)
      except ValueError:
        raise InvalidValue(f"SpecAugment policy {policy!r}: {key}={value!r} is not "
                         f"{'a number' if kind is float else 'an integer'}") from None
    return cls(**fields)

  def __call__(self, features: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Masks with the spectrogram's mean; randomness only from `rng` (seeded by the caller
    from the run seed, epoch and utterance, so a resumed run sees the same masks)."""
    out = features.copy()
    self.apply_in_place(out, rng)
    return out

  def apply_in_place(self, out: np.ndarray, rng: np.random.Generator):
    """What __call__ returns, written over `out`."""
    frames, bins = out.shape
    value = out.mean()
    for _ in range(self.freq_mask_n):
      f = int(rng.integers(0, self.freq_mask_f))
      f0 = int(rng.integers(0, max(bins - f, 1)))
      if f:
        out[:, f0:f0 + f] = value
    max_t = min(self.time_mask_t, math.floor(frames * self.time_mask_p))
    if max_t < 1:
      return
    for _ in range(self.time_mask_n):
      t = int(rng.integers(0, max_t))
      t0 = int(rng.integers(0, max(frames - t, 1)))
      if t:
        out[t0:t0 + t, :] = value


# The policies of the SpecAugment paper (Park et al., 2019, table 1) as fairseq's S2T prep
# scripts name them, less time warping (W: fairseq warps with cv2; this transform does not).
SPECAUGMENT_POLICIES = {
    "lb": dict(freq_mask_n=1, freq_mask_f=27, time_mask_n=1, time_mask_t=100, time_mask_p=1.0),
    "ld": dict(freq_mask_n=2, freq_mask_f=27, time_mask_n=2, time_mask_t=100, time_mask_p=1.0),
    "sm": dict(freq_mask_n=2, freq_mask_f=15, time_mask_n=2, time_mask_t=70, time_mask_p=0.2),
    "ss": dict(freq_mask_n=2, freq_mask_f=27, time_mask_n=2, time_mask_t=70, time_mask_p=0.2),
}
SPECAUGMENT_FIELDS = tuple(f.name for f in dataclasses.fields(SpecAugment))
