"""Beam search speed: the cached decoder against recomputing the prefix at every step.

    python -m benchmarks.decode --out docs/benchmarks/decode.jsonl [--config s2t_transformer_s]
        [--batch 8] [--frames 1000] [--tokens 50] [--beam 5]

Both run the same `multiformer_jax.evaluation.decode.beam_search` (fairseq semantics) on the same model
(random weights of the named config, vocabulary 8000) and utterances; the hypothesis length is
fixed by max_len = `--tokens` (EOS forced after it; a random model almost never ends earlier,
and the output lengths are reported). "cached" is the toolkit's decoder: cross-attention keys
and values once per utterance, self-attention keys and values cached per step. "recompute"
keeps only the token prefix and runs the whole decoder over it at every step (padded to the
static maximum length, as jit requires), taking the last position's logits.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.report_format import command_line, load, machine_line, markdown_table, verdict
from benchmarks.common import Results, machine, time_call
from multiformer_jax import build_model, init_params
from multiformer_jax.evaluation import decode
from multiformer_jax.evaluation.inference import make_beam_search
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags


def make_recompute_translate(model, beam: int, tokens: int):
  cfg = model.config

  def translate(params, features, lengths):
    variables = {"params": params}
    encoded, mask = model.apply(variables, features, lengths, method=model.encode)
    batch = features.shape[0]
    encoded = jnp.repeat(encoded, beam, axis=0)                  # [batch * beam, src, d]
    mask = jnp.repeat(mask, beam, axis=0)
    max_steps = tokens + 1

    def step_fn(current, index, prefix):                           # prefix: [n, max_steps]
      prefix = prefix.at[:, index].set(current[:, 0])
      logits = model.apply(variables, prefix, encoded, mask, method=model.decode)
      return logits[:, index], prefix

    prefix = jnp.full((batch * beam, max_steps), cfg.pad_id, jnp.int32)
    max_lengths = jnp.full((batch,), tokens, jnp.int32)
    out, _ = decode.beam_search(step_fn, prefix, batch, beam, max_steps, max_lengths,
                                cfg.vocab_size, cfg.eos_id, cfg.pad_id, cfg.bos_id, 1.0)
    return out
  return jax.jit(translate)



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  meta, rows = load(directory, "decode.jsonl")
  if not rows:
    return "", []
  by = {r["variant"]: r for r in rows}
  table = markdown_table(["variant", "seconds per batch", "sentences/s", "mean output tokens"],
                 [[v, by[v]["seconds"], by[v]["sentences_per_s"], by[v]["mean_output_tokens"]]
                  for v in ("cached", "recompute") if v in by])
  speed = by["cached"]["sentences_per_s"] / by["recompute"]["sentences_per_s"]
  same = by.get("check", {}).get("identical_hypotheses")
  text = f"""## Beam search: cache against recomputing the prefix

Machine: {machine_line(meta)}. Command: `{command_line(meta['command'])}`
({meta['config']}, random weights, vocabulary 8000, {meta['batch']} utterances x
{meta['frames']} frames, beam {meta['beam']}, {meta['tokens']} target tokens).
Identical hypotheses from both: {same}.

{table}
"""
  return text, [[f"beam {meta['beam']} with the cache vs recompute at {meta['tokens']} tokens: "
                 ">= 3x", f"{speed:.1f}x", verdict(speed >= 3)]]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="docs/benchmarks/decode.jsonl")
  parser.add_argument("--config", default="s2t_transformer_s")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--frames", type=int, default=1000)
  parser.add_argument("--tokens", type=int, default=50)
  parser.add_argument("--beam", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = parser.parse_args(argv)
  config = importlib.import_module(f"configs.{args.config}").get_config()
  config.model.vocab_size = 8000
  config.model.dtype = args.dtype
  model = build_model(config)
  params = init_params(model, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  features = jnp.asarray(rng.normal(size=(args.batch, args.frames, config.model.input_dim)),
                         jnp.float32)
  lengths = jnp.full((args.batch,), args.frames, jnp.int32)
  results = Results(args.out, {**machine(), **vars(args), "command": " ".join(sys.argv)})
  variants = {
      # max_len = 0 * frames + tokens: exactly `tokens` steps unless EOS comes first.
      "cached": make_beam_search(model, args.beam, 1.0, 0.0, args.tokens),
      "recompute": make_recompute_translate(model, args.beam, args.tokens),
  }
  outputs = {}
  for name, translate in variants.items():
    seconds = time_call(translate, params, features, lengths, repeats=args.repeats)
    out = np.asarray(translate(params, features, lengths))
    outputs[name] = out
    results.add(variant=name, seconds=round(seconds, 4),
                sentences_per_s=round(args.batch / seconds, 3),
                mean_output_tokens=float((out != model.config.pad_id).sum(1).mean()))
  same = bool(np.array_equal(outputs["cached"][:, :args.tokens],
                             outputs["recompute"][:, :args.tokens]))
  results.add(variant="check", identical_hypotheses=same)


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  main()
