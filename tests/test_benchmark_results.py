"""The JSON-lines results files the benchmarks write and the report reads (benchmarks/common.py)."""

import json

from benchmarks.common import Results, read_results


def test_results_round_trip_with_their_meta_line(tmp_path):
  path = str(tmp_path / "out" / "rows.jsonl")
  results = Results(path, {"command": "x", "jax": "0"})
  results.add(kind="local(129)", n=4096, seconds=0.5)
  results.add(kind="full", n=4096, seconds=9.0)
  meta, rows = read_results(path)
  assert meta == {"command": "x", "jax": "0"}
  assert [r["kind"] for r in rows] == ["local(129)", "full"]


def test_files_without_a_meta_line_keep_every_row(tmp_path):
  """fairseq_train_step.py writes rows only (it runs in the torch environment)."""
  path = tmp_path / "fairseq.jsonl"
  path.write_text(json.dumps({"config": "fairseq", "seconds": 3.5}) + "\n\n")
  assert read_results(str(path)) == ({}, [{"config": "fairseq", "seconds": 3.5}])
