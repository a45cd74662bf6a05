"""RHVoice (1.8, statistical parametric, HTS-style) from Debian's rhvoice-english (non-free:
trained models; evgeniy-eng and lyubov are CC BY-NC-ND), its library called in this process
through ctypes: `alan`, `bdl`, `evgeniy-eng` (male), `clb`, `slt`, `lyubov` (female), 24 kHz
resampled to 16. bdl, clb and slt are CMU ARCTIC speakers; alan is Alan W Black's voice, as
flite's awb is; evgeniy-eng and lyubov are English read by Russian speakers."""

from __future__ import annotations

import ctypes
import os
import tempfile

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep.embedded.voices.common import (LIB_DIR, NATURAL_RATE, SynthesizerUnavailable,
                                              assembled_dir, int16_at, pitch_factor, unpacked,
                                              voice_names)


VOICES = {"male": ("alan", "bdl", "evgeniy-eng"), "female": ("clb", "slt", "lyubov")}
LIBRARY_PACKAGES = ("librhvoice5", "librhvoice-core7", "libsonic0")
PACKAGES = LIBRARY_PACKAGES + ("rhvoice-english",)
# RHVoice's callbacks: set_sample_rate(rate, user_data), play_speech(samples, count, user_data).
_RH_SAMPLE_RATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_RH_SPEECH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_uint,
                              ctypes.c_void_p)


class _RhvoiceCallbacks(ctypes.Structure):
  """RHVoice.h's RHVoice_callbacks: sample rate and speech; the rest NULL."""
  _fields_ = [("set_sample_rate", _RH_SAMPLE_RATE), ("play_speech", _RH_SPEECH),
              ("process_mark", ctypes.c_void_p), ("word_starts", ctypes.c_void_p),
              ("word_ends", ctypes.c_void_p), ("sentence_starts", ctypes.c_void_p),
              ("sentence_ends", ctypes.c_void_p), ("play_audio", ctypes.c_void_p),
              ("done", ctypes.c_void_p)]


class _RhvoiceInitParams(ctypes.Structure):
  """RHVoice.h's RHVoice_init_params (RHVoice 1.x)."""
  _fields_ = [("data_path", ctypes.c_char_p), ("config_path", ctypes.c_char_p),
              ("resource_paths", ctypes.POINTER(ctypes.c_char_p)),
              ("callbacks", _RhvoiceCallbacks), ("options", ctypes.c_uint)]


class _RhvoiceSynthParams(ctypes.Structure):
  """RHVoice.h's RHVoice_synth_params (RHVoice >= 1.2: with flags)."""
  _fields_ = [("voice_profile", ctypes.c_char_p), ("absolute_rate", ctypes.c_double),
              ("absolute_pitch", ctypes.c_double), ("absolute_volume", ctypes.c_double),
              ("relative_rate", ctypes.c_double), ("relative_pitch", ctypes.c_double),
              ("relative_volume", ctypes.c_double), ("punctuation_mode", ctypes.c_int),
              ("punctuation_list", ctypes.c_char_p), ("capitals_mode", ctypes.c_int),
              ("flags", ctypes.c_int)]


def _load_rhvoice(lib_dir: str):
  """libRHVoice from `lib_dir`, its own libraries loaded first by path (LD_LIBRARY_PATH is read
  when a process starts, not by ctypes)."""
  for name in ("libsonic.so.0", "libRHVoice_core.so.7"):
    ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)
  lib = ctypes.CDLL(os.path.join(lib_dir, "libRHVoice.so.5"))
  lib.RHVoice_new_tts_engine.restype = ctypes.c_void_p
  lib.RHVoice_new_tts_engine.argtypes = (ctypes.POINTER(_RhvoiceInitParams),)
  lib.RHVoice_new_message.restype = ctypes.c_void_p
  lib.RHVoice_new_message.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint,
                                      ctypes.c_int, ctypes.POINTER(_RhvoiceSynthParams),
                                      ctypes.c_void_p)
  lib.RHVoice_speak.argtypes = (ctypes.c_void_p,)
  lib.RHVoice_delete_message.argtypes = (ctypes.c_void_p,)
  lib.RHVoice_delete_message.restype = None
  return lib


class Rhvoice:
  """RHVoice's library, in this process through ctypes (its test program links audio output
  libraries and reads /usr/share/RHVoice; the library takes the data folder as an argument):
  synthesize(text, voice) -> int16 samples at `sample_rate`. A speaker's rate and pitch are
  RHVoice's relative rate (rate / 175) and relative pitch (+-1/2 octave over 0-99)."""

  sample_rate = 16000
  load_library = staticmethod(_load_rhvoice)

  def __init__(self, cache_dir: str):
    roots = unpacked(PACKAGES, cache_dir, "RHVoice")

    def assemble(staging):
      """The library packages' files in one folder, where each finds the others."""
      os.makedirs(staging)
      for package in LIBRARY_PACKAGES:
        lib_dir = os.path.join(roots[package], LIB_DIR)
        for name in os.listdir(lib_dir):
          os.symlink(os.path.join(lib_dir, name), os.path.join(staging, name))

    lib_dir = assembled_dir(cache_dir, "rhvoice-lib", LIBRARY_PACKAGES, assemble)
    try:
      self._lib = self.load_library(lib_dir)
    except OSError as error:       # another architecture, a library missing from the packages
      raise SynthesizerUnavailable(f"RHVoice's library could not be loaded from {lib_dir}: "
                                   f"{error}") from error
    self._config = tempfile.TemporaryDirectory(prefix="rhvoice-")   # no RHVoice.conf: defaults
    self._chunks, self._rate = [], 0
    # The callbacks must outlive the engine: kept on self.
    self._callbacks = _RhvoiceCallbacks(_RH_SAMPLE_RATE(self._on_sample_rate),
                                        _RH_SPEECH(self._on_speech))
    data = os.path.join(roots["rhvoice-english"], "usr", "share", "RHVoice")
    self._params = _RhvoiceInitParams(data.encode(), self._config.name.encode(), None,
                                      self._callbacks, 0)
    self._engine = self._lib.RHVoice_new_tts_engine(ctypes.byref(self._params))
    if not self._engine:
      raise SynthesizerUnavailable(f"RHVoice found no voices in {data}")

  def _on_sample_rate(self, rate, _user_data):
    self._rate = rate
    return 1

  def _on_speech(self, samples, count, _user_data):
    self._chunks.append(np.ctypeslib.as_array(samples, (count,)).astype(np.int16))
    return 1

  def synthesize(self, text: str, voice) -> np.ndarray:
    valid = voice_names(VOICES)
    if voice.variant not in valid:
      raise InvalidValue(f"RHVoice voice {voice.variant!r}; valid: {sorted(valid)}")
    params = _RhvoiceSynthParams(voice.variant.encode(), 0.0, 0.0, 0.0,
                                 voice.rate / NATURAL_RATE, pitch_factor(voice.pitch),
                                 1.0, 0, None, 0, 0)
    encoded = text.encode("utf-8")
    self._chunks, self._rate = [], 0
    message = self._lib.RHVoice_new_message(self._engine, encoded, len(encoded), 0,
                                            ctypes.byref(params), None)
    if not message:
      raise SynthesizerUnavailable(f"RHVoice refused the text {text[:60]!r}")
    try:
      spoken = self._lib.RHVoice_speak(message)
    finally:
      self._lib.RHVoice_delete_message(message)
    if not spoken or not self._chunks or not self._rate:
      raise SynthesizerUnavailable(f"RHVoice voice {voice.variant} said nothing for "
                                   f"{text[:60]!r}")
    return int16_at(np.concatenate(self._chunks), self._rate, self.sample_rate)   # 24 kHz
