"""Evaluation from checkpoints: cached beam search, sacreBLEU (ST) or WER (ASR).

    python -m multiformer_jax.evaluate --workdir runs/v2 --stage st --split tst-COMMON \
        [--checkpoint average|best|latest] [--average_last 10] [--beam 5] [--lenpen 1.0]

Reads the config saved by run.py in the workdir, averages checkpoints if asked, decodes every
utterance of the split once, and writes `{workdir}/{stage}/eval_{split}/`: hyp.txt and
ref.txt (detokenised, in corpus order) and results.json (score, sacreBLEU signature or WER
normalisation, checkpoint description, decoding settings).
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_jax import checkpoints as ckpt_lib
from multiformer_jax import decode, input_pipeline as ip
from multiformer_jax.metrics import corpus_bleu, corpus_wer
from multiformer_jax.model import S2TModel, init_cache
from multiformer_jax.train import model_config_for, pipeline_config
from multiformer_jax.train_log import setup_logging


def make_translate(model: S2TModel, beam: int, length_penalty: float, max_len_a: float,
                   max_len_b: int):
  """-> jitted fn(params, features, lengths) -> tokens [batch, steps] (pad after the end)."""
  cfg = model.config
  limit = cfg.max_target_positions - 1

  def translate(params, features, lengths):
    variables = {"params": params}
    encoded, mask = model.apply(variables, features, lengths, method=model.encode)
    cross_kv = model.apply(variables, encoded, method=model.cross_kv)
    batch = features.shape[0]
    max_steps = min(int(max_len_a * features.shape[1]) + max_len_b, limit) + 1   # static
    cache = init_cache(cfg, batch * beam, max_steps)

    def step_fn(tokens, index, cache):
      return model.apply(variables, tokens, index, cache, cross_kv, mask,
                         method=model.decode_step)
    max_lengths = decode.max_target_lengths(lengths, max_len_a, max_len_b, limit)
    tokens, _ = decode.beam_search(step_fn, cache, batch, beam, max_steps, max_lengths,
                                   cfg.vocab_size, cfg.eos_id, cfg.pad_id, cfg.bos_id,
                                   length_penalty)
    return tokens
  return jax.jit(translate)


def decode_split(params, batcher: ip.Batcher, translate, progress: bool = True):
  """-> hypotheses (detokenised) in corpus order."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  data = batcher.data
  hypotheses = [None] * len(data)
  batches = tqdm(ip.eval_batches(batcher), total=len(batcher.epoch_plan(0)),
                 desc=f"decoding {data.split}", unit="batch", disable=not progress,
                 file=sys.stderr)
  for batch in batches:
    tokens = np.asarray(translate(params, jnp.asarray(batch["features"]),
                                  jnp.asarray(batch["lengths"])))
    for row, i in enumerate(batch["index"]):
      if i >= 0:
        hypotheses[i] = data.vocab.decode(tokens[row])
  return hypotheses


def evaluate_stage(config, workdir: str, stage: str, split: str, checkpoint: str | None = None,
                   average_last: int | None = None, beam: int | None = None,
                   length_penalty: float | None = None, progress: bool = True) -> dict:
  log = setup_logging()
  e = config.eval
  checkpoint = checkpoint or e.checkpoint
  average_last = average_last or e.average_last
  beam = beam or e.beam
  length_penalty = e.length_penalty if length_penalty is None else length_penalty
  data = ip.SplitData(pipeline_config(config, stage, "test"), split)
  batcher = ip.Batcher(data, False)
  model = S2TModel(model_config_for(config, data.vocab.size))
  stage_ckpts = ckpt_lib.StageCheckpoints(os.path.join(workdir, stage, "checkpoints"))
  params, which = stage_ckpts.select_params(checkpoint, average_last)
  params = jax.tree_util.tree_map(jnp.asarray, params)
  log.info("evaluating %s on %s (%d utterances) with %s, beam %d", stage, split, len(data),
           which, beam)
  translate = make_translate(model, beam, length_penalty, e.max_len_a, e.max_len_b)
  start = time.time()
  hypotheses = decode_split(params, batcher, translate, progress)
  references = data.references
  score = corpus_bleu(hypotheses, references) if stage == "st" else \
      corpus_wer(hypotheses, references)
  out_dir = os.path.join(workdir, stage, f"eval_{split}")
  os.makedirs(out_dir, exist_ok=True)
  for name, lines in (("hyp.txt", hypotheses), ("ref.txt", references)):
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in lines)
  result = {"stage": stage, "split": split, "utterances": len(data), **score,
            "checkpoint": which, "beam": beam, "length_penalty": length_penalty,
            "max_len": f"{e.max_len_a} * frames + {e.max_len_b}",
            "decode_s": round(time.time() - start, 1), "config": config.name}
  with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1, ensure_ascii=False)
  log.info("%s %s: %s", stage, split, f"BLEU {score['bleu']}" if stage == "st" else
           f"WER {score['wer']}")
  return result


def main(argv=None):
  import argparse  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--stage", default="st", choices=ip.TASKS)
  parser.add_argument("--split", default=None, help="default: the config's data.test_split")
  parser.add_argument("--checkpoint", default=None, choices=("latest", "best", "average"))
  parser.add_argument("--average_last", type=int, default=None)
  parser.add_argument("--beam", type=int, default=None)
  parser.add_argument("--lenpen", type=float, default=None)
  args = parser.parse_args(argv)
  config = ckpt_lib.load_config(args.workdir)
  result = evaluate_stage(config, args.workdir, args.stage, args.split or config.data.test_split,
                          args.checkpoint, args.average_last, args.beam, args.lenpen)
  print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
  main()
