"""Shared fixtures: a tiny MuST-C-layout corpus (tones and noise, with every kind of bad
input), prepared once per test session."""

import os

# Tests check what the programs compute, not how fast they run, and compiling is most of this
# suite's time. Two settings of XLA:CPU's code generation make it cheaper: LLVM's optimisation
# level 0 (fast-math stays off), and the loop emitters XLA:CPU had before its MLIR fusion
# emitters (which take about twice as long on the tests' small programs). Subprocesses (run.py,
# the two-device scripts) inherit both through the environment. Name either flag in XLA_FLAGS
# yourself to test another setting.
TEST_XLA_FLAGS = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}
for _flag, _value in TEST_XLA_FLAGS.items():
  if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{_flag}={_value}".strip()

# On a GPU the suite asks for what the CPU does anyway: float32 matrix products in float32
# (XLA:GPU's default is TF32, about three significant digits, where the tests compare with
# numpy references to float32 rounding) and run-to-run identical results (the resume tests
# compare parameters bit for bit).
from multiformer_jax.runtime import xla_flags  # pylint: disable=wrong-import-position

ON_GPU = xla_flags.cuda_plugin_installed()
if ON_GPU and "xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] += " --xla_gpu_deterministic_ops=true"

# Every run.py child of the fault tests initialises the same tiny model and draws the same
# kernel features, programs of 0.2-1 s to compile that JAX's default threshold (1 s) leaves out
# of the persistent cache: about 1.5 s of a 15 s child compiled again in each. Children inherit
# this; a value of your own in the environment wins.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # pylint: disable=wrong-import-position  (after XLA_FLAGS: read when jax starts)
import numpy as np
import pytest
import soundfile

from data_prep import prepare  # pylint: disable=wrong-import-position
from data_prep.audio import SAMPLE_RATE

# Identical programs compiled by several tests (e.g. the runs of the resume test) are read back
# from a persistent cache instead of being compiled again.
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "multiformer_jax", "jax-tests"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
if ON_GPU:
  jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(0)
WORDS = "the cat sat on a mat and then it ran to see the dog in the sun".split()


def _audio(seconds, rate=SAMPLE_RATE, channels=1):
  t = np.arange(int(seconds * rate)) / rate
  tone = 0.2 * np.sin(2 * np.pi * RNG.uniform(150, 400) * t) + 0.05 * RNG.normal(size=t.size)
  return np.stack([tone] * channels, axis=1) if channels > 1 else tone


def _sentence(n):
  return " ".join(RNG.choice(WORDS, size=n))


def write_split(root, split, talks, pair="en-de"):
  """talks: {name: (kind, seconds, [(offset, duration, src, tgt)])} -> MuST-C files."""
  base = os.path.join(root, pair, "data", split)
  os.makedirs(os.path.join(base, "wav"))
  os.makedirs(os.path.join(base, "txt"))
  yaml_lines, sources, targets = [], [], []
  for name, (kind, seconds, segments) in talks.items():
    path = os.path.join(base, "wav", f"{name}.wav")
    if kind == "corrupt":
      with open(path, "wb") as f:
        f.write(b"RIFF not really a wav file" * 20)
    elif kind == "stereo":
      soundfile.write(path, _audio(seconds, channels=2), SAMPLE_RATE)
    elif kind == "8k":
      soundfile.write(path, _audio(seconds, rate=8000), 8000)
    elif kind == "nan":
      audio = _audio(seconds)
      audio[: SAMPLE_RATE // 2] = np.nan
      soundfile.write(path, audio.astype(np.float32), SAMPLE_RATE, subtype="FLOAT")
    elif kind == "truncated":
      soundfile.write(path, _audio(seconds), SAMPLE_RATE, subtype="PCM_16")
      with open(path, "rb") as f:
        data = f.read()
      with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    else:
      soundfile.write(path, _audio(seconds), SAMPLE_RATE, subtype="PCM_16")
    for offset, duration, src, tgt in segments:
      yaml_lines.append(f"- {{duration: {duration}, offset: {offset}, speaker_id: spk_{name}, "
                        f"wav: {name}.wav}}\n")
      sources.append(src + "\n")
      targets.append(tgt + "\n")
  src, tgt = pair.split("-")
  for ext, lines in (("yaml", yaml_lines), (src, sources), (tgt, targets)):
    with open(os.path.join(base, "txt", f"{split}.{ext}"), "w", encoding="utf-8") as f:
      f.writelines(lines)


def _good_segments(count, start=0.3):
  segs, t = [], start
  for _ in range(count):
    d = round(float(RNG.uniform(0.4, 1.6)), 2)
    segs.append((round(t, 2), d, _sentence(int(RNG.integers(3, 8))),
                 _sentence(int(RNG.integers(3, 8)))))
    t += d + 0.2
  return segs, t + 0.3


def build_tiny_corpus(root):
  talks = {}
  for i in range(6):
    segs, seconds = _good_segments(6)
    talks[f"good{i}"] = ("wav", seconds, segs)
  talks["bad"] = ("wav", 6.0, [
      (0.5, 1.0, "a fine sentence here", "ein guter Satz hier"),
      (2.0, 1.0, "   ", "leer"),                                   # empty text
      (3.5, 0.03, "too short to use", "zu kurz"),                  # fewer than 5 frames
      (5.5, 2.0, "past the end of file", "nach dem Ende"),         # segment past end
  ])
  talks["stereo"] = ("stereo", 3.0, [(0.5, 1.5, "two channels of sound", "zwei Kanaele")])
  talks["lowrate"] = ("8k", 3.0, [(0.5, 1.5, "eight kilohertz audio", "acht Kilohertz")])
  talks["corrupt"] = ("corrupt", 0, [(0.5, 1.0, "cannot be read at all", "nicht lesbar"),
                                     (2.0, 1.0, "nor this one", "auch nicht")])
  talks["nans"] = ("nan", 2.0, [(0.1, 1.0, "not a number inside", "keine Zahl")])
  talks["trunc"] = ("truncated", 4.0, [(0.2, 1.0, "start is still there", "Anfang ist da"),
                                       (3.0, 0.8, "end was cut off", "Ende fehlt")])
  write_split(root, "train", talks)
  dev = {}
  for i in range(3):
    segs, seconds = _good_segments(5)
    dev[f"dev{i}"] = ("wav", seconds, segs)
  write_split(root, "dev", dev)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
  """(corpus root, prepared dir) of a tiny MuST-C-layout corpus with every kind of bad input."""
  root = str(tmp_path_factory.mktemp("corpus"))
  build_tiny_corpus(root)
  out = str(tmp_path_factory.mktemp("prepared"))
  prepare.prepare("mustc", root, ["en-de"], out, ["train", "dev"], asr_vocab=40, st_vocab=40,
                  workers=1, progress=False)
  return root, out
