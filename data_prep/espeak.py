"""Speech synthesis with espeak-ng through the `espeakng-loader` wheel (pip only, no root).

libespeak-ng is driven through ctypes in synchronous mode; audio comes back through the synth
callback as 16-bit mono PCM at the library's sample rate (22050 Hz). The library keeps global
state, so each process owns one `Synthesizer`.
"""

import ctypes
import dataclasses

import numpy as np

AUDIO_OUTPUT_SYNCHRONOUS = 2
POS_CHARACTER = 1
ESPEAK_CHARS_UTF8 = 1
ESPEAK_RATE, ESPEAK_PITCH = 1, 3
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.c_void_p)


@dataclasses.dataclass(frozen=True)
class Voice:
  """A synthetic speaker: espeak voice + variant, words per minute, pitch (0-99)."""
  language: str     # espeak voice name, e.g. "en-us", "de"
  variant: str      # e.g. "m3", "f2"
  rate: int
  pitch: int

  @property
  def name(self):
    return f"{self.language}+{self.variant}"

  @property
  def speaker_id(self):
    return f"{self.language}_{self.variant}_r{self.rate}_p{self.pitch}"


class Synthesizer:
  def __init__(self):
    import espeakng_loader  # pylint: disable=import-outside-toplevel
    self.lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
    self.lib.espeak_Initialize.restype = ctypes.c_int
    rate = self.lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                      espeakng_loader.get_data_path().encode(), 0)
    if rate <= 0:
      raise RuntimeError(f"espeak-ng failed to initialise (data: "
                         f"{espeakng_loader.get_data_path()})")
    self.sample_rate = rate
    self._chunks = []

    def collect(samples, count, _events):
      if count > 0:
        self._chunks.append(np.ctypeslib.as_array(samples, shape=(count,)).copy())
      return 0
    self._callback = _CALLBACK(collect)     # kept alive as long as the synthesizer
    self.lib.espeak_SetSynthCallback(self._callback)
    self._voice = None

  def set_voice(self, voice: Voice):
    if voice == self._voice:
      return
    if self.lib.espeak_SetVoiceByName(voice.name.encode()) != 0:
      raise ValueError(f"espeak-ng has no voice {voice.name!r}")
    self.lib.espeak_SetParameter(ESPEAK_RATE, voice.rate, 0)
    self.lib.espeak_SetParameter(ESPEAK_PITCH, voice.pitch, 0)
    self._voice = voice

  def synthesize(self, text: str, voice: Voice) -> np.ndarray:
    """int16 samples at `self.sample_rate`."""
    self.set_voice(voice)
    self._chunks = []
    data = text.encode("utf-8") + b"\0"
    self.lib.espeak_Synth(data, len(data), 0, POS_CHARACTER, 0, ESPEAK_CHARS_UTF8, None, None)
    self.lib.espeak_Synchronize()
    if not self._chunks:
      return np.zeros(0, np.int16)
    return np.concatenate(self._chunks).astype(np.int16)
