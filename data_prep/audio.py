"""Reading a talk's audio and cutting segments, repairing what can be repaired.

Multi-channel audio is downmixed and other sample rates are resampled to 16 kHz (noted, not
skipped); unreadable, empty or unsupported files and segments past the end of their audio
raise AudioError with the reason, which the preparation counts and reports.
"""

import os

import numpy as np

SAMPLE_RATE = 16000
# A segment may end this far past the audio (rounding in the yaml) and is then clipped.
END_TOLERANCE_S = 0.05


class AudioError(Exception):
  """A talk or segment that cannot be used; `reason` is the report's category."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason


def load_audio(path: str) -> tuple[np.ndarray, list[str]]:
  """-> (float32 mono samples in [-1, 1] at 16 kHz, repairs made)."""
  import soundfile  # pylint: disable=import-outside-toplevel
  if path.endswith(".m4a"):
    raise AudioError("unsupported audio format", f"{path}: convert .m4a to 16 kHz wav or flac")
  if not os.path.exists(path):          # libsndfile reports it only as a "System error"
    raise AudioError("missing audio file", path)
  try:
    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
  except FileNotFoundError as e:
    raise AudioError("missing audio file", path) from e
  except Exception as e:  # libsndfile: corrupt header, unknown format, ...
    raise AudioError("unreadable audio", f"{path}: {e}") from e
  repairs = []
  if samples.shape[1] > 1:
    samples = samples.mean(axis=1, keepdims=True)
    repairs.append("downmixed to mono")
  samples = samples[:, 0]
  if samples.size == 0:
    raise AudioError("empty audio", path)
  if rate != SAMPLE_RATE:
    import soxr  # pylint: disable=import-outside-toplevel
    samples = soxr.resample(samples, rate, SAMPLE_RATE).astype(np.float32)
    repairs.append(f"resampled {rate} Hz -> {SAMPLE_RATE} Hz")
  return samples, repairs


def cut_segment(samples: np.ndarray, offset: float, duration: float) -> np.ndarray:
  start = int(round(offset * SAMPLE_RATE))
  end = int(round((offset + duration) * SAMPLE_RATE))
  if duration <= 0 or start < 0:
    raise AudioError("invalid segment timing", f"offset {offset}, duration {duration}")
  if start >= len(samples) or end > len(samples) + END_TOLERANCE_S * SAMPLE_RATE:
    raise AudioError("segment past end of audio",
                     f"ends at {offset + duration:.2f}s, audio is {len(samples) / SAMPLE_RATE:.2f}s")
  return samples[start:min(end, len(samples))]
