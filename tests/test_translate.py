"""Translating one's own audio files: the same hypotheses as evaluation for the same audio,
long files in segments, bad files named."""

import os

import numpy as np
import pytest
import soundfile

from data_prep import corpora
from data_prep.audio import SAMPLE_RATE, cut_segment, load_audio
from multiformer_jax.training import train
from multiformer_jax.evaluation import translate
from tests.test_train import tiny_config


@pytest.fixture(scope="module")
def evaluated_run(prepared, tmp_path_factory):
  """A tiny two-stage run evaluated on dev from its latest checkpoints, both stages' n-best
  rescored with a word LM (evaluation settings that translation must follow too)."""
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, max_updates=4, eval_every=4)
  config.eval.after_training = True
  config.eval.lm_weight, config.eval.lm_stages = 5.0, ("asr", "st")
  workdir = str(tmp_path_factory.mktemp("translated_run"))
  train.train_and_evaluate(config, workdir)
  return workdir


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def test_a_file_decodes_as_evaluation_decodes_the_same_audio(prepared, evaluated_run, tmp_path):
  root, _ = prepared
  records = corpora.read_mustc(root, "en-de", "dev")[:3]
  paths, audio = [], []
  for r in records:
    samples, _ = load_audio(r.audio_path)
    segment = cut_segment(samples, r.offset, r.duration)
    path = str(tmp_path / f"{r.id}.wav")
    soundfile.write(path, segment, SAMPLE_RATE, subtype="FLOAT")     # the exact samples
    paths.append(path)
    audio.append(segment)
  results = translate.translate_files(evaluated_run, paths, segment_seconds=1000.0)
  for stage in ("asr", "st"):
    directory = os.path.join(evaluated_run, stage, "eval_dev")
    hyps = dict(zip(_lines(os.path.join(directory, "ids.txt")),
                    _lines(os.path.join(directory, "hyp.txt"))))
    assert [r[stage] for r in results] == [hyps[r.id] for r in records], stage
  assert [r["segments"] for r in results] == [1, 1, 1]
  # Two utterances in one file, cut at the first one's length: the two hypotheses, joined.
  order = [0, 1] if len(audio[0]) >= len(audio[1]) else [1, 0]
  joined = str(tmp_path / "joined.wav")
  soundfile.write(joined, np.concatenate([audio[i] for i in order]), SAMPLE_RATE,
                  subtype="FLOAT")
  (result,) = translate.translate_files(evaluated_run, [joined], ("asr",),
                                        segment_seconds=len(audio[order[0]]) / SAMPLE_RATE)
  assert result["segments"] == 2
  assert result["asr"] == " ".join(t for t in (results[i]["asr"] for i in order) if t)


def test_other_rates_and_channels_are_repaired_and_bad_files_named(evaluated_run, tmp_path):
  t = np.arange(12000) / 8000
  stereo = np.stack([0.2 * np.sin(2 * np.pi * 220 * t)] * 2, axis=1)
  path = str(tmp_path / "stereo_8k.flac")
  soundfile.write(path, stereo, 8000)
  (result,) = translate.translate_files(evaluated_run, [path], ("st",))
  assert isinstance(result["st"], str) and result["segments"] == 1
  with pytest.raises(ValueError, match=r"nowhere.wav: missing audio file"):
    translate.translate_files(evaluated_run, [str(tmp_path / "nowhere.wav")])
  corrupt = tmp_path / "corrupt.wav"
  corrupt.write_bytes(b"RIFF not a wav" * 10)
  with pytest.raises(ValueError, match=r"corrupt.wav: unreadable audio"):
    translate.translate_files(evaluated_run, [str(corrupt)])
  with pytest.raises(ValueError, match=r"segment_seconds=0"):
    translate.translate_files(evaluated_run, [path], segment_seconds=0)
