"""Turns the benchmark results (JSON lines in docs/benchmarks/) into docs/benchmarks.md and
its plots: every figure with the command that measured it, the machine and the date, and each
target of the performance issue checked against the numbers of one run.

    python benchmarks/report.py [--dir docs/benchmarks] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import textwrap

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import read_results  # noqa: E402

MIB = 2 ** 20


def _load(directory, name):
  path = os.path.join(directory, name)
  if not os.path.exists(path):
    return None, []
  return read_results(path)


def _table(header, rows):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _machine(meta):
  return (f"{meta.get('cpu', '?')} ({meta.get('cpu_count', '?')} cores, "
          f"{meta.get('platform', '?')}, {meta.get('devices', '?')} device), jax "
          f"{meta.get('jax', '?')}, Python {meta.get('python', '?')}, {meta.get('date', '?')}")


def _cmd(command: str) -> str:
  """The recorded argv (joined with spaces) as a shell command line to run from the repository
  root, quoted where an argument holds ';' or parentheses."""
  words = command.split(" ")
  environment = []                      # leading VAR=value words stay before `python`
  while words and "=" in words[0] and not words[0].startswith("-"):
    environment.append(words.pop(0))
  command = shlex.join(words)
  if not command.startswith(("python", "/")):
    command = f"python {command}"
  return " ".join(environment + [command])


def _options(row) -> str:
  """The memory options of a train-step row: model.key_block_size and model.ffn_token_chunk
  (rows written before they existed ran the dense softmax and the unchunked FFN)."""
  block, chunk = row.get("key_block_size", 0), row.get("ffn_token_chunk", 0)
  return (f"key block {block or 'dense'}, FFN chunk {chunk or 'off'}")


def _allocator(record) -> str:
  """How a run's process allocated host memory (benchmarks/common.machine records it; rows
  written before it did ran with glibc's defaults)."""
  tunables = (record or {}).get("glibc_tunables", "")
  return f"GLIBC_TUNABLES={tunables}" if tunables else "glibc's default malloc"




def _verdict(ok):
  return "met" if ok else "**not met**"


def _kind_rows(kinds, lengths, lookup, key, scale=1.0, fmt="{:.3f}", label="{}"):
  """Table rows [label(kind), row[key] / scale at each n] (a dash where not measured);
  lookup(kind, n) -> the result row or None."""
  def cell(row):
    return fmt.format(row[key] / scale) if row and row.get(key) is not None else "—"
  return [[label.format(kind)] + [cell(lookup(kind, n)) for n in lengths] for kind in kinds]


def _forward_table(header, rows) -> str:
  """The forward-only seconds (rows written before attention.py timed them have none)."""
  if not rows:
    return ""
  return f"""
Forward only, seconds (what evaluation pays; same inputs, same run):

{_table(header, rows)}
"""


PAIRS_SUMMARY = os.path.join("cpu", "attention_pairs", "summary.json")
FAIRSEQ_PAIRS_SUMMARY = os.path.join("cpu", "2026-11-24-abba", "summary.json")


def fairseq_pairs_target(directory) -> list:
  """The Targets row against fairseq: one alternating run of benchmarks/fairseq_pairs.py."""
  path = os.path.join(directory, FAIRSEQ_PAIRS_SUMMARY)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  allocator = summary.get("fairseq_env") or "glibc's default malloc"
  return [["s2t_transformer_s update vs fairseq 0.12.2: >= 1.2x faster",
           f"{summary['median_ratio']:.2f}x (median of {len(summary['rounds'])} ABBA rounds, "
           f"{summary['min_ratio']:.2f}-{summary['max_ratio']:.2f}x; ours on huge pages, fairseq "
           f"on {allocator}, its faster allocator in the single runs below; "
           f"`{_cmd(summary['command'])}`)", _verdict(summary["median_ratio"] >= 1.2)]]


def peer_targets(directory) -> list:
  """The Targets rows against lucidrains and performer-pytorch: from one alternating run of
  benchmarks/attention_pairs.py (equal work checked, both on the same allocator)."""
  path = os.path.join(directory, PAIRS_SUMMARY)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  check, rounds, n = summary["check"], len(summary["rounds"]), summary["n"]
  local, kernel = summary["local(129)"], summary["kernel(256)"]
  speed = lambda s: (f"{s['median_ratio']:.2f}x ({s['median_ours_s']:.3f} vs "
                     f"{s['median_peer_s']:.3f} s; median of {rounds} ABBA rounds, both on "
                     f"{summary['glibc_tunables']}; rounds {s['min_ratio']:.2f}-"
                     f"{s['max_ratio']:.2f}x)")
  return [
      [f"local(129) vs lucidrains local-attention (no rotary; outputs "
       f"{check['local_max_abs_diff']:.1e} apart), n={n}: >= 1.5x faster",
       speed(local),
       _verdict(local["median_ratio"] >= 1.5)],
      [f"local(129) vs lucidrains, n={n}: <= 1/2 of its memory",
       f"{local['memory_ratio']:.2f} (XLA temporaries vs its peak RSS growth)",
       _verdict(local["memory_ratio"] <= 0.5)],
      [f"kernel(256) vs performer-pytorch (same estimator: outputs "
       f"{check['kernel_same_features_max_abs_diff']:.1e} apart on its features), n={n}: "
       ">= 3x faster",
       speed(kernel),
       _verdict(kernel["median_ratio"] >= 3)],
  ]


def attention_section(directory, plot_dir):
  meta, rows = _load(directory, "attention.jsonl")
  if not rows:
    return "", [], ""
  # The PyTorch rows run on the allocator ours run on (huge pages), from one run.
  torch_meta_row, torch_rows = _load(directory, "torch_attention_hugepages.jsonl")
  measured = [r for r in rows if "seconds" in r]
  kinds = list(dict.fromkeys(r["kind"] for r in rows))
  lengths = sorted({r["n"] for r in rows})
  get = {(r["kind"], r["n"]): r for r in measured}
  tget = {(r["kind"], r["n"]): r for r in torch_rows}
  torch_kinds = list(dict.fromkeys(r["kind"] for r in torch_rows))

  lookup = lambda kind, n: get.get((kind, n)) or tget.get((kind, n))
  time_rows = _kind_rows(kinds + torch_kinds, lengths, lookup, "seconds")
  mem_rows = _kind_rows(kinds, lengths, lookup, "temp_bytes", MIB, "{:.0f}")
  mem_rows += _kind_rows(torch_kinds, lengths, lookup, "peak_growth_bytes", MIB, "{:.0f}",
                         "{} (RSS growth)")
  flop_rows = _kind_rows(kinds, lengths, lookup, "flops", 1e9, "{:.1f}")
  timed_forward = [kind for kind in kinds + torch_kinds
                   if any("forward_seconds" in (lookup(kind, n) or {}) for n in lengths)]
  forward_rows = _kind_rows(timed_forward, lengths, lookup, "forward_seconds")
  header = ["kind"] + [f"n={n}" for n in lengths]

  for key, ylabel, name, scale in (("seconds", "fwd+bwd seconds", "attention_time.png", 1),
                                   ("temp_bytes", "XLA temporaries (MiB)",
                                    "attention_memory.png", MIB)):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in kinds + (torch_kinds if key == "seconds" else []):
      points = [(n, lookup(kind, n)[key] / scale) for n in lengths
                if (lookup(kind, n) or {}).get(key) is not None]
      if points:
        ax.plot(*zip(*points), marker="o", label=kind,
                linestyle="--" if kind in torch_kinds else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"batch {meta['batch']}, {meta['heads']} heads x {meta['head_dim']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(plot_dir, name), dpi=110)
    plt.close(fig)

  targets = []
  local, dense = get.get(("local(129)", 4096)), get.get(("dense_masked(129)", 4096))
  if local and dense:
    speed = dense["seconds"] / local["seconds"]
    memory = local["temp_bytes"] / dense["temp_bytes"]
    targets.append(["local(129) vs dense masked, n=4096: >= 15x faster",
                    f"{speed:.1f}x", _verdict(speed >= 15)])
    targets.append(["local(129) vs dense masked, n=4096: <= 1/8 of the temporaries",
                    f"{memory:.3f} ({local['temp_bytes'] / MIB:.0f} vs "
                    f"{dense['temp_bytes'] / MIB:.0f} MiB)", _verdict(memory <= 1 / 8)])
  for kind in ("local(129)", "local(33)", "kernel(256)"):
    a, b = get.get((kind, 1024)), get.get((kind, 8192))
    if a and b:
      growth = b["temp_bytes"] / a["temp_bytes"]
      targets.append([f"{kind} temporaries n=1024 -> 8192: <= 9x", f"{growth:.2f}x",
                      _verdict(growth <= 9)])
  kernel, floor = get.get(("kernel(256)", 4096)), get.get(("kernel(256)/products", 4096))
  if kernel and floor:
    over = kernel["seconds"] / floor["seconds"]
    targets.append(["kernel(256), n=4096: within 1.15x of its matrix products alone "
                    "(`kernel(256)/products`, the floor on this CPU; the issue's alternative to "
                    "3x performer-pytorch)",
                    f"{over:.2f}x ({kernel['seconds']:.3f} vs {floor['seconds']:.3f} s, one run)",
                    _verdict(over <= 1.15)])
  targets += peer_targets(directory)
  torch_meta = ""
  if torch_rows:
    torch_meta = (f" PyTorch references: torch {torch_rows[0].get('torch')}, "
                  f"{torch_rows[0].get('threads')} threads, in a separate environment, "
                  f"{_allocator(torch_meta_row)}, lucidrains without rotary embeddings "
                  f"(the function `local(129)` computes).")
  reruns = meta.get("rerun", [])
  for rerun in reruns:
    commands = "; ".join(f"`{_cmd(c)}`" for c in rerun["commands"])
    torch_meta += (f" Rows of {', '.join(rerun['kinds'])}: remeasured {rerun['date']} "
                   f"({commands}).")
  if reruns:
    torch_meta += " The others: the date above."
  text = f"""## Attention kinds

Machine: {_machine(meta)}; JAX with {_allocator(meta)}.{torch_meta}
Command: `{_cmd(meta['command'])}`; PyTorch: `python benchmarks/torch_attention.py` (in an
environment with torch, local-attention 1.11.2 and performer-pytorch 1.1.4).
fwd+bwd of sum(attention(q, k, v)), batch {meta['batch']}, {meta['heads']} heads x
{meta['head_dim']} dims, all positions valid; median of 3 after a warm-up.
`dense_masked(129)` is `jax.nn.dot_product_attention(local_window_size=(64, 64))`;
`kernel(256)/products` is kernel(256)'s matrix products alone in XLA, without its
exponentials and normalisation: the floor under its XLA path on this machine.
`local(w)` and `kernel(256)` rows run the C++ kernels on the CPU (local_cpu.py, kernel_cpu.py;
their temporaries include the kernels' own scratch, outside XLA's buffers, and their FLOPs are
the XLA paths', which for local heads multiply more entries); `local(129)/xla` and
`kernel(256)/xla` are the XLA paths (local.py, kernel.py) for the same functions; `/dropout`
rows drop attention weights at 0.1, as in training.

**The peers' rows and the targets table come from different runs.** The peers' rows below
are single runs of the date above; the targets compare ours with the peers in alternated
(ABBA) rounds of a later run (`benchmarks/attention_pairs.py`,
docs/benchmarks/cpu/attention_pairs/), where lucidrains and performer-pytorch took 0.332 and
0.605 s at n = 4096 against these rows' 0.977 and 1.666 s: a machine of the same name ran up
to 3.5x faster on another day (the lab notebook). Compare ratios within one run, not times
across runs.

Seconds:

{_table(header, time_rows)}

XLA compiled temporaries (MiB; PyTorch rows: growth of the peak resident set):

{_table(header, mem_rows)}

The XLA FLOPs and the forward-only times of the same run:
[benchmarks/details.md](benchmarks/details.md).

![time](benchmarks/attention_time.png)
![memory](benchmarks/attention_memory.png)
"""
  details = f"""## Attention kinds: FLOPs and forward-only times

The run of [../benchmarks.md](../benchmarks.md#attention-kinds) (same command and machine).

XLA FLOPs (G):

{_table(header, flop_rows)}
{_forward_table(header, forward_rows)}"""
  return text, targets, details


def blockwise_section(directory):
  """The blockwise-softmax rows: their own run, with the dense rows they are compared with."""
  meta, rows = _load(directory, "attention_blockwise.jsonl")
  measured = [r for r in rows if "seconds" in r]
  if not measured:
    return "", [], ""
  kinds = list(dict.fromkeys(r["kind"] for r in measured))
  lengths = sorted({r["n"] for r in measured})
  get = {(r["kind"], r["n"]): r for r in measured}
  lookup = lambda kind, n: get.get((kind, n))
  header = ["kind"] + [f"n={n}" for n in lengths]
  time_rows = _kind_rows(kinds, lengths, lookup, "seconds")
  mem_rows = _kind_rows(kinds, lengths, lookup, "temp_bytes", MIB, "{:.0f}")
  intro = f"""Machine: {_machine(meta)}. Command: `{_cmd(meta['command'])}`.
A separate run from the table above (this machine's speed differs between runs: compare rows
within one table). `/blockwise(512)` = the same heads with `model.key_block_size=512`, the
CPU default (exact online softmax over blocks of 512 keys, recomputed in the backward); the rows
without it are the dense softmax (`model.key_block_size=0`). fwd+bwd, batch {meta['batch']},
{meta['heads']} heads x {meta['head_dim']} dims; dense full attention is skipped above
n = 4096. (XLA's cost analysis counts a loop body once, so FLOPs are not compared here.)"""
  longest_dense = max((n for n in lengths if lookup("full", n)), default=None)
  blocked = lookup("full/blockwise(512)", longest_dense) if longest_dense else None
  summary = ""
  if blocked:
    dense = lookup("full", longest_dense)
    summary = (f" At n = {longest_dense}, full heads: {dense['seconds']:.2f} s and "
               f"{dense['temp_bytes'] / MIB:.0f} MiB of temporaries dense, "
               f"{blocked['seconds']:.2f} s and {blocked['temp_bytes'] / MIB:.0f} MiB blockwise.")
  summary = textwrap.fill(summary.strip() + " Every kind and length:", 95)
  text = f"""## Blockwise softmax for full and conv heads

{intro}
{summary}
[benchmarks/details.md](benchmarks/details.md#blockwise-softmax-for-full-and-conv-heads).
"""
  detail = f"""## Blockwise softmax for full and conv heads

{intro}

Seconds:

{_table(header, time_rows)}

XLA compiled temporaries (MiB):

{_table(header, mem_rows)}
"""
  return text, [], detail


def page_fault_section(directory):
  meta, rows = _load(directory, "page_faults.jsonl")
  if not rows:
    return "", []
  table = _table(["malloc", "operation", "ms per call", "page faults per call"],
                 [[r["setting"], r["op"], r["ms"], r["faults_per_call"]] for r in rows])
  text = f"""## Huge pages: page faults of XLA:CPU buffers

Command: `{_cmd(meta['command'])}` ({meta['cpu_count']} cores). One call on a
{meta['mib']} MiB float32 array, median of {meta['repeats']}; "glibc defaults" is a process
with MULTIFORMER_HUGE_PAGES=0, the other what the entry points set up
(`multiformer_jax/runtime/host_memory.py`).

{table}
"""
  return text, []


def decode_section(directory):
  meta, rows = _load(directory, "decode.jsonl")
  if not rows:
    return "", []
  by = {r["variant"]: r for r in rows}
  table = _table(["variant", "seconds per batch", "sentences/s", "mean output tokens"],
                 [[v, by[v]["seconds"], by[v]["sentences_per_s"], by[v]["mean_output_tokens"]]
                  for v in ("cached", "recompute") if v in by])
  speed = by["cached"]["sentences_per_s"] / by["recompute"]["sentences_per_s"]
  same = by.get("check", {}).get("identical_hypotheses")
  text = f"""## Beam search: cache against recomputing the prefix

Machine: {_machine(meta)}. Command: `{_cmd(meta['command'])}`
({meta['config']}, random weights, vocabulary 8000, {meta['batch']} utterances x
{meta['frames']} frames, beam {meta['beam']}, {meta['tokens']} target tokens).
Identical hypotheses from both: {same}.

{table}
"""
  return text, [[f"beam {meta['beam']} with the cache vs recompute at {meta['tokens']} tokens: "
                 ">= 3x", f"{speed:.1f}x", _verdict(speed >= 3)]]


def fairseq_generate_section(directory):
  """benchmarks/fairseq_generate.py: evaluate against fairseq-generate on equal work."""
  meta, rows = _load(directory, "fairseq_generate.jsonl")
  if not rows:
    return "", []
  timed = [r for r in rows if r["round"] != "alone"]
  alone = next(r for r in rows if r["round"] == "alone")
  table = _table(["round", "command", "sentences", "wall (s)", "sentences/s (wall)",
                  "decoding loop (s)", "sentences/s (loop)", "hypotheses as fairseq's"],
                 [[r["round"], r["command"], r["sentences"], r["wall_s"],
                   r["sentences_per_s_wall"], r["loop_s"], r["sentences_per_s_loop"],
                   r["identical_hypotheses"]] for r in timed])
  ours, theirs = "multiformer_jax.evaluate", "fairseq-generate"
  median = lambda key, keep: statistics.median(r[key] for r in timed if keep(r))
  fairseq = lambda key: median(key, lambda r: r["command"] == theirs)
  cold = lambda key: median(key, lambda r: r["command"] == ours and r["round"] == 1)
  warm = lambda key: median(key, lambda r: r["command"] == ours and r["round"] != 1)
  ratios = {name: (of("sentences_per_s_wall") / fairseq("sentences_per_s_wall"),
                   of("sentences_per_s_loop") / fairseq("sentences_per_s_loop"))
            for name, of in (("cold", cold), ("warm", warm))}
  text = f"""## Evaluation against fairseq-generate

Machine: {_machine(meta)}, matmul peak {meta['matmul_peak_flops'] / 1e9:.1f} GFLOP/s measured in
the same run. Command: `{_cmd(meta['command'])}`. One s2t_transformer_s checkpoint made by
fairseq (facebookresearch/fairseq main at 3d262bb2, torch 2.13.0+cpu, 2 threads; random
weights, output projection x8, vocabulary 8000), imported here; {meta['sentences']} utterances
of random features with MuST-C tst-COMMON's lengths; beam 5, lenpen 1, max length 50 tokens,
batches of at most {meta['batch_frames']} frames; rounds alternate which command runs first.
The loop time is fairseq's own "Translated N sentences in Xs" and evaluate's decode_s, which
includes compiling its search programs in round 1 (cold: the run's compilation cache emptied)
and loading them from that cache in the later rounds (warm).

{table}

evaluate / fairseq-generate, sentences/s (fairseq's median): warm {ratios['warm'][0]:.2f}x over
the whole command, {ratios['warm'][1]:.2f}x in the decoding loop; cold {ratios['cold'][0]:.2f}x
and {ratios['cold'][1]:.2f}x. Batched, fairseq's hypotheses depend on an utterance's
batch-mates (its subsampler convolves their padding; this toolkit's re-zeroes it), so only
some are the same; decoding one utterance per batch (`--batch-size 1`, {alone['wall_s']} s),
fairseq gives evaluate's hypotheses for {alone['identical_hypotheses']} of {alone['sentences']}.
"""
  row = ["evaluate vs fairseq-generate, one imported checkpoint, the same split, beam, length "
         "and batch frames (reported, no target)",
         f"{warm('sentences_per_s_wall'):.2f} sentences/s warm ({ratios['warm'][0]:.2f}x), "
         f"{cold('sentences_per_s_wall'):.2f} cold, fairseq {fairseq('sentences_per_s_wall'):.2f};"
         f" hypotheses as fairseq's one by one: {alone['identical_hypotheses']}/"
         f"{alone['sentences']} ({meta.get('cpu', '?')}, {meta.get('cpu_count', '?')} cores; "
         f"[command and rounds](benchmarks/details.md#evaluation-against-fairseq-generate))",
         "reported"]
  return text, [row]


def translate_section(directory):
  """benchmarks/translate.py: a folder of recordings against evaluation of the same split."""
  meta, rows = _load(directory, os.path.join("cpu", "translate.jsonl"))
  if not rows:
    return "", []
  by = {r["measure"]: r for r in rows if r["measure"] != "evaluate"}
  speed, memory, long = by["translate_vs_evaluate"], by["memory"], by["long_recordings"]
  command = meta.get("command", "python benchmarks/translate.py --workdir runs/quickstart "
                                "--out docs/benchmarks/cpu/translate.jsonl")
  table = _table(["measure", "value"], [
      ["evaluation of the split, both stages, warm (s)", speed["evaluate_warm_s"]],
      [f"translate, {speed['files']} wav files, both stages, warm (s)",
       speed["translate_warm_s"]],
      ["translate, the same, cold: compiling included (s)", speed["translate_cold_s"]],
      ["search programs compiled per stage", speed["compiled_programs"]],
      ["frame buckets / batch sizes", f"{speed['buckets']} / {speed['batch_sizes']}"],
      ["files decoded to evaluation's very text (asr, st)",
       speed["same_text_as_evaluation"]],
      [f"resident memory floor, files 1-100 / last 100 of {memory['files']} (MiB)",
       f"{memory['rss_floor_mib_files_1_100']} / {memory['rss_floor_mib_last_100']}"],
      ["resident memory peak (MiB)", memory["rss_peak_mib"]],
      [f"{long['files']} recordings of ~{long['seconds_each']:.0f} s ({long['sentences']} "
       f"sentences): segments cut", long["segments"]],
      ["ASR WER: long recordings cut at pauses / the sentences one by one",
       f"{long['wer_at_pauses']} / {long['wer_one_by_one']}"],
      ["ST BLEU: the same", f"{long['bleu_at_pauses']} / {long['bleu_one_by_one']}"]])
  text = f"""## translate on a folder of recordings

Machine: {_machine(meta)}. Command: `{_cmd(command)}` (a run of the README's main
command on the date above, an older recipe than today's whose ST model read BLEU about 1-3;
{meta['split']}'s utterances written as 16-bit wav files; float32 matmul peak
{meta.get('matmul_peak_gflops', '?')} GFLOP/s in the same run). The table measures speed,
memory and agreement with evaluation, not the model's quality. Every file is cut at its
pauses, so an utterance of two sentences is decoded as two segments: those are the files whose
text differs from evaluation's. The BLEU of whole recordings is a document-level figure (the
sentence-level BLEU is the evaluation's).

{table}
"""
  growth = memory["growth"]
  difference = long["wer_at_pauses"] - long["wer_one_by_one"]
  return text, [
      ["translate a folder vs evaluation of the same split (warm): <= 1.5x",
       f"{speed['ratio']:.2f}x", _verdict(speed["ratio"] <= 1.5)],
      ["translate's resident memory after 1000 files within 10 % of after 100",
       f"{100 * growth:+.1f} %", _verdict(abs(growth) <= 0.10)],
      ["long recordings cut at pauses: WER within 2 points of the sentences one by one",
       f"{difference:+.2f}", _verdict(abs(difference) <= 2.0)]]


def prepare_section(directory):
  """benchmarks/prepare.py: streaming preparation of a 1 h and a 10 h synthetic corpus."""
  meta, rows = _load(directory, os.path.join("cpu", "prepare.jsonl"))
  runs = {r["hours"]: r for r in rows if r.get("kind") == "prepare"}
  if len(runs) < 2:
    return "", []
  small, large = runs[min(runs)], runs[max(runs)]
  table = _table(
      ["corpus", "segments", "wall (s)", "audio s / s / worker", "main process peak (MiB)",
       "largest worker peak (MiB)", "written (MB)"],
      [[f"{r['hours']:g} h", r["segments"], r["wall_s"], r["audio_s_per_s_per_worker"],
        r["main_peak_rss_mib"], r["worker_peak_rss_mib"], round(r["prepared_bytes"] / 1e6)]
       for r in (small, large)])
  text = f"""## Preparation at scale

Machine: {_machine(meta)}. Command: `{_cmd(meta.get("command", ""))}`. Synthetic MuST-C
layout corpora (30-minute talks of 10-second segments, tones and noise at 16 kHz) prepared by
`data_prep.prepare` with {large["workers"]} workers; peak resident memory of the main process
(VmHWM) and of the largest worker.

{table}
"""
  targets = []
  for name, key in (("main process", "main_peak_rss_mib"), ("largest worker", "worker_peak_rss_mib")):
    growth = large[key] / small[key] - 1
    targets.append([f"prepare's {name}, {large['hours']:g} h corpus: peak within 10 % of the "
                    f"{small['hours']:g} h one's", f"{100 * growth:+.1f} % ({small[key]} -> "
                    f"{large[key]} MiB)", _verdict(growth <= 0.10)])
  return text, targets


def input_pipeline_section(directory):
  """benchmarks/input_pipeline.py: the loader on a MuST-C-sized synthetic corpus."""
  meta, rows = _load(directory, os.path.join("cpu", "input_pipeline.jsonl"))
  loads = [r for r in rows if r.get("kind") == "pipeline" and "frames_per_s" in r]
  if not loads:
    return "", [], ""
  corpus = next(r for r in rows if r.get("kind") == "corpus")
  copies = [r for r in rows if r.get("kind") == "copy"]
  peak = next((r for r in rows if r.get("kind") == "peak"), {})
  pads = [r for r in rows if r.get("kind") == "padding"]
  pad_meta, pad_rows = _load(directory, os.path.join("cpu", "input_pipeline_padding.jsonl"))
  if pad_rows:                      # a later --padding_only run of the same lengths
    pads = [r for r in pad_rows if r.get("kind") == "padding"]
  pad_source = (f"Command: `{_cmd(pad_meta.get('command', ''))}` "
                f"({pad_meta.get('date', '')}; the same lengths, an index only)."
                if pad_rows else "")
  table = _table(
      ["page cache", "workers", "frames/s", "per worker core", "main process CPU per batch "
       "(ms)", "main process wait per batch (ms)"],
      [[r["cache"], r["workers"] or "0 (inline)", f"{r['frames_per_s'] / 1e6:.2f} M",
        f"{r['frames_per_s_per_worker_core'] / 1e6:.2f} M",
        f"{1000 * r['main_cpu_s_per_batch']:.2f}", f"{1000 * r['main_wall_s_per_batch']:.1f}"]
       for r in loads])
  pad_table = _table(["token buckets per source bucket", "shapes", "padded frames",
                      "padded target tokens"],
                     [[r["num_token_buckets"], len(r["shapes"]),
                       f"{100 * r['padded_frames_share']:.1f} %",
                       f"{100 * r['padded_tokens_share']:.1f} %"] for r in pads])
  ceiling = min(c["frames_per_s"] for c in copies)
  detail = f"""## The input pipeline at MuST-C's size

Machine: {_machine(meta)}, matmul peak {meta.get("matmul_peak_gflops_before")} GFLOP/s before
and {peak.get("matmul_peak_gflops_after")} after. Command: `{_cmd(meta.get("command", ""))}`. A
synthetic prepared corpus of {corpus["bytes"] / 1e9:.1f} GB of features ({corpus["utterances"]:,}
utterances, MuST-C En-De-like lengths: benchmarks/input_pipeline.py), read at the thesis's
batch ({meta.get("max_frames"):,} padded frames, utterance CMVN, SpecAugment lb). Real frames
per second over {loads[0]["batches"]} batches; the hot rows read batches read just before,
the cold ones batches after the kernel's page cache was dropped. A plain copy of the same
bytes from the mapped files (page cache hot) read {ceiling / 1e6:.1f}-
{max(c["frames_per_s"] for c in copies) / 1e6:.1f} M frames/s in the same run.

{table}

Padding over a whole epoch's plan, 8 source buckets (a split bucket's batches balanced).
{pad_source}

{pad_table}
"""
  hot = [r for r in loads if r["cache"] == "hot"]
  workers = [r for r in hot if r["workers"] > 0]
  per_core = min(r["frames_per_s_per_worker_core"] for r in hot)
  main_cpu = max(r["main_cpu_s_per_batch"] for r in workers) if workers else float("nan")
  configured = next((r for r in pads if r["num_token_buckets"] == 1), pads[0]) if pads else {}
  cold = [r for r in loads if r["cache"] == "cold"]
  inline = min(r["frames_per_s"] for r in hot if r["workers"] == 0)
  cold_text = (f" With the page cache dropped first the disk bounds it: "
               f"{min(r['frames_per_s'] for r in cold) / 1e6:.2f}-"
               f"{max(r['frames_per_s'] for r in cold) / 1e6:.2f} M frames/s." if cold else "")
  text = f"""## The input pipeline at MuST-C's size

On {corpus["bytes"] / 1e9:.1f} GB of MuST-C-like features at the thesis's 320k-frame batch, page
cache hot: {inline / 1e6:.2f} M frames/s inline, at least {per_core / 1e6:.2f} M per worker core,
the main process's share {1000 * main_cpu:.2f} ms of CPU per batch.{cold_text} Tables and padding:
[benchmarks/details.md](benchmarks/details.md#the-input-pipeline-at-must-cs-size).
"""
  targets = [
      ["input pipeline per worker core (320k frames, utterance CMVN, SpecAugment, MuST-C "
       "lengths, page cache hot): >= 2 M frames/s", f"{per_core / 1e6:.2f} M (copy ceiling "
       f"{ceiling / 1e6:.1f} M)", _verdict(per_core >= 2e6)],
      ["input pipeline, main process's CPU per batch: <= 6 ms (10 % of a 0.06 s update)",
       f"{1000 * main_cpu:.2f} ms", _verdict(main_cpu <= 0.006)]]
  by_workers = {r["workers"]: r["frames_per_s"] for r in hot}
  most = max(by_workers)
  if most > 1 and 1 in by_workers:
    scaling = by_workers[most] / by_workers[1]
    targets.append([f"input pipeline scales with its workers: {most} workers >= "
                    f"{0.8 * most:.1f}x one worker's frames/s (the host's {meta.get('cpu_count')}"
                    f" cores)", f"{scaling:.2f}x", _verdict(scaling >= 0.8 * most)])
  if configured:
    meeting = [r for r in pads if r["padded_tokens_share"] <= 0.15]
    best = (min(meeting, key=lambda r: len(r["shapes"])) if meeting else
            min(pads, key=lambda r: r["padded_tokens_share"]))     # the fewest shapes that do
    targets.append(["padded target tokens on MuST-C-like lengths: <= 15 %",
                    f"{100 * configured['padded_tokens_share']:.1f} % with 8 shapes; "
                    f"{100 * best['padded_tokens_share']:.1f} % with "
                    f"{len(best['shapes'])} (data.num_token_buckets="
                    f"{best['num_token_buckets']})",
                    _verdict(best["padded_tokens_share"] <= 0.15)])
  return text, targets, detail


def index_scale_section(directory):
  """benchmarks/index_scale.py: a 250k-segment index in fairseq's form and prepare's."""
  meta, rows = _load(directory, os.path.join("cpu", "index_scale.jsonl"))
  if not rows:
    return "", []
  segments = rows[-1]["segments"]
  rows = [r for r in rows if r["segments"] == segments]
  by = {r["measure"]: r for r in rows}
  if not meta:                        # each row carries its machine and command
    meta = {**rows[-1].get("machine", {}), "command": rows[-1].get("command", "")}
  what = {"fairseq_index": "fairseq root -> index (data_prep.fairseq_data.write_index)",
          "fairseq_st": "ST training split loaded + batch plan, fairseq root",
          "fairseq_asr": "ASR training split loaded + batch plan, fairseq root",
          "prepare_st": "ST training split loaded + batch plan, prepare's index",
          "prepare_main": "data_prep.prepare's main process: segment lists read, shards "
                          "planned, the index built from the shards' sidecars"}
  table = _table(["process", "peak resident memory (MiB)", "wall (s)"],
                 [[what[m], by[m]["peak_rss_mib"], by[m]["seconds"]] for m in what if m in by])
  loads = [m for m in ("fairseq_st", "fairseq_asr", "prepare_st") if m in by]
  together = sum(by[m]["peak_rss_mib"] for m in by)
  slowest = max(by[m]["seconds"] for m in loads)
  text = f"""## Index at MuST-C's size

Machine: {_machine(meta)}. Command: `{_cmd(meta.get("command", ""))}`. A synthetic fairseq
root of {segments:,} training segments (MuST-C En-De has 229k; transcripts of MuST-C-like
lengths) whose rows point at a few hundred short entries of one fbank80.zip: the index is what
grows with the corpus. Each process is measured alone (peak resident memory, VmHWM); they
run one at a time, and the target adds them all.

{table}
"""
  return text, [
      [f"every index process together at {segments:,} segments: <= 1.5 GiB",
       f"{together / 1024:.2f} GiB", _verdict(together <= 1.5 * 1024)],
      [f"a split's load at {segments:,} segments: <= 30 s on 2 cores", f"{slowest:.1f} s",
       _verdict(slowest <= 30)]]


def train_section(directory):
  meta, rows = _load(directory, "train_step.jsonl")
  if not rows:
    return "", []
  _, fairseq_rows = _load(directory, "fairseq_train_step.jsonl")
  _, fairseq_huge = _load(directory, "fairseq_train_step_hugepages.jsonl")
  timed = [r for r in rows if "frames_per_s" in r]
  memory = [r for r in rows if "total_bytes" in r]
  peak = meta["matmul_peak_flops"]
  table = _table(["config", "encoder layout", "options", "s/step", "frames/s", "GFLOP/step",
                  "utilisation", "compile s", "host page faults / kernel CPU s per step",
                  "cores busy (user CPU s / s)"],
                 [[r["config"], f"`{r['layout']}`", _options(r), r["seconds"],
                   r["frames_per_s"],
                   f"{r['flops'] / 1e9:.0f}", f"{100 * r['utilisation']:.1f}%", r["compile_s"],
                   f"{r['page_faults_per_step']} / {r['kernel_cpu_s_per_step']}"
                   if "page_faults_per_step" in r else "—",
                   f"{r['user_cpu_s_per_step'] / r['seconds']:.2f}"
                   if "user_cpu_s_per_step" in r else "—"]
                  for r in timed])
  fairseq_text = ""
  targets = []
  ours = next((r for r in timed if r["config"] == "s2t_transformer_s"), None)
  fairseq_runs = [(runs[0], label) for runs, label in (
      (fairseq_rows, ""), (fairseq_huge, " (fairseq also on huge pages)")) if runs]
  same_run_fairseq = []   # (fairseq frames/s, ours / fairseq, label) measured after this run
  for fs, label in fairseq_runs:
    fairseq_text += (f"\nfairseq 0.12.2 (torch {fs['torch']}, {fs['threads']} threads, "
                     f"{_allocator(fs)}), same "
                     f"batch: {fs['seconds']} s/step, {fs['frames_per_s']} frames/s, measured "
                     f"{fs.get('date', 'earlier')}"
                     + (" right after the run above" if fs.get("peak") == peak else
                        ", in another run than the one above")
                     + f". Command: `/tmp/fsenv/bin/{_cmd(fs['command'])}` (a torch + fairseq "
                     "environment; how to build it: docs/notes/benchmarks-lab-notebook.md).\n")
    if ours:
      ratio = ours["frames_per_s"] / fs["frames_per_s"]
      same_run = fs.get("date") == meta.get("date") and fs.get("peak") == peak
      if same_run:
        fairseq_text += (f"fairseq's utilisation with the same FLOP count: "
                         f"{100 * ours['flops'] / fs['seconds'] / peak:.1f}%; "
                         f"s2t_transformer_s here / fairseq: {ratio:.2f}x.\n")
        same_run_fairseq.append((fs["frames_per_s"], ratio, label))
  targets += fairseq_pairs_target(directory)
  if ours:
    targets.append(["s2t_transformer_s train step >= 60% of the matmul peak",
                    f"{100 * ours['utilisation']:.1f}%", _verdict(ours["utilisation"] >= 0.6)])
  mem_table = _table(["config", "encoder layout", "options", "batch", "XLA temporaries GiB",
                      "total compiled GiB"],
                     [[r["config"], f"`{r['layout']}`", _options(r), r["memory_batch"],
                       f"{r['temp_bytes'] / 2 ** 30:.2f}", r["total_gib"]] for r in memory])
  for r in memory:
    if "nodown" in r["config"] and "transformer" not in r["config"]:
      targets.append([f"{r['config']} ({_options(r)}): a 20 000-frame batch within 11 GiB",
                      f"{r['total_gib']} GiB", _verdict(r["total_gib"] <= 11)])
  text = f"""## Training step

Machine: {_machine(meta)}; JAX with {_allocator(meta)}; measured fp32 matmul peak
{peak / 1e9:.1f} GFLOP/s (2048^2 matmul, same script). Command: `{_cmd(meta['command'])}`.
Batch {meta['batch']} x {meta['frames']} frames, {meta['tokens']} target tokens, vocabulary
8000, dropout as configured, one full update (fwd + bwd + clip + Adam);
utilisation = XLA FLOPs of the step / step time / measured peak, where the FLOPs are the
model's (the same step compiled with the dense softmax and the unchunked FFN: XLA counts a
loop body once, and the backward's recomputation is not model work). "options" are the
memory options (`model.key_block_size`, `model.ffn_token_chunk`; their default, -1, is 512 on
CPU and 0, the dense softmax, on GPU for the first, and 0, the unchunked FFN, everywhere for the
second since 2026-11-24; rows measured before that ran 1024-token chunks on CPU).

{table}
{fairseq_text}
Compiled memory of one update on {memory[0]['memory_batch'] if memory else '?'} (compile only,
`memory_analysis`: temporaries + arguments + outputs - aliased):

{mem_table}
"""
  return text, targets


def compile_share_section(directory):
  meta, rows = _load(directory, "compile_share.jsonl")
  if not rows:
    return "", []
  table = _table(["compilation cache", "stage", "updates", "training loop s", "compiling s",
                  "share"],
                 [[r["cache"], r["stage"], r["updates"], r["wall_s"], r["compile_s"],
                   f"{100 * r['compile_fraction']:.1f}%"] for r in rows])
  note = f" Note: {meta['note']}." if meta.get("note") else ""
  limits = {"cold": 0.25, "warm": 0.10}
  targets = [[f"{meta['config']} {r['stage']} stage, compilation cache {r['cache']}: <= "
              f"{100 * limits[r['cache']]:.0f}% of its wall time compiling",
              f"{100 * r['compile_fraction']:.1f}% ({r['compile_s']} of {r['wall_s']} s)",
              _verdict(r["compile_fraction"] <= limits[r["cache"]])] for r in rows]
  text = f"""## Compiling: the share of each stage's time

Machine: {_machine(meta)}. Command: `{_cmd(meta['command'])}`: the main job's command of the
date above (an older recipe than today's: the updates in the table) twice with an empty
persistent compilation cache, the second run reading what the first wrote. Seconds of
each stage's training loop (updates, dev loss, dev WER / BLEU decoding, checkpoints) and of
those the seconds in tracing, lowering and XLA's compile or cache read (JAX's monitoring
events; `compile_s` in the stage's DONE.json).{note}

{table}
"""
  return text, targets


QUICKSTART_UPDATE_RUNS = os.path.join("cpu", "2026-11-26-tcmalloc")
GPU_UPDATE_RUN = os.path.join("gpu", "2026-11-26-flash", "train_step_flash.jsonl")
HIGHEST_H200_PEAK = 655e12   # the highest bf16 matmul peak read on an H200 (2026-11-26)


def update_utilisation_targets(directory) -> list:
  """The issue's utilisation targets measured outside the generated sections: the quickstart's
  CPU update (alternated runs with and without tcmalloc, docs/notes/benchmarks-lab-notebook.md) and the
  s2t_transformer_s update on a GPU as configured."""
  targets = []
  runs = os.path.join(directory, QUICKSTART_UPDATE_RUNS)
  if os.path.isdir(runs):
    by_allocator = {"tcmalloc": [], "glibc": []}
    for name in sorted(os.listdir(runs)):
      if name.startswith("quickstart_tcmalloc") and name.endswith(".jsonl"):
        meta, rows = read_results(os.path.join(runs, name))
        allocator = "tcmalloc" if "tcmalloc" in meta.get("ld_preload", "") else "glibc"
        by_allocator[allocator] += [r["utilisation"] for r in rows if "utilisation" in r]
    with_tc, without = by_allocator["tcmalloc"], by_allocator["glibc"]
    if with_tc:
      targets.append([
          "quickstart update (batch 28 x 208 frames, the ASR and ST stages' vocabularies): "
          ">= 40% of the matmul peak",
          f"{min(with_tc):.1%}-{max(with_tc):.1%} with tcmalloc preloaded ({len(with_tc)} runs); "
          f"{min(without):.1%}-{max(without):.1%} on glibc's malloc ({len(without)} runs); "
          "`--steps 40`, alternated", _verdict(min(with_tc) >= 0.40) + " with tcmalloc"])
  meta, rows = _load(directory, GPU_UPDATE_RUN)
  flash = [r for r in rows if r.get("config", "").endswith("attention_implementation=flash")]
  if flash:
    row = flash[0]
    of_highest = row["flops"] / row["seconds"] / HIGHEST_H200_PEAK
    targets.append([
        "s2t_transformer_s update on a GPU (bf16, batch 320 x 1000, attention dropout as "
        "configured): >= 35% of the matmul peak",
        f"{row['utilisation']:.1%} of the peak measured in the same call on an "
        f"{meta.get('device', 'GPU')} ({row['seconds']} s per update; that peak read low: "
        f"{of_highest:.1%} of the highest reading, {HIGHEST_H200_PEAK / 1e12:.0f} TFLOP/s)",
        _verdict(row["utilisation"] >= 0.35)])
  return targets


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--dir", default="docs/benchmarks")
  parser.add_argument("--out", default="docs/benchmarks.md")
  args = parser.parse_args(argv)
  sections, targets = [], []
  attention_text, attention_targets, attention_details = attention_section(args.dir, args.dir)
  page_faults, page_fault_targets = page_fault_section(args.dir)
  decode, decode_targets = decode_section(args.dir)
  fairseq_generate, fairseq_generate_targets = fairseq_generate_section(args.dir)
  pipeline_text, pipeline_targets, pipeline_details = input_pipeline_section(args.dir)
  blockwise_text, blockwise_targets, blockwise_details = blockwise_section(args.dir)
  details = """# Benchmarks: the detail tables

Generated by `python benchmarks/report.py` beside [../benchmarks.md](../benchmarks.md).

""" + attention_details + "\n" + blockwise_details + "\n" + decode + "\n" + \
      fairseq_generate + "\n" + page_faults + "\n" + pipeline_details
  with open(os.path.join(args.dir, "details.md"), "w", encoding="utf-8") as f:
    f.write(details)
  for text, rows in ((attention_text, attention_targets), (blockwise_text, blockwise_targets),
                     train_section(args.dir), compile_share_section(args.dir),
                     translate_section(args.dir),
                     prepare_section(args.dir), (pipeline_text, pipeline_targets),
                     index_scale_section(args.dir)):
    if text:
      sections.append(text)
      targets += rows
  targets += decode_targets + fairseq_generate_targets + page_fault_targets + \
      update_utilisation_targets(args.dir)
  header = """# Benchmarks

Generated by `python benchmarks/report.py` from the JSON lines in `docs/benchmarks/`, each
written by the command quoted in its section. Rerun a script, then the report, to update. The
GPU figures, the comparisons with the PyTorch peers and how every number moved are in the lab
notebook, [notes/benchmarks-lab-notebook.md](notes/benchmarks-lab-notebook.md).

## Targets (from the performance issue), checked on the numbers below

"""
  text = header + _table(["target", "measured", "verdict"], targets) + "\n\n" + \
      "\n".join(sections)
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
