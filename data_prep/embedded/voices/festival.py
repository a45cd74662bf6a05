"""festival (2.5) from Debian's packages, run as a program, with its `kal_diphone` and
`ked_diphone` voices (festvox-kallpc16k and festvox-kdlpc16k, 16 kHz); a speaker's rate is
festival's Duration_Stretch. kal_diphone is made of the same speaker's diphones as flite's kal16
(voices.SAME_SPEAKER). festival links libsndfile, which Debian packages with a dozen codec
libraries; the copy bundled in the `soundfile` wheel (a requirement) stands in for it."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep.embedded.voices.common import (SynthesizerUnavailable, assembled_dir,
                                              duration_stretch, library_path, libsndfile_dir,
                                              read_wav, run, unpacked)


VOICES = {"male": ("kal_diphone", "ked_diphone")}
PACKAGES = ("festival", "libestools2.5", "libpulse0", "libasyncns0", "festlex-cmu",
            "festlex-poslex", "festvox-kallpc16k", "festvox-kdlpc16k")
FESTIVAL_DIR = os.path.join("usr", "share", "festival")


def _scheme_string(text: str) -> str:
  return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Festival:
  """festival as a program: synthesize(text, voice) -> int16 samples at `sample_rate`."""

  sample_rate = 16000

  def __init__(self, cache_dir: str):
    roots = unpacked(PACKAGES, cache_dir, "festival")
    self.binary = os.path.join(roots["festival"], "usr", "bin", "festival")

    def assemble(staging):
      """One festival library folder: the program's scheme files, the lexicons and the voices."""
      shutil.copytree(os.path.join(roots["festival"], FESTIVAL_DIR), staging, symlinks=True)
      for package in PACKAGES:
        source = os.path.join(roots[package], FESTIVAL_DIR)
        if package != "festival" and os.path.isdir(source):
          shutil.copytree(source, staging, dirs_exist_ok=True, symlinks=True)

    self.lib_dir = assembled_dir(cache_dir, "festival-lib", PACKAGES, assemble)
    self.env = dict(os.environ, LD_LIBRARY_PATH=library_path(roots.values()) + os.pathsep +
                    libsndfile_dir(cache_dir))
    self._work = tempfile.TemporaryDirectory(prefix="festival-")

  def synthesize(self, text: str, voice) -> np.ndarray:
    if voice.variant not in VOICES["male"]:
      raise InvalidValue(f"festival voice {voice.variant!r}; valid: {VOICES['male']}")
    out = os.path.join(self._work.name, "out.wav")
    script = os.path.join(self._work.name, "say.scm")
    with open(script, "w", encoding="utf-8") as f:
      f.write(f'(set! lexdir {_scheme_string(os.path.join(self.lib_dir, "dicts") + "/")})\n'
              f"(voice_{voice.variant})\n"
              f"(Parameter.set 'Duration_Stretch {duration_stretch(voice.rate):.3f})\n"
              f"(set! utt (Utterance Text {_scheme_string(text)}))\n"
              f"(utt.synth utt)\n"
              f"(utt.save.wave utt {_scheme_string(out)} 'riff)\n")
    run([self.binary, "--libdir", self.lib_dir + "/", "--datadir", self.lib_dir + "/", "-b",
          script], self.env, "festival")
    samples, rate = read_wav(out)
    if rate != self.sample_rate:
      raise SynthesizerUnavailable(f"festival voice {voice.variant} speaks at {rate} Hz")
    return samples
