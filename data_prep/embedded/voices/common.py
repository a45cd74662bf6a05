"""What every synthesizer of the embedded corpus shares: the speaker (`Voice`), the error for a
synthesizer that cannot be had, rate and pitch in each engine's terms, and the helpers that run
Debian's programs and libraries from the package cache (`multiformer_common.packages`).

`Voice.rate` is words per minute as espeak-ng's (175 = each synthesizer's own speed) and
`Voice.pitch` 0-99 as espeak-ng's (50 = the voice's own).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile
import wave

import numpy as np

from multiformer_common import packages

NATURAL_RATE = 175           # espeak-ng's default words per minute: duration stretch 1
LIB_DIR = os.path.join("usr", "lib", "x86_64-linux-gnu")


@dataclasses.dataclass(frozen=True)
class Voice:
  """A synthetic speaker: voice + variant, words per minute, pitch (0-99), and the synthesizer
  (`engine`, a name of voices.ENGINES), whose variants are its voices (e.g. flite's "slt")."""
  language: str     # espeak voice name, e.g. "en-us", "de"
  variant: str      # e.g. "m3", "f2"; flite: kal16, awb, rms, slt; festival: kal_diphone;
                    # mbrola: us1, us2, us3, en1
  rate: int
  pitch: int
  engine: str = "espeak"

  @property
  def name(self):
    return f"{self.language}+{self.variant}"

  @property
  def speaker_id(self):
    prefix = self.language if self.engine == "espeak" else f"{self.engine}-{self.language}"
    return f"{prefix}_{self.variant}_r{self.rate}_p{self.pitch}"


def voice_names(voices_by_sex: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
  """Every voice of a synthesizer's {sex: voices} (FLITE_VOICES, ...), in its order."""
  return tuple(name for names in voices_by_sex.values() for name in names)


class SynthesizerUnavailable(packages.PackageUnavailable):
  """A synthesizer that cannot be fetched or run here."""


def duration_stretch(rate: int) -> float:
  """A speaker's words per minute -> the synthesizers' duration stretch (> 1: slower)."""
  return NATURAL_RATE / float(rate)


def pitch_factor(pitch: int) -> float:
  """A speaker's pitch 0-99 (espeak-ng's, 50 = the voice's own) -> the factor on the voice's
  F0: +-1/2 octave over the range."""
  return 2.0 ** ((pitch - 50) / 100.0)


def read_wav(path: str) -> tuple[np.ndarray, int]:
  """(int16 samples, rate) of a 16-bit mono wav file."""
  with wave.open(path, "rb") as f:
    if f.getsampwidth() != 2 or f.getnchannels() != 1:
      raise SynthesizerUnavailable(f"{path}: expected 16-bit mono audio from the synthesizer")
    return np.frombuffer(f.readframes(f.getnframes()), "<i2").copy(), f.getframerate()


def int16_at(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
  """int16 samples at `rate` -> int16 samples at `target` (soxr)."""
  if rate == target:
    return samples
  import soxr  # pylint: disable=import-outside-toplevel
  resampled = soxr.resample(samples.astype(np.float32), rate, target)
  return np.clip(np.round(resampled), -32768, 32767).astype(np.int16)


def unpacked(names, cache_dir: str, what: str) -> dict[str, str]:
  """{package: its unpacked folder} of Debian's `names`, fetched into `cache_dir` if needed."""
  try:
    return packages.fetch_all(names, cache_dir)
  except packages.PackageUnavailable as error:
    raise SynthesizerUnavailable(f"{what} is not available ({error}); it is built from "
                                 f"Debian's {', '.join(names)}") from error


def assembled_dir(cache_dir: str, name: str, names, assemble) -> str:
  """{cache_dir}/{name}-{key of the packages `names`}, made once by assemble(staging folder)
  and moved into place whole: a folder assembled from fewer packages (voices) is never reused."""
  key = hashlib.sha1(" ".join(names).encode()).hexdigest()[:8]
  path = os.path.join(cache_dir, f"{name}-{key}")
  if not os.path.isdir(path):
    os.makedirs(cache_dir, exist_ok=True)
    # Each process its own staging folder: two runs assembling at once never share one.
    staging = tempfile.mkdtemp(prefix=f"{name}-{key}.tmp", dir=cache_dir)
    try:
      os.rmdir(staging)                       # assemble() makes it
      assemble(staging)
      packages.move_into_place(staging, path)
    finally:
      shutil.rmtree(staging, ignore_errors=True)
  return path


def libsndfile_dir(cache_dir: str) -> str:
  """A folder holding libsndfile.so.1: the `soundfile` wheel's copy, for the Debian programs
  that link it (festival; espeak-ng through libpulse0)."""
  libs = os.path.join(cache_dir, "festival-libsndfile")
  os.makedirs(libs, exist_ok=True)
  if not os.path.exists(os.path.join(libs, "libsndfile.so.1")):
    os.symlink(bundled_libsndfile(), os.path.join(libs, "libsndfile.so.1"))
  return libs


def library_path(roots) -> str:
  dirs = []
  for root in roots:
    for sub in (LIB_DIR, os.path.join(LIB_DIR, "pulseaudio")):
      if os.path.isdir(os.path.join(root, sub)):
        dirs.append(os.path.join(root, sub))
  return os.pathsep.join(dirs + [os.environ.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)


def run(command, env, what: str, text_input=None):
  try:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                          check=False, input=text_input)
  except (OSError, subprocess.TimeoutExpired) as error:
    raise SynthesizerUnavailable(f"{what} could not run: {error}") from error
  if done.returncode:
    raise SynthesizerUnavailable(f"{what} failed (exit {done.returncode}): "
                                 f"{(done.stderr or done.stdout).strip()[-300:]}")


def bundled_libsndfile() -> str:
  try:
    import soundfile  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise SynthesizerUnavailable("festival needs libsndfile: pip install soundfile") from error
  path = os.path.join(os.path.dirname(soundfile.__file__), "_soundfile_data",
                      "libsndfile_x86_64.so")
  if not os.path.exists(path):
    raise SynthesizerUnavailable(f"festival needs libsndfile; not found at {path} (install "
                                 f"Debian's libsndfile1)")
  return path
