"""The layout ablation's cost per layout: seconds and FLOPs of one update, and the encoder's
evaluation throughput, of configs/layout_ablation.py's model with each encoder layout.

    python -m benchmarks.layouts --out docs/benchmarks/layouts.jsonl \
        [--layouts full,local,kernel,conv,mixed] \
        [--extra 'windows=2x(4*full) 1x(4*local(9)) ...']

For each layout and each batch shape of `--shapes` (utterances x frames x target tokens; the
defaults are two of the quickstart's bucket shapes, ~6000 frames each): one full update (the
toolkit's jitted train step: fwd + bwd + clip + Adam; vocabulary data.st_vocab, no dropout as
the recipe) timed over `--steps` steps after 2 warm-up steps, its model FLOPs
(benchmarks/train_step.py's model_flops), and the encoder's deterministic forward (`encode`:
subsampler + encoder layers) timed and counted alone: frames per second and GFLOP. The matmul
peak is measured in the same run (utilisation = FLOPs / seconds / peak).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

from benchmarks.common import Results, lowered_flops, machine, matmul_peak, time_call
from benchmarks.train_step import make_batch, model_flops, setup
from configs import layout_ablation
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags


def layout_config(name: str, layout: str | None = None):
  """configs/layout_ablation.py's config with layout variant `name` (or `layout` given)."""
  config = layout_ablation.get_config(None if layout else name)
  if layout:
    config.model.encoder_layout = layout
  config.model.vocab_size = config.data.st_vocab
  return config


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/layouts.jsonl")
  parser.add_argument("--layouts", default=",".join(layout_ablation.LAYOUTS))
  parser.add_argument("--extra", action="append", default=[],
                      help="NAME=LAYOUT: another layout (e.g. the efficient model's windows)")
  parser.add_argument("--shapes", default="18x320x56,5x1088x88",
                      help="comma-separated UTTERANCESxFRAMESxTOKENS batch shapes")
  parser.add_argument("--steps", type=int, default=10)
  args = parser.parse_args(argv)
  peak = matmul_peak(2048)
  results = Results(args.out, {**machine(), **vars(args), "matmul_peak_flops": peak,
                               "command": " ".join(sys.argv)})
  print(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s", flush=True)
  named = [(n, None) for n in args.layouts.split(",") if n]
  named += [tuple(item.split("=", 1)) for item in args.extra]
  shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
  for name, layout in named:
    config = layout_config(name, layout)
    model, step, state, dp = setup(config)
    encode = jax.jit(lambda p, f, n: model.apply({"params": p}, f, n, method=model.encode))
    for utterances, frames, tokens in shapes:
      batch = make_batch(utterances, frames, tokens, config.model.input_dim,
                         config.model.vocab_size)
      flops = model_flops(config, batch)
      sharded = dp.shard(batch)
      update = step.single.function.lower(state, sharded).compile()
      for _ in range(2):
        state, metrics = update(state, sharded)
      jax.block_until_ready(metrics)
      t0 = time.perf_counter()
      for _ in range(args.steps):
        state, metrics = update(state, sharded)
      jax.block_until_ready(metrics)
      seconds = (time.perf_counter() - t0) / args.steps
      features, lengths = batch["features"], batch["lengths"]
      params = state.params                      # the update donates the state it is given
      encode_s = time_call(encode, params, features, lengths, repeats=args.steps)
      encode_flops = lowered_flops(encode.lower(params, features, lengths))
      results.add(layout_name=name, layout=config.model.encoder_layout,
                  batch=f"{utterances} x {frames} frames, {tokens} tokens",
                  update_s=round(seconds, 4), update_gflop=round(flops / 1e9, 2),
                  utilisation=round(flops / seconds / peak, 4),
                  encoder_s=round(encode_s, 4), encoder_gflop=round(encode_flops / 1e9, 2),
                  encoder_frames_per_s=round(utterances * frames / encode_s, 1))


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
