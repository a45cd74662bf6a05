"""Kaldi's speed perturbation when preparing: each training utterance at 0.9, 1.0 and 1.1 times
its speed, tempo and pitch together (the length ratio is the factor's inverse)."""

import os

import numpy as np
import pytest

from data_prep import features, index_io, prepare
from data_prep.audio import SAMPLE_RATE
from tests.conftest import _good_segments, write_split


@pytest.mark.parametrize("factor", [0.9, 1.1, 1.0])
def test_the_length_is_divided_and_the_pitch_multiplied_by_the_factor(factor):
  t = np.arange(SAMPLE_RATE * 2) / SAMPLE_RATE
  tone = np.sin(2 * np.pi * 300.0 * t).astype(np.float32)
  out = features.speed_perturb(tone, factor)
  assert abs(len(out) - len(tone) / factor) <= 1
  spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
  peak = np.argmax(spectrum) * SAMPLE_RATE / len(out)
  assert abs(peak - 300.0 * factor) < 2.0


def test_prepare_holds_each_training_utterance_at_each_speed(tmp_path):
  root = str(tmp_path / "corpus")
  train = {f"talk{i}": ("wav", seconds, segments) for i, (segments, seconds) in
           enumerate(_good_segments(3) for _ in range(2))}
  write_split(root, "train", train)
  write_split(root, "dev", {"dev0": ("wav", *reversed(_good_segments(3)))})
  out = str(tmp_path / "prepared")
  summary = prepare.prepare("mustc", root, ["en-de"], out, ["train", "dev"], asr_vocab=30,
                            st_vocab=30, workers=1, progress=False,
                            speed_perturb=prepare.parse_speeds("0.9,1.0,1.1"))
  assert summary["splits"] == {"train": 18, "dev": 3} and summary["speed_perturb"] == [0.9, 1.0,
                                                                                       1.1]
  index = index_io.load(os.path.join(out, "index", "train.npz"))
  frames = dict(zip(index["id"].astype(str), index["n_frames"]))
  originals = [i for i in frames if not i.startswith("sp")]
  assert len(originals) == 6
  for i in originals:
    for factor in (0.9, 1.1):
      assert abs(frames[f"sp{factor:g}-{i}"] - frames[i] / factor) <= 2
  dev = index_io.load(os.path.join(out, "index", "dev.npz"))
  assert not any(str(i).startswith("sp") for i in dev["id"])      # training only


def test_bad_factors_are_named():
  with pytest.raises(ValueError, match="speed perturbation '0.9,fast'; valid: comma-separated"):
    prepare.parse_speeds("0.9,fast")
  with pytest.raises(ValueError, match="valid: comma-separated positive"):
    prepare.parse_speeds("0,1")
  assert prepare.parse_speeds("") == ()


def test_only_the_named_domains_are_perturbed():
  from data_prep.corpora import SegmentRecord
  record = lambda i, domain: SegmentRecord(f"u{i}", "talk", "spk", "talk.wav", 0.0, 1.0, "a",
                                           "a", "en", "en", domain)
  records = [record(0, "queen"), record(1, "bible"), record(2, "queen")]
  out = prepare.speed_perturbed(records, (0.9, 1.0, 1.1), domains=("queen",))
  assert [r.id for r in out] == ["sp0.9-u0", "u0", "sp1.1-u0", "u1", "sp0.9-u2", "u2",
                                 "sp1.1-u2"]
  assert len(prepare.speed_perturbed(records, (0.9, 1.0, 1.1))) == 9      # every domain
