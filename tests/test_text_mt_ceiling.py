"""benchmarks/text_mt_ceiling.py: the text pairs it trains on, and one short run end to end."""

import json
import os

import numpy as np

from data_prep import index_io

from benchmarks import text_mt_ceiling
from data_prep.vocab import Vocabulary


def test_pairs_are_source_plus_eos_and_shifted_targets(prepared):
  _, out = prepared
  with open(os.path.join(out, "prepared.json"), encoding="utf-8") as f:
    vocab = json.load(f)["vocab"]
  source_vocab = Vocabulary(os.path.join(out, vocab["asr"]["model"]))
  target_vocab = Vocabulary(os.path.join(out, vocab["st"]["model"]))
  source, prev, target, references, _ = text_mt_ceiling.load_split(
      out, "dev", source_vocab, target_vocab, 24)
  index = index_io.load(os.path.join(out, "index", "dev.npz"))
  for i, (text, reference) in enumerate(zip(index["source_text"], references)):
    pieces = source_vocab.encode(str(text))
    np.testing.assert_array_equal(source[i, :len(pieces) + 1], pieces + [text_mt_ceiling.EOS])
    assert np.all(source[i, len(pieces) + 1:] == text_mt_ceiling.PAD)
    tokens = target_vocab.encode(reference)
    assert prev[i, 0] == text_mt_ceiling.EOS
    np.testing.assert_array_equal(prev[i, 1:len(tokens) + 1], tokens)
    np.testing.assert_array_equal(target[i, :len(tokens) + 1], tokens + [text_mt_ceiling.EOS])


def test_a_short_run_reports_dev_and_test_scores(prepared, tmp_path):
  _, out = prepared
  result = text_mt_ceiling.main([
      "--config", "configs/quickstart.py", "--prepared_dir", out, "--test_split", "dev",
      "--updates", "4", "--eval_every", "2", "--batch", "8", "--encoder_layers", "1",
      "--beam", "3", "--out", str(tmp_path / "ceiling.json")])
  assert [e["update"] for e in result["evaluations"]] == [2, 4]
  assert result["evaluations"][1]["dev_ppl"] < result["evaluations"][0]["dev_ppl"] < 1e4
  assert result["best_update"] == 4 and 0.0 <= result["test"]["bleu"] <= 100.0
  assert result["beam"] == 3
  assert json.loads((tmp_path / "ceiling.json").read_text())["test"] == result["test"]
