"""The encoder's evaluation forward with each attention implementation (model/attention/fused.py).

    python -m benchmarks.encoder_eval --out docs/benchmarks/encoder_eval.jsonl \
        [--config s2t_transformer_s] [--dtype bfloat16] [--batch 64] [--frames 1000] \
        [--implementations xla,cudnn]

One model (random weights of the config, vocabulary 8000) and one batch of utterances of
`--frames` down to half of it (so the key masks pad); per implementation the median seconds of
the jitted deterministic `encode`, and the largest difference of its valid outputs from the
first implementation's. 'cudnn' needs a GPU and bfloat16 (benchmarks/gpu_check.sh runs it).
"""

from __future__ import annotations

import argparse
import importlib
import sys

import jax
import numpy as np

from benchmarks.common import Results, machine, time_call
from multiformer_jax import build_model, init_params
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/encoder_eval.jsonl")
  parser.add_argument("--config", default="s2t_transformer_s")
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--frames", type=int, default=1000)
  parser.add_argument("--implementations", default="xla,cudnn")
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args(argv)
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
  config = importlib.import_module(f"configs.{args.config}").get_config()
  config.model.vocab_size, config.model.dtype = 8000, args.dtype
  rng = np.random.default_rng(0)
  features = rng.normal(size=(args.batch, args.frames, config.model.input_dim)).astype("float32")
  lengths = np.linspace(args.frames, args.frames // 2, args.batch).astype("int32")
  params = None
  first = None
  for implementation in args.implementations.split(","):
    config.model.attention_implementation = implementation
    model = build_model(config)
    if params is None:
      params = init_params(model, jax.random.PRNGKey(0))
    encode = jax.jit(lambda p, f, n, model=model: model.apply({"params": p}, f, n,
                                                              method=model.encode))
    encoded, mask = encode(params, features, lengths)
    valid = np.asarray(encoded, np.float32)[np.asarray(mask)]         # [valid frames, d]
    row = {"implementation": implementation, "batch": args.batch, "frames": args.frames,
           "seconds": round(time_call(encode, params, features, lengths,
                                      repeats=args.repeats), 5),
           "output_abs_mean": float(np.abs(valid).mean())}
    if first is None:
      first = (implementation, valid)
    else:
      row[f"max_abs_diff_vs_{first[0]}"] = float(np.abs(valid - first[1]).max())
      row[f"mean_abs_diff_vs_{first[0]}"] = float(np.abs(valid - first[1]).mean())
    results.add(**row)


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
