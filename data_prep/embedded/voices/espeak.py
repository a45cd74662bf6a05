"""Speech synthesis with espeak-ng through the `espeakng-loader` wheel (pip only, no root).

libespeak-ng is driven through ctypes in synchronous mode; audio comes back through the synth
callback as 16-bit mono PCM at the library's sample rate (22050 Hz). The library keeps global
state, so each process owns one `Synthesizer`.

Determinism: most of espeak-ng's voice variants (all its female ones but `shelby`) add flutter
and roughness, whose phase carries over from one utterance to the next, so the same text gives
different audio depending on what was synthesised before it. The synthesizer serves *steady*
copies of such variants (`f2-steady`: the variant with flutter and roughness off) from an
overlay of the wheel's data directory, and loads the voice and resets the random seed before
each utterance (a variant's echo, e.g. f5's, would carry over otherwise), so a voice gives the
same samples for the same text in any order and any process.
"""

import ctypes
import os
import tempfile

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep.embedded.voices.common import Voice

AUDIO_OUTPUT_SYNCHRONOUS = 2
POS_CHARACTER = 1
ESPEAK_CHARS_UTF8 = 1
ESPEAK_RATE, ESPEAK_PITCH = 1, 3
STEADY_SUFFIX = "-steady"
STEADY_SETTINGS = "\nflutter 0\nroughness 0\n"   # appended: later lines override earlier ones
SEED = 0
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.c_void_p)


def _variants_dir(data_dir: str) -> str:
  return os.path.join(data_dir, "voices", "!v")


def overlay_data_dir(data_dir: str, out: str) -> str:
  """An espeak-ng data directory under `out` that links every entry of `data_dir` (voice
  variants one by one, so that steady copies can be added beside them); returns its path."""
  overlay = os.path.join(out, "espeak-ng-data")
  os.makedirs(_variants_dir(overlay))
  for name in os.listdir(data_dir):
    if name != "voices":
      os.symlink(os.path.join(data_dir, name), os.path.join(overlay, name))
  for name in os.listdir(os.path.join(data_dir, "voices")):
    if name != "!v":
      os.symlink(os.path.join(data_dir, "voices", name), os.path.join(overlay, "voices", name))
  for name in os.listdir(_variants_dir(data_dir)):
    os.symlink(os.path.join(_variants_dir(data_dir), name),
               os.path.join(_variants_dir(overlay), name))
  return overlay


class Synthesizer:
  def __init__(self):
    import espeakng_loader  # pylint: disable=import-outside-toplevel
    self.lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
    self.lib.espeak_Initialize.restype = ctypes.c_int
    self._overlay = tempfile.TemporaryDirectory(prefix="espeak-ng-")   # lives with self
    self.data_dir = overlay_data_dir(espeakng_loader.get_data_path(), self._overlay.name)
    rate = self.lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data_dir.encode(), 0)
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

  def _add_steady_variant(self, variant: str):
    """Writes `{name}-steady` beside variant `name` in the overlay (once)."""
    variants = _variants_dir(self.data_dir)
    path = os.path.join(variants, variant)
    name = variant[:-len(STEADY_SUFFIX)]
    if os.path.exists(path):
      return
    if not os.path.exists(os.path.join(variants, name)):
      valid = sorted(n for n in os.listdir(variants) if not n.endswith(STEADY_SUFFIX))
      raise InvalidValue(f"espeak-ng has no voice variant {name!r} (asked for {variant!r}); "
                       f"valid: {', '.join(valid)}, each optionally with {STEADY_SUFFIX!r}")
    with open(os.path.join(variants, name), encoding="utf-8", errors="replace") as f:
      settings = f.read()
    with open(path, "w", encoding="utf-8") as f:
      f.write(settings + STEADY_SETTINGS)

  def set_voice(self, voice: Voice):
    """Loads `voice` afresh, even when it is the current one: loading clears the echo buffer
    that variants with an `echo` line (f5, Storm, ...) would otherwise carry into the next
    utterance."""
    if voice.variant.endswith(STEADY_SUFFIX):
      self._add_steady_variant(voice.variant)
    if self.lib.espeak_SetVoiceByName(voice.name.encode()) != 0:
      raise InvalidValue(f"espeak-ng has no voice {voice.name!r}")
    self.lib.espeak_SetParameter(ESPEAK_RATE, voice.rate, 0)
    self.lib.espeak_SetParameter(ESPEAK_PITCH, voice.pitch, 0)

  def synthesize(self, text: str, voice: Voice) -> np.ndarray:
    """int16 samples at `self.sample_rate`."""
    self.set_voice(voice)
    self.lib.espeak_ng_SetRandSeed(SEED)
    self._chunks = []
    data = text.encode("utf-8") + b"\0"
    self.lib.espeak_Synth(data, len(data), 0, POS_CHARACTER, 0, ESPEAK_CHARS_UTF8, None, None)
    self.lib.espeak_Synchronize()
    if not self._chunks:
      return np.zeros(0, np.int16)
    return np.concatenate(self._chunks).astype(np.int16)
