"""Two or more configs' training updates, interleaved in one process:

    python -m benchmarks.update_pairs \
        --configs "multiformer_fast,multiformer_fast@attention_implementation=xla" \
        --out docs/benchmarks/cpu/update_pairs_multiformer_fast.jsonl [--rounds 15]

For comparing implementations of one model, where separate processes differ by more than the
effect (single CPU timings here spread by +-10%). Each config (train_step.py's `name@key=value`
form, vocabulary 8000, dropout as configured) is compiled once; then `--rounds` rounds time one
update of each in turn, on the same batch of `--batch` x `--frames` frames and `--tokens`
tokens. One row per config: the median and the range of its updates' seconds, and the median
ratio of each round's time to the first config's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax

from benchmarks.common import Results, machine
from benchmarks.train_step import load_config, make_batch, setup
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", required=True, help="comma-separated, the reference first")
  parser.add_argument("--out", required=True)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--frames", type=int, default=1000)
  parser.add_argument("--tokens", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = parser.parse_args(argv)
  specs = args.configs.split(",")
  runs = {}
  for spec in specs:
    config = load_config(spec, args.dtype)
    _, step, state, dp = setup(config)
    batch = dp.shard(make_batch(args.batch, args.frames, args.tokens, config.model.input_dim,
                                config.model.vocab_size))
    runs[spec] = [step.single.function.lower(state, batch).compile(), state, batch]

  def update(spec) -> float:
    compiled, state, batch = runs[spec]
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    runs[spec][1] = state
    return time.perf_counter() - start

  for spec in specs:          # warm-up: two updates each
    update(spec), update(spec)
  seconds = {spec: [] for spec in specs}
  for _ in range(args.rounds):
    for spec in specs:
      seconds[spec].append(update(spec))
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
  for spec in specs:
    ratios = [a / b for a, b in zip(seconds[spec], seconds[specs[0]])]
    results.add(config=spec, median_s=round(statistics.median(seconds[spec]), 4),
                min_s=round(min(seconds[spec]), 4), max_s=round(max(seconds[spec]), 4),
                median_ratio_to_first=round(statistics.median(ratios), 4))


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
