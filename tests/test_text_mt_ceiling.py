"""benchmarks/text_mt_ceiling.py: one short run end to end (its pairs and training are the
MT stage's: tests/test_mt_stage.py)."""

import json


from benchmarks import text_mt_ceiling


def test_a_short_run_reports_dev_and_test_scores(prepared, tmp_path):
  _, out = prepared
  result = text_mt_ceiling.main([
      "--config", "configs/quickstart.py", "--prepared_dir", out, "--test_split", "dev",
      "--updates", "4", "--eval_every", "2", "--batch", "8", "--encoder_layers", "1",
      "--beam", "3", "--out", str(tmp_path / "ceiling.json")])
  assert [e["step"] for e in result["evaluations"]] == [2, 4]
  assert all(e["dev_ppl"] < 1e4 for e in result["evaluations"])
  best = min(result["evaluations"], key=lambda e: e["dev_loss"])["step"]
  assert result["best_update"] == best and result["kept"] == f"best (step {best})"
  assert 0.0 <= result["test"]["bleu"] <= 100.0
  assert result["beam"] == 3 and 0.0 <= result["dev_bleu"] <= 100.0
  assert json.loads((tmp_path / "ceiling.json").read_text())["test"] == result["test"]
