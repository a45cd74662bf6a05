"""Training-step throughput and memory of whole models.

    python benchmarks/train_step.py --out docs/benchmarks/train_step.jsonl \
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (Results, executable_stats, local_heads_in_one_chunk,  # noqa: E402
                               lowered_flops, machine, matmul_peak, read_results)
from multiformer_jax import build_model
from multiformer_jax.training import optimizer
from multiformer_jax.training import steps
from multiformer_jax.model import dropout as dropout_lib  # noqa: E402
from multiformer_jax.model.model_config import DROPOUT_RATES  # noqa: E402
from multiformer_jax.training.parallel import DataParallel  # noqa: E402
from multiformer_jax.runtime.host_memory import set_up_host_allocator  # noqa: E402
from multiformer_jax.runtime.xla_flags import add_default_xla_flags  # noqa: E402


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
    subprocess.run([sys.executable, os.path.abspath(__file__), "--flops_only", "--configs", spec,
                    "--out", out, "--dtype", args.dtype, "--batch", str(args.batch),
                    "--frames", str(args.frames), "--tokens", str(args.tokens)],
                   env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True,
                   stdout=subprocess.DEVNULL)
    return read_results(out)[1][0]["flops"]


def memory_options(model) -> dict:
  """The memory options the model was built with (AUTO resolved for this backend)."""
  return {"key_block_size": model.config.resolved_key_block_size,
          "ffn_token_chunk": model.config.resolved_ffn_token_chunk}


def step_stats(step, state, batch) -> dict:
  """executable_stats of one update of update_freq 1 (apply_update and first_micro)."""
  return executable_stats(step.single.function.lower(state, batch).compile())


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
