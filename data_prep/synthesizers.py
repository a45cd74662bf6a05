"""Speech synthesizers beyond espeak-ng for the embedded corpus: flite, festival, MBROLA and
RHVoice.

All come from Debian's packages, fetched without root into a cache (`debian_packages`); the
first three run as programs with LD_LIBRARY_PATH pointing into the unpacked libraries. A corpus
hears voices of five synthesizer families:
- flite (CMU Flite 2.2): `kal16`, `awb`, `rms` (male) and `slt` (female), 16 kHz; a speaker's
  rate is flite's duration_stretch, its pitch the intonation model's mean F0.
- festival (2.5) with its `kal_diphone` and `ked_diphone` voices (Debian's festvox-kallpc16k and
  festvox-kdlpc16k, 16 kHz); a speaker's rate is festival's Duration_Stretch. kal_diphone is
  made of the same speaker's diphones as flite's kal16 (SAME_SPEAKER). festival links
  libsndfile, which Debian packages with a dozen codec libraries; the copy bundled in the
  `soundfile` wheel (a requirement) stands in for it.
- MBROLA (3.3) diphone voices `us1` (female), `us2`, `us3` (American male) and `en1` (British
  male), read by Debian's espeak-ng (its text analysis, durations and intonation; the
  espeakng-loader wheel's library is built without MBROLA). The voices are in Debian's
  non-free section (licensed for speech made with the MBROLA program only, not to be sold;
  /usr/share/doc/mbrola-us1/copyright in the package); `debian_packages` finds them where the
  machine's apt lists main only.
- RHVoice (1.8), statistical parametric: `alan`, `bdl`, `evgeniy-eng` (male), `clb`, `slt`,
  `lyubov` (female), Debian's rhvoice-english (non-free: trained models; evgeniy-eng and lyubov
  are CC BY-NC-ND), 24 kHz resampled to 16. Its library is called in-process through ctypes.

`Voice.engine` names the synthesizer; `Voice.rate` is words per minute as espeak-ng's (175 =
each synthesizer's own speed) and `Voice.pitch` 0-99 as espeak-ng's (50 = the voice's own).
A synthesizer that cannot be had raises SynthesizerUnavailable saying what is missing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import wave

import numpy as np

from data_prep import debian_packages

NATURAL_RATE = 175           # espeak-ng's default words per minute: duration stretch 1
FLITE_VOICES = {"male": ("kal16", "awb", "rms"), "female": ("slt",)}
FLITE_F0 = {"kal16": 105.0, "awb": 110.0, "rms": 100.0, "slt": 180.0}   # Hz, the voice's own
FLITE_PACKAGES = ("flite", "libflite1")
FESTIVAL_VOICES = {"male": ("kal_diphone", "ked_diphone")}
FESTIVAL_PACKAGES = ("festival", "libestools2.5", "libpulse0", "libasyncns0", "festlex-cmu",
                     "festlex-poslex", "festvox-kallpc16k", "festvox-kdlpc16k")
# (engine, voice) pairs built from one speaker's recordings: flite's kal16 is festival's KAL
# diphone database; RHVoice's slt and alan are flite's slt and awb. A split of voices never heard
# leaves out the twins of training voices.
_TWINS = ((("festival", "kal_diphone"), ("flite", "kal16")),
          (("rhvoice", "slt"), ("flite", "slt")), (("rhvoice", "alan"), ("flite", "awb")))
SAME_SPEAKER = {**dict(_TWINS), **{b: a for a, b in _TWINS}}
# espeak-ng's Debian build (the wheel's library has no MBROLA support) reading the text, MBROLA's
# diphone voices speaking it; the voices are in Debian's non-free section.
# Voice names are espeak-ng's (mb-{name}); "de4-en" is English spoken with MBROLA's German de4
# diphones (an accent), "us1" American English.
MBROLA_VOICES = {
    "male": ("us2", "us3", "en1", "af1-en", "de2-en", "de4-en", "de6-en", "fr1-en", "gr2-en",
             "nl2-en", "pl1-en", "ro1-en", "sw1-en"),
    "female": ("us1", "de1-en", "de3-en", "de5-en", "fr4-en", "hu1-en", "sw2-en")}


def voice_names(voices_by_sex: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
  """Every voice of a synthesizer's {sex: voices} (FLITE_VOICES, ...), in its order."""
  return tuple(name for names in voices_by_sex.values() for name in names)


def mbrola_database(voice: str) -> str:
  """The MBROLA diphone database of an espeak-ng mb- voice: "de4-en" -> "de4"."""
  return voice.split("-")[0]


MBROLA_PACKAGES = ("espeak-ng", "libespeak-ng1", "espeak-ng-data", "libpcaudio0", "libsonic0",
                   "libpulse0", "libasyncns0", "mbrola") + tuple(dict.fromkeys(
                       f"mbrola-{mbrola_database(name)}" for name in voice_names(MBROLA_VOICES)))
# RHVoice (statistical parametric, HTS-style): Debian's rhvoice-english (non-free: trained
# models). bdl, clb and slt are CMU ARCTIC speakers; alan is Alan W Black's voice, as flite's awb
# is; evgeniy-eng and lyubov are English read by Russian speakers.
RHVOICE_VOICES = {"male": ("alan", "bdl", "evgeniy-eng"), "female": ("clb", "slt", "lyubov")}
RHVOICE_LIBRARY_PACKAGES = ("librhvoice5", "librhvoice-core7", "libsonic0")
RHVOICE_PACKAGES = RHVOICE_LIBRARY_PACKAGES + ("rhvoice-english",)
LIB_DIR = os.path.join("usr", "lib", "x86_64-linux-gnu")
FESTIVAL_DIR = os.path.join("usr", "share", "festival")


# RHVoice's callbacks: set_sample_rate(rate, user_data), play_speech(samples, count, user_data).
_RH_SAMPLE_RATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_RH_SPEECH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_uint,
                              ctypes.c_void_p)


class SynthesizerUnavailable(debian_packages.PackageUnavailable):
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


def _int16_at(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
  """int16 samples at `rate` -> int16 samples at `target` (soxr)."""
  if rate == target:
    return samples
  import soxr  # pylint: disable=import-outside-toplevel
  resampled = soxr.resample(samples.astype(np.float32), rate, target)
  return np.clip(np.round(resampled), -32768, 32767).astype(np.int16)


def _unpacked(packages, cache_dir: str, what: str) -> dict[str, str]:
  try:
    return debian_packages.fetch_all(packages, cache_dir)
  except debian_packages.PackageUnavailable as error:
    raise SynthesizerUnavailable(f"{what} is not available ({error}); it is built from "
                                 f"Debian's {', '.join(packages)}") from error


def _assembled_dir(cache_dir: str, name: str, packages, assemble) -> str:
  """{cache_dir}/{name}-{key of `packages`}, made once by assemble(staging folder) and moved
  into place whole: a folder assembled from fewer packages (voices) is never reused."""
  key = hashlib.sha1(" ".join(packages).encode()).hexdigest()[:8]
  path = os.path.join(cache_dir, f"{name}-{key}")
  if not os.path.isdir(path):
    staging = path + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    assemble(staging)
    os.replace(staging, path)
  return path


def _libsndfile_dir(cache_dir: str) -> str:
  """A folder holding libsndfile.so.1: the `soundfile` wheel's copy, for the Debian programs
  that link it (festival; espeak-ng through libpulse0)."""
  libs = os.path.join(cache_dir, "festival-libsndfile")
  os.makedirs(libs, exist_ok=True)
  if not os.path.exists(os.path.join(libs, "libsndfile.so.1")):
    os.symlink(_bundled_libsndfile(), os.path.join(libs, "libsndfile.so.1"))
  return libs


def _library_path(roots) -> str:
  dirs = []
  for root in roots:
    for sub in (LIB_DIR, os.path.join(LIB_DIR, "pulseaudio")):
      if os.path.isdir(os.path.join(root, sub)):
        dirs.append(os.path.join(root, sub))
  return os.pathsep.join(dirs + [os.environ.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)


def _run(command, env, what: str, text_input=None):
  try:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                          check=False, input=text_input)
  except (OSError, subprocess.TimeoutExpired) as error:
    raise SynthesizerUnavailable(f"{what} could not run: {error}") from error
  if done.returncode:
    raise SynthesizerUnavailable(f"{what} failed (exit {done.returncode}): "
                                 f"{(done.stderr or done.stdout).strip()[-300:]}")


class Flite:
  """flite as a program: synthesize(text, voice) -> int16 samples at `sample_rate`."""

  sample_rate = 16000

  def __init__(self, cache_dir: str):
    roots = _unpacked(FLITE_PACKAGES, cache_dir, "flite")
    self.binary = os.path.join(roots["flite"], "usr", "bin", "flite")
    self.env = dict(os.environ, LD_LIBRARY_PATH=_library_path(roots.values()))
    self._work = tempfile.TemporaryDirectory(prefix="flite-")

  def synthesize(self, text: str, voice) -> np.ndarray:
    if voice.variant not in FLITE_F0:
      raise ValueError(f"flite voice {voice.variant!r}; valid: {sorted(FLITE_F0)}")
    out = os.path.join(self._work.name, "out.wav")
    f0 = FLITE_F0[voice.variant] * pitch_factor(voice.pitch)
    _run([self.binary, "-voice", voice.variant, "--setf",
          f"duration_stretch={duration_stretch(voice.rate):.3f}", "--setf",
          f"int_f0_target_mean={f0:.1f}", "-t", text, "-o", out], self.env, "flite")
    samples, rate = read_wav(out)
    if rate != self.sample_rate:
      raise SynthesizerUnavailable(f"flite voice {voice.variant} speaks at {rate} Hz, not "
                                   f"{self.sample_rate}")
    return samples


def _scheme_string(text: str) -> str:
  return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Festival:
  """festival as a program: synthesize(text, voice) -> int16 samples at `sample_rate`."""

  sample_rate = 16000

  def __init__(self, cache_dir: str):
    roots = _unpacked(FESTIVAL_PACKAGES, cache_dir, "festival")
    self.binary = os.path.join(roots["festival"], "usr", "bin", "festival")

    def assemble(staging):
      """One festival library folder: the program's scheme files, the lexicons and the voices."""
      shutil.copytree(os.path.join(roots["festival"], FESTIVAL_DIR), staging, symlinks=True)
      for package in FESTIVAL_PACKAGES:
        source = os.path.join(roots[package], FESTIVAL_DIR)
        if package != "festival" and os.path.isdir(source):
          shutil.copytree(source, staging, dirs_exist_ok=True, symlinks=True)

    self.lib_dir = _assembled_dir(cache_dir, "festival-lib", FESTIVAL_PACKAGES, assemble)
    self.env = dict(os.environ, LD_LIBRARY_PATH=_library_path(roots.values()) + os.pathsep +
                    _libsndfile_dir(cache_dir))
    self._work = tempfile.TemporaryDirectory(prefix="festival-")

  def synthesize(self, text: str, voice) -> np.ndarray:
    if voice.variant not in FESTIVAL_VOICES["male"]:
      raise ValueError(f"festival voice {voice.variant!r}; valid: {FESTIVAL_VOICES['male']}")
    out = os.path.join(self._work.name, "out.wav")
    script = os.path.join(self._work.name, "say.scm")
    with open(script, "w", encoding="utf-8") as f:
      f.write(f'(set! lexdir {_scheme_string(os.path.join(self.lib_dir, "dicts") + "/")})\n'
              f"(voice_{voice.variant})\n"
              f"(Parameter.set 'Duration_Stretch {duration_stretch(voice.rate):.3f})\n"
              f"(set! utt (Utterance Text {_scheme_string(text)}))\n"
              f"(utt.synth utt)\n"
              f"(utt.save.wave utt {_scheme_string(out)} 'riff)\n")
    _run([self.binary, "--libdir", self.lib_dir + "/", "--datadir", self.lib_dir + "/", "-b",
          script], self.env, "festival")
    samples, rate = read_wav(out)
    if rate != self.sample_rate:
      raise SynthesizerUnavailable(f"festival voice {voice.variant} speaks at {rate} Hz")
    return samples


class Mbrola:
  """espeak-ng's front end with MBROLA's diphone voices, as a program: synthesize(text, voice)
  -> int16 samples at `sample_rate`. A speaker's rate and pitch are espeak-ng's -s and -p."""

  sample_rate = 16000

  def __init__(self, cache_dir: str):
    roots = _unpacked(MBROLA_PACKAGES, cache_dir, "espeak-ng with MBROLA voices")
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

    self.data_parent = _assembled_dir(cache_dir, "mbrola-espeak-ng", MBROLA_PACKAGES, assemble)
    mbrola_bin = os.path.join(roots["mbrola"], "usr", "bin")   # espeak-ng runs `mbrola`
    self.env = dict(os.environ, LD_LIBRARY_PATH=_library_path(roots.values()) + os.pathsep +
                    _libsndfile_dir(cache_dir),
                    PATH=mbrola_bin + os.pathsep + os.environ.get("PATH", ""))
    self._work = tempfile.TemporaryDirectory(prefix="mbrola-")

  def synthesize(self, text: str, voice) -> np.ndarray:
    valid = voice_names(MBROLA_VOICES)
    if voice.variant not in valid:
      raise ValueError(f"MBROLA voice {voice.variant!r}; valid: {sorted(valid)}")
    out = os.path.join(self._work.name, "out.wav")
    _run([self.binary, f"--path={self.data_parent}", "-v", f"mb-{voice.variant}", "-s",
          str(voice.rate), "-p", str(voice.pitch), "-w", out, "--stdin"], self.env,
         "espeak-ng with MBROLA", text_input=text)
    samples, rate = read_wav(out)
    return _int16_at(samples, rate, self.sample_rate)   # some databases are 22.05 kHz (de6, ...)


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
    roots = _unpacked(RHVOICE_PACKAGES, cache_dir, "RHVoice")

    def assemble(staging):
      """The library packages' files in one folder, where each finds the others."""
      os.makedirs(staging)
      for package in RHVOICE_LIBRARY_PACKAGES:
        lib_dir = os.path.join(roots[package], LIB_DIR)
        for name in os.listdir(lib_dir):
          os.symlink(os.path.join(lib_dir, name), os.path.join(staging, name))

    lib_dir = _assembled_dir(cache_dir, "rhvoice-lib", RHVOICE_LIBRARY_PACKAGES, assemble)
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
    valid = voice_names(RHVOICE_VOICES)
    if voice.variant not in valid:
      raise ValueError(f"RHVoice voice {voice.variant!r}; valid: {sorted(valid)}")
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
    return _int16_at(np.concatenate(self._chunks), self._rate, self.sample_rate)   # 24 kHz


def _bundled_libsndfile() -> str:
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
