"""Evaluation from checkpoints: cached beam search, sacreBLEU (ST) or WER (ASR).

    python -m multiformer_jax.evaluate --workdir runs/v2 --stage st --split tst-COMMON \
        [--checkpoint average|around_best|best|latest] [--average_last 10] [--beam 5]
        [--lenpen 1.0] [--min_len 1] [--ctc_weight 0.2] [--lm_weight 0.2]
        [--rate_norm_target 0.5]

Decodes every utterance of the split once with the run's saved evaluation settings (each flag
overrides its eval.* key) and writes hyp.txt, ref.txt, ids.txt and results.json under
`{workdir}/{stage}/eval_{split}/{selection}_beam{B}_{digest}/`. How:
multiformer_jax/evaluation/scoring.py.
"""

from __future__ import annotations

import argparse
import json

from multiformer_jax import schema
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import scoring
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import compile_clock, process_setup


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--stage", default="st", choices=ip.SPEECH_STAGES)
  parser.add_argument("--split", default=None, help="default: the config's data.test_split")
  parser.add_argument("--checkpoint", default=None, choices=ckpt_lib.SELECTIONS,
                      help="default: the config's eval.checkpoint")
  parser.add_argument("--average_last", type=int, default=None,
                      help="checkpoints averaged: the last N (average) or the N around the "
                           "best (around_best); default: eval.average_last / "
                           "eval.average_around_best")
  parser.add_argument("--beam", type=int, default=None)
  parser.add_argument("--lenpen", type=float, default=None)
  parser.add_argument("--min_len", type=int, default=None,
                      help="fairseq --min-len: no EOS before this many tokens (default 1)")
  parser.add_argument("--ctc_weight", type=float, default=None,
                      help="joint CTC/attention decoding weight for a model with a CTC head "
                           "(default: eval.ctc_weight)")
  parser.add_argument("--lm_weight", type=float, default=None,
                      help="weight of the word n-gram LM that rescores the n-best of the stages "
                           "in eval.lm_stages; 0 = none (default: eval.lm_weight)")
  parser.add_argument("--no_repeat_ngram_size", type=int, default=None,
                      help="fairseq --no-repeat-ngram-size: no n-gram twice in a hypothesis; "
                           "0 = off (default: eval.no_repeat_ngram_size)")
  parser.add_argument("--rate_norm_target", type=float, default=None,
                      help="speaking-rate normalisation: CTC greedy pieces per encoder position "
                           "above which an utterance is stretched in time; 0 = off (default: "
                           "eval.rate_norm_target)")
  args = parser.parse_args(argv)
  config = schema.load_config(args.workdir)
  compile_clock.use_compilation_cache(config)       # before compiling, as run.py and translate
  with config.unlocked():
    if args.no_repeat_ngram_size is not None:
      config.eval.no_repeat_ngram_size = args.no_repeat_ngram_size
    if args.rate_norm_target is not None:
      config.eval.rate_norm_target = args.rate_norm_target
  result = scoring.evaluate_stage(config, args.workdir, args.stage,
                                  args.split or config.data.test_split, args.checkpoint,
                                  args.average_last, args.beam, args.lenpen,
                                  min_len=args.min_len, ctc_weight=args.ctc_weight,
                                  lm_weight=args.lm_weight)
  print(json.dumps(result, indent=1, ensure_ascii=False))


cli = process_setup.command(main)


if __name__ == "__main__":
  cli()
