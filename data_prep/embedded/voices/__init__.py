"""The embedded corpus's voices: five synthesizer families behind one registry.

    from data_prep.embedded import voices
    samples = voices.speak("Hello.", voices.Voice("en-us", "slt", 175, 50, "flite"), cache_dir)
    voices.write_wav("hello.wav", samples)

- espeak (espeak-ng through the espeakng-loader wheel, in this process): `espeak.py`
- flite, festival, mbrola (Debian's programs, fetched into the package cache): `flite.py`,
  `festival.py`, `mbrola.py`
- rhvoice (Debian's library, in this process through ctypes): `rhvoice.py`

`common.py` holds what they share (`Voice`, `SynthesizerUnavailable`, rate and pitch in each
engine's terms). Every engine's `synthesize(text, voice)` gives int16 samples at its
`sample_rate`; `speak` resamples them to SAMPLE_RATE.
"""

from __future__ import annotations

import os
import wave

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common import atomic, packages
from data_prep.embedded.voices import espeak, festival, flite, mbrola, rhvoice
from data_prep.embedded.voices.common import SynthesizerUnavailable, Voice, voice_names

SAMPLE_RATE = 16000
ENGINES = ("espeak", "flite", "festival", "mbrola", "rhvoice")
# {engine: {sex: voice names}} of the engines whose voices are a fixed list (espeak-ng's
# variants are the corpus's VARIANTS_BY_SEX).
ENGINE_VOICES = {"flite": flite.VOICES, "festival": festival.VOICES, "mbrola": mbrola.VOICES,
                 "rhvoice": rhvoice.VOICES}
# (engine, voice) pairs built from one speaker's recordings: flite's kal16 is festival's KAL
# diphone database; RHVoice's slt and alan are flite's slt and awb. A split of voices never heard
# leaves out the twins of training voices.
_TWINS = ((("festival", "kal_diphone"), ("flite", "kal16")),
          (("rhvoice", "slt"), ("flite", "slt")), (("rhvoice", "alan"), ("flite", "awb")))
SAME_SPEAKER = {**dict(_TWINS), **{b: a for a, b in _TWINS}}

__all__ = ["ENGINES", "ENGINE_VOICES", "SAME_SPEAKER", "SAMPLE_RATE", "SynthesizerUnavailable",
           "Voice", "cache_dir", "engine", "speak", "voice_names", "write_wav"]


def cache_dir(root: str = "") -> str:
  """Where flite, festival, MBROLA and RHVoice are unpacked: {root}/synthesizers, root the
  package cache (default multiformer_common.packages.cache_root())."""
  return os.path.join(root or packages.cache_root(), "synthesizers")


_ENGINES = {}


def engine(name: str, cache: str):
  """This process's synthesizer `name` (made once; Debian's packages fetched into `cache`)."""
  if name not in ENGINES:
    raise InvalidValue(f"synthesizer {name!r}; valid: {', '.join(ENGINES)}")
  if name not in _ENGINES:
    _ENGINES[name] = (espeak.Synthesizer() if name == "espeak" else
                      {"flite": flite.Flite, "festival": festival.Festival,
                       "mbrola": mbrola.Mbrola, "rhvoice": rhvoice.Rhvoice}[name](cache))
  return _ENGINES[name]


def speak(text: str, voice: Voice, cache: str) -> np.ndarray:
  """float32 samples of `text` spoken by `voice`, at SAMPLE_RATE (its engine made once)."""
  synth = engine(voice.engine, cache)
  return _resample(synth.synthesize(text, voice), synth.sample_rate)


def _resample(samples: np.ndarray, rate: int) -> np.ndarray:
  import soxr  # pylint: disable=import-outside-toplevel
  return soxr.resample(samples.astype(np.float32) / 32768.0, rate, SAMPLE_RATE)


def write_wav(path: str, samples: np.ndarray, rate: int = SAMPLE_RATE):
  """Atomic 16-bit mono wav write (a reader never sees a half-written file)."""
  pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
  with atomic.atomic_open(path, "wb") as raw, wave.open(raw, "wb") as f:
    f.setnchannels(1)
    f.setsampwidth(2)
    f.setframerate(rate)
    f.writeframes(pcm.tobytes())
