"""flite (CMU Flite 2.2) from Debian's packages, run as a program: `kal16`, `awb`, `rms` (male)
and `slt` (female), 16 kHz. A speaker's rate is flite's duration_stretch, its pitch the
intonation model's mean F0."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep.embedded.voices.common import (SynthesizerUnavailable, duration_stretch,
                                              library_path, pitch_factor, read_wav, run, unpacked)


VOICES = {"male": ("kal16", "awb", "rms"), "female": ("slt",)}
F0 = {"kal16": 105.0, "awb": 110.0, "rms": 100.0, "slt": 180.0}   # Hz, the voice's own
PACKAGES = ("flite", "libflite1")


class Flite:
  """flite as a program: synthesize(text, voice) -> int16 samples at `sample_rate`."""

  sample_rate = 16000

  def __init__(self, cache_dir: str):
    roots = unpacked(PACKAGES, cache_dir, "flite")
    self.binary = os.path.join(roots["flite"], "usr", "bin", "flite")
    self.env = dict(os.environ, LD_LIBRARY_PATH=library_path(roots.values()))
    self._work = tempfile.TemporaryDirectory(prefix="flite-")

  def synthesize(self, text: str, voice) -> np.ndarray:
    if voice.variant not in F0:
      raise InvalidValue(f"flite voice {voice.variant!r}; valid: {sorted(F0)}")
    out = os.path.join(self._work.name, "out.wav")
    f0 = F0[voice.variant] * pitch_factor(voice.pitch)
    run([self.binary, "-voice", voice.variant, "--setf",
          f"duration_stretch={duration_stretch(voice.rate):.3f}", "--setf",
          f"int_f0_target_mean={f0:.1f}", "-t", text, "-o", out], self.env, "flite")
    samples, rate = read_wav(out)
    if rate != self.sample_rate:
      raise SynthesizerUnavailable(f"flite voice {voice.variant} speaks at {rate} Hz, not "
                                   f"{self.sample_rate}")
    return samples
