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


def test_trace_summary_splits_gpu_time_by_kernel_kind():
  """benchmarks/trace_summary.py on a small trace: GPU kernels are summed per kind of XLA
  kernel name; host threads get no kind lines."""
  from benchmarks.trace_summary import kernel_kind, summarise
  assert kernel_kind("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT") == \
      "matmul and convolution libraries"
  assert kernel_kind("gemm_fusion_dot_920") == "XLA Triton matmuls (gemm_fusion)"
  assert kernel_kind("fusion_9149") == "block-level Triton fusions (fusion_N)"
  assert kernel_kind("input_compare_exponential_reduce_fusion") == "reductions (input_*)"
  assert kernel_kind("loop_select_fusion_13") == "elementwise (loop_*)"
  assert kernel_kind("input_transpose_fusion_35") == "transposes and copies"
  meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "Stream #14"}},
          {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/host:CPU"}}]
  kernels = [("nvjet_a", 3000), ("fusion_1", 1000), ("loop_add_fusion", 500),
             ("loop_add_fusion", 500)]
  events = meta + [{"ph": "X", "pid": 1, "tid": 2, "ts": 10 * i, "dur": d, "name": n}
                   for i, (n, d) in enumerate(kernels)]
  events.append({"ph": "X", "pid": 3, "tid": 4, "ts": 0, "dur": 2000, "name": "Execute"})
  text = summarise(events, 5)
  assert "3.00 ms  60.0%  [matmul and convolution libraries]" in text
  assert "1.00 ms  20.0%  [block-level Triton fusions (fusion_N)]" in text
  assert "1.00 ms  20.0%  [elementwise (loop_*)]" in text
  assert "1.00 ms      2x  loop_add_fusion" in text
  assert text.count("%  [") == 3


def test_the_benchmarks_page_is_the_report_of_the_results_files_and_the_readme_quotes_it(
    tmp_path):
  """docs/benchmarks.md is what benchmarks/report.py writes from docs/benchmarks/ (so every
  figure there comes from a results file), and each figure of the README's performance table
  is one of its targets' measured values."""
  import os
  import re
  import shutil
  from benchmarks import report
  directory = tmp_path / "benchmarks"
  shutil.copytree("docs/benchmarks", directory)
  report.main(["--dir", str(directory), "--out", str(tmp_path / "benchmarks.md")])
  with open("docs/benchmarks.md", encoding="utf-8") as f:
    committed = f.read()
  assert (tmp_path / "benchmarks.md").read_text(encoding="utf-8") == committed, \
      "docs/benchmarks.md is stale: run python -m benchmarks.report"
  assert (directory / "details.md").read_text(encoding="utf-8") == \
      open(os.path.join("docs", "benchmarks", "details.md"), encoding="utf-8").read()
  targets = committed.split("## Targets", 1)[1].split("\n## ", 1)[0]
  measured = [line.split(" | ")[1] for line in targets.splitlines() if line.count(" | ") >= 2]
  with open("README.md", encoding="utf-8") as f:
    performance = f.read().split("## Performance", 1)[1].split("\n## ", 1)[0]
  rows = [line.split(" | ") for line in performance.splitlines()
          if line.startswith("| ") and not line.startswith("| workload") and "---" not in line]
  assert len(rows) >= 6
  for row in rows:
    figures = re.findall(r"\d+(?:\.\d+)?(?:x|%)?", row[-1])
    assert figures, row
    for figure in figures:
      assert any(re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", m) for m in measured), \
          f"README's {figure} ({row[0]}) is not among docs/benchmarks.md's targets"
