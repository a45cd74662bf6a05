"""Training-step throughput and memory of whole models.

    python -m benchmarks.train_step --out docs/benchmarks/train_step.jsonl \
        [--configs s2t_transformer_s,s2t_v2,h_lc_nodown,multiformer_s_nodown]

For each config (vocabulary 8000, dropout as configured): one full update (fwd + bwd + clip
+ Adam, the toolkit's own jitted train step) on a batch of `--batch` utterances of `--frames`
frames and `--tokens` target tokens: seconds per step, frames/s, XLA's FLOPs of the step (of the
same model computed without the blockwise softmax, the chunked FFN and dropout: model FLOPs,
the backward's recomputation and the dropout masks' hash not counted), and utilisation =
FLOPs / step time / the matmul peak measured by this script on this machine; also the host's
page faults and kernel and user CPU seconds per step (user CPU / step time: how many of the
machine's cores the step kept busy).
Then the compiled memory (temporaries + arguments + outputs, `memory_analysis`, compile only)
of a batch of `--memory_batch` x `--memory_frames` frames (20 000 frames by default) for the
same configs plus their full-attention baselines. A config may carry model-key overrides after
`@`, ';' between keys: `h_lc_nodown@key_block_size=0;ffn_token_chunk=0` is h_lc_nodown with the
dense softmax and the unchunked feed-forward.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import importlib
import os
import resource
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.report_format import (allocator, command_line, load, machine_line, markdown_table,
                                      options_cell, verdict)
from benchmarks import fairseq_pairs
from benchmarks.common import (Results, executable_stats, local_heads_in_one_chunk,
                               lowered_flops, machine, matmul_peak, read_results)
from multiformer_jax import build_model
from multiformer_jax.training import optimizer
from multiformer_jax.training import steps
from multiformer_jax.model import dropout as dropout_lib
from multiformer_jax.model.model_config import DROPOUT_RATES
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags


def make_batch(batch: int, frames: int, tokens: int, input_dim: int, vocab: int):
  rng = np.random.default_rng(0)
  return {"features": rng.normal(size=(batch, frames, input_dim)).astype(np.float32),
          "lengths": np.full(batch, frames, np.int32),
          "prev_tokens": rng.integers(4, vocab, size=(batch, tokens)).astype(np.int32),
          "targets": rng.integers(4, vocab, size=(batch, tokens)).astype(np.int32),
          "weights": np.ones(batch, np.float32)}


def load_config(spec: str, dtype: str):
  """'name[@key=value;...]': configs/<name>.py with vocabulary 8000, `dtype` and the model-key
  overrides applied."""
  name, _, overrides = spec.partition("@")
  config = importlib.import_module(f"configs.{name}").get_config()
  config.model.vocab_size = 8000
  config.model.dtype = dtype
  for item in filter(None, overrides.split(";")):
    key, value = item.split("=", 1)
    setattr(config.model, key, type(config.model[key])(value))
  return config


def setup(config):
  model = build_model(config)
  tx, schedule = optimizer.make_optimizer(config.train, config.st)
  dp = DataParallel("jit")
  step, _ = steps.make_steps(model, tx, schedule, dp, config.train.label_smoothing)
  state = dp.replicate(steps.create_state(model, tx, jax.random.PRNGKey(0)))
  return model, step, state, dp


def abstract(tree):
  """The shapes and dtypes of `tree`'s arrays (for compiling without data)."""
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def model_flops(config, batch) -> float:
  """XLA's FLOPs of one update of the model without the loop-based memory options and without
  dropout: XLA counts a loop body once, so the blockwise softmax and the chunked FFN would
  show a fraction of their work, and it counts the integer operations of the dropout masks'
  hash (multiformer_jax/model/dropout.py; 2.6 GFLOP of 271.5 in an s2t_transformer_s update at batch
  8, ~22 of 300 with the threefry hash before 2026-11-24), which are not model arithmetic. The
  memory options' recomputation is not counted (model FLOPs, as in MFU); local heads, which
  always loop, are traced as one chunk (their backward's recomputed q k^T is counted). The
  count is the lowered program's (common.lowered_flops: no second compilation); on other
  backends than the CPU see flops_on_cpu."""
  counted = copy.deepcopy(config)
  counted.model.key_block_size, counted.model.ffn_token_chunk = 0, 0
  counted.model.attention_implementation = "xla"   # the same function, countable on any backend
  for rate in DROPOUT_RATES:
    counted.model[rate] = 0.0
  with local_heads_in_one_chunk():
    _, step, state, _ = setup(counted)
    return lowered_flops(step.single.function.lower(abstract(state), abstract(batch)))


def flops_on_cpu(spec: str, args) -> float:
  """model_flops of config `spec` at the run's batch, traced by this script in a CPU-only
  process (--flops_only): the program is the same on every backend, and on a GPU a lowered
  program reports no FLOPs (jax's Lowered.cost_analysis is not implemented through the PJRT
  C API that the CUDA plugin uses)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "flops.jsonl")
    subprocess.run([sys.executable, "-m", "benchmarks.train_step", "--flops_only", "--configs", spec,
                    "--out", out, "--dtype", args.dtype, "--batch", str(args.batch),
                    "--frames", str(args.frames), "--tokens", str(args.tokens)],
                   env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True,
                   stdout=subprocess.DEVNULL,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return read_results(out)[1][0]["flops"]


def memory_options(model) -> dict:
  """The memory options the model was built with (AUTO resolved for this backend)."""
  return {"key_block_size": model.config.resolved_key_block_size,
          "ffn_token_chunk": model.config.resolved_ffn_token_chunk}


def step_stats(step, state, batch) -> dict:
  """executable_stats of one update of update_freq 1 (apply_update and first_micro)."""
  return executable_stats(step.single.function.lower(state, batch).compile())



# The report's section of this benchmark (benchmarks/report.py assembles them).
HIGHEST_H200_PEAK = 655e12   # the highest bf16 matmul peak read on an H200 (2026-11-26)


GPU_UPDATE_RUN = os.path.join("gpu", "2026-11-26-flash", "train_step_flash.jsonl")


QUICKSTART_UPDATE_RUNS = os.path.join("cpu", "2026-11-26-tcmalloc")


def report_section(directory):
  meta, rows = load(directory, "train_step.jsonl")
  if not rows:
    return "", []
  _, fairseq_rows = load(directory, "fairseq_train_step.jsonl")
  _, fairseq_huge = load(directory, "fairseq_train_step_hugepages.jsonl")
  timed = [r for r in rows if "frames_per_s" in r]
  memory = [r for r in rows if "total_bytes" in r]
  peak = meta["matmul_peak_flops"]
  table = markdown_table(["config", "encoder layout", "options", "s/step", "frames/s", "GFLOP/step",
                  "utilisation", "compile s", "host page faults / kernel CPU s per step",
                  "cores busy (user CPU s / s)"],
                 [[r["config"], f"`{r['layout']}`", options_cell(r), r["seconds"],
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
                     f"{allocator(fs)}), same "
                     f"batch: {fs['seconds']} s/step, {fs['frames_per_s']} frames/s, measured "
                     f"{fs.get('date', 'earlier')}"
                     + (" right after the run above" if fs.get("peak") == peak else
                        ", in another run than the one above")
                     + f". Command: `/tmp/fsenv/bin/{command_line(fs['command'])}` (a torch + fairseq "
                     "environment; how to build it: docs/notes/benchmarks-lab-notebook.md).\n")
    if ours:
      ratio = ours["frames_per_s"] / fs["frames_per_s"]
      same_run = fs.get("date") == meta.get("date") and fs.get("peak") == peak
      if same_run:
        fairseq_text += (f"fairseq's utilisation with the same FLOP count: "
                         f"{100 * ours['flops'] / fs['seconds'] / peak:.1f}%; "
                         f"s2t_transformer_s here / fairseq: {ratio:.2f}x.\n")
        same_run_fairseq.append((fs["frames_per_s"], ratio, label))
  targets += fairseq_pairs.report_targets(directory)
  if ours:
    targets.append(["s2t_transformer_s train step >= 60% of the matmul peak",
                    f"{100 * ours['utilisation']:.1f}%", verdict(ours["utilisation"] >= 0.6)])
  mem_table = markdown_table(["config", "encoder layout", "options", "batch", "XLA temporaries GiB",
                      "total compiled GiB"],
                     [[r["config"], f"`{r['layout']}`", options_cell(r), r["memory_batch"],
                       f"{r['temp_bytes'] / 2 ** 30:.2f}", r["total_gib"]] for r in memory])
  for r in memory:
    if "nodown" in r["config"] and "transformer" not in r["config"]:
      targets.append([f"{r['config']} ({options_cell(r)}): a 20 000-frame batch within 11 GiB",
                      f"{r['total_gib']} GiB", verdict(r["total_gib"] <= 11)])
  text = f"""## Training step

Machine: {machine_line(meta)}; JAX with {allocator(meta)}; measured fp32 matmul peak
{peak / 1e9:.1f} GFLOP/s (2048^2 matmul, same script). Command: `{command_line(meta['command'])}`.
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


def utilisation_targets(directory) -> list:
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
          "`--steps 40`, alternated", verdict(min(with_tc) >= 0.40) + " with tcmalloc"])
  meta, rows = load(directory, GPU_UPDATE_RUN)
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
        verdict(row["utilisation"] >= 0.35)])
  return targets


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/train_step.jsonl")
  parser.add_argument("--configs", default="s2t_transformer_s,s2t_v2,h_lc_nodown,"
                                           "multiformer_s_nodown")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--frames", type=int, default=1000)
  parser.add_argument("--tokens", type=int, default=50)
  parser.add_argument("--steps", type=int, default=5, help="timed steps after 2 warm-up steps")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--memory_batch", type=int, default=8)
  parser.add_argument("--memory_frames", type=int, default=2500)
  parser.add_argument("--memory_configs", default="h_lc_nodown,multiformer_s_nodown,"
                                                  "s2t_transformer_s_nodown")
  parser.add_argument("--skip_timing", action="store_true")
  parser.add_argument("--flops_only", action="store_true",
                      help="only the model FLOPs of one update of each of --configs at --batch "
                           "x --frames (traced, not compiled: a GPU's figure, on any machine)")
  parser.add_argument("--peak_size", type=int, default=2048,
                      help="matmul size for the peak (8192 on a GPU)")
  parser.add_argument("--trace_dir", default="",
                      help="write a profiler trace (perfetto_trace.json.gz) of 3 more steps of "
                           "each timed config under this folder (summary: "
                           "benchmarks/trace_summary.py), and the compiled step's optimised "
                           "HLO (<config>.hlo.txt.gz: what each traced fusion computes)")
  parser.add_argument("--flops", type=float, default=0.0,
                      help="the model FLOPs of one update of every config of --configs, when "
                           "already counted (their dropout and attention implementation do not "
                           "change it): skips counting them")
  parser.add_argument("--materialise_residual_on_gpu", action="store_true",
                      help="materialise the residual stream's cotangent on a GPU as on the "
                           "CPU (multiformer_jax/model/dropout.py: add_residual)")
  args = parser.parse_args(argv)
  if args.materialise_residual_on_gpu:
    dropout_lib.MATERIALISE_ON = ("cpu", "gpu")
  if args.flops_only:
    results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
    for name in args.configs.split(","):
      config = load_config(name, args.dtype)
      batch = abstract(make_batch(args.batch, args.frames, args.tokens, config.model.input_dim,
                                  config.model.vocab_size))
      results.add(config=name, layout=config.model.encoder_layout,
                  batch=f"{args.batch} x {args.frames} frames, {args.tokens} tokens",
                  flops=model_flops(config, batch))
    return
  on_gpu = jax.default_backend() == "gpu"
  peak = matmul_peak(args.peak_size,
                     dtype=jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32,
                     repeats=20 if on_gpu else 5, warmup_seconds=2.0 if on_gpu else 0.0)
  results = Results(args.out, {**machine(), **vars(args), "matmul_peak_flops": peak,
                               "command": " ".join(sys.argv)})
  print(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s", flush=True)
  if not args.skip_timing:
    for name in args.configs.split(","):
      config = load_config(name, args.dtype)
      model, step, state, dp = setup(config)
      batch = dp.shard(make_batch(args.batch, args.frames, args.tokens,
                                  config.model.input_dim, config.model.vocab_size))
      t0 = time.perf_counter()
      update = step.single.function.lower(state, batch).compile()  # timed below: compiled once
      compile_s = time.perf_counter() - t0
      if args.flops:
        flops = args.flops
      elif jax.default_backend() == "cpu":
        flops = model_flops(config, batch)
      else:
        flops = flops_on_cpu(name, args)
      for _ in range(2):
        state, metrics = update(state, batch)
      jax.block_until_ready(metrics)
      usage, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
      for _ in range(args.steps):
        state, metrics = update(state, batch)
      jax.block_until_ready(metrics)
      seconds = (time.perf_counter() - t0) / args.steps
      after = resource.getrusage(resource.RUSAGE_SELF)   # host page faults: host_memory.py
      faults = (after.ru_minflt - usage.ru_minflt) / args.steps
      kernel_s = (after.ru_stime - usage.ru_stime) / args.steps
      user_s = (after.ru_utime - usage.ru_utime) / args.steps
      if args.trace_dir:  # after the timing, so that tracing does not slow the timed steps
        trace_name = os.path.join(args.trace_dir, name.replace("@", "_"))
        with jax.profiler.trace(trace_name, create_perfetto_trace=True):
          for _ in range(3):
            state, metrics = update(state, batch)
          jax.block_until_ready(metrics)
        with gzip.open(trace_name + ".hlo.txt.gz", "wt") as hlo:
          hlo.write(update.as_text())
      frames = args.batch * args.frames
      results.add(config=name, layout=config.model.encoder_layout,
                  **memory_options(model), seconds=round(seconds, 4),
                  frames_per_s=round(frames / seconds, 1), flops=flops,
                  utilisation=round(flops / seconds / peak, 4), compile_s=round(compile_s, 1),
                  page_faults_per_step=round(faults), kernel_cpu_s_per_step=round(kernel_s, 3),
                  user_cpu_s_per_step=round(user_s, 3),
                  loss=float(np.asarray(metrics["loss"]).reshape(-1)[0]))
  for name in filter(None, args.memory_configs.split(",")):
    config = load_config(name, args.dtype)
    model, step, state, dp = setup(config)
    batch = abstract(make_batch(args.memory_batch, args.memory_frames, 2 * args.tokens,
                                config.model.input_dim, config.model.vocab_size))
    memory = step_stats(step, abstract(state), batch)
    total = memory["temp_bytes"] + memory["argument_bytes"] + memory["output_bytes"] - \
        memory["alias_bytes"]
    results.add(config=name, layout=config.model.encoder_layout, **memory_options(model),
                memory_batch=f"{args.memory_batch} x {args.memory_frames} frames",
                temp_bytes=memory["temp_bytes"], total_bytes=total,
                total_gib=round(total / 2 ** 30, 2))


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
