"""MBROLA (3.3) diphone voices read by Debian's espeak-ng (its text analysis, durations and
intonation; the espeakng-loader wheel's library is built without MBROLA), run as a program:
`us1` (female), `us2`, `us3` (American male), `en1` (British male) and English read with other
languages' diphones (an accent). The voices are in Debian's non-free section (licensed for
speech made with the MBROLA program only, not to be sold; /usr/share/doc/mbrola-us1/copyright in
the package); `multiformer_common.packages` finds
them where the machine's apt lists main only.
A speaker's rate and pitch are espeak-ng's -s and -p."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep.embedded.voices.common import (LIB_DIR, assembled_dir, int16_at, library_path,
                                              libsndfile_dir, read_wav, run, unpacked,
                                              voice_names)


# Voice names are espeak-ng's (mb-{name}); "de4-en" is English spoken with MBROLA's German de4
# diphones (an accent), "us1" American English.
VOICES = {
    "male": ("us2", "us3", "en1", "af1-en", "de2-en", "de4-en", "de6-en", "fr1-en", "gr2-en",
             "nl2-en", "pl1-en", "ro1-en", "sw1-en"),
    "female": ("us1", "de1-en", "de3-en", "de5-en", "fr4-en", "hu1-en", "sw2-en")}


def database(voice: str) -> str:
  """The MBROLA diphone database of an espeak-ng mb- voice: "de4-en" -> "de4"."""
  return voice.split("-")[0]


PACKAGES = ("espeak-ng", "libespeak-ng1", "espeak-ng-data", "libpcaudio0", "libsonic0",
            "libpulse0", "libasyncns0", "mbrola") + tuple(dict.fromkeys(
                f"mbrola-{database(name)}" for name in voice_names(VOICES)))


class Mbrola:
  """espeak-ng's front end with MBROLA's diphone voices, as a program: synthesize(text, voice)
  -> int16 samples at `sample_rate`. A speaker's rate and pitch are espeak-ng's -s and -p."""

  sample_rate = 16000

  def __init__(self, cache_dir: str):
    roots = unpacked(PACKAGES, cache_dir, "espeak-ng with MBROLA voices")
    self.binary = os.path.join(roots["espeak-ng"], "usr", "bin", "espeak-ng")

    def assemble(staging):
      """One espeak-ng data folder (Debian's, which has the mb-* voices and their phoneme
      tables) with each MBROLA voice file at mbrola/{name}, where espeak-ng looks first."""
      data = os.path.join(staging, "espeak-ng-data")
      shutil.copytree(os.path.join(roots["espeak-ng-data"], LIB_DIR, "espeak-ng-data"), data,
                      symlinks=True)
      os.makedirs(os.path.join(data, "mbrola"), exist_ok=True)
      for package, root in roots.items():
        if package.startswith("mbrola-"):
          name = package[len("mbrola-"):]
          os.symlink(os.path.join(root, "usr", "share", "mbrola", name, name),
                     os.path.join(data, "mbrola", name))

    self.data_parent = assembled_dir(cache_dir, "mbrola-espeak-ng", PACKAGES, assemble)
    mbrola_bin = os.path.join(roots["mbrola"], "usr", "bin")   # espeak-ng runs `mbrola`
    self.env = dict(os.environ, LD_LIBRARY_PATH=library_path(roots.values()) + os.pathsep +
                    libsndfile_dir(cache_dir),
                    PATH=mbrola_bin + os.pathsep + os.environ.get("PATH", ""))
    self._work = tempfile.TemporaryDirectory(prefix="mbrola-")

  def synthesize(self, text: str, voice) -> np.ndarray:
    valid = voice_names(VOICES)
    if voice.variant not in valid:
      raise InvalidValue(f"MBROLA voice {voice.variant!r}; valid: {sorted(valid)}")
    out = os.path.join(self._work.name, "out.wav")
    run([self.binary, f"--path={self.data_parent}", "-v", f"mb-{voice.variant}", "-s",
          str(voice.rate), "-p", str(voice.pitch), "-w", out, "--stdin"], self.env,
         "espeak-ng with MBROLA", text_input=text)
    samples, rate = read_wav(out)
    return int16_at(samples, rate, self.sample_rate)   # some databases are 22.05 kHz (de6, ...)
