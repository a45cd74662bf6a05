"""The word n-gram LM of evaluation's n-best rescoring at a real corpus's size:

    python -m benchmarks.word_lm [--sentences 250000] [--mean_words 20] [--types 100000]
        [--order 3] [--out docs/benchmarks/word_lm.jsonl]

MuST-C en-de's training split has about 229k segments and 4.6M English words. The benchmark
builds `word_lm.WordLM` from synthetic sentences of that size, drawn lazily (never held in
memory): Poisson(mean_words) words each, from a Zipf(1.1) distribution over `types` word
types. It reports the build time, the process's peak resident memory above what it held before
the build, the number of n-grams kept, and how fast sentences are scored (the rescoring cost
per hypothesis). One JSON line, appended to --out with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
from multiformer_jax.evaluation import word_lm


def rss_mib() -> float:
  with open("/proc/self/status", encoding="utf-8") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return 0.0


def synthetic_sentences(count: int, mean_words: float, types: int, seed: int):
  """Sentences of word ids as strings, Zipf-distributed, one batch of draws at a time."""
  rng = np.random.default_rng(seed)
  ranks = np.arange(1, types + 1)
  probs = ranks ** -1.1
  probs /= probs.sum()
  for start in range(0, count, 10000):
    n = min(10000, count - start)
    lengths = np.maximum(rng.poisson(mean_words, n), 1)
    words = rng.choice(types, size=int(lengths.sum()), p=probs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i in range(n):
      yield [f"w{w}" for w in words[offsets[i]:offsets[i + 1]]]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sentences", type=int, default=250000)
  parser.add_argument("--mean_words", type=float, default=20.0)
  parser.add_argument("--types", type=int, default=100000)
  parser.add_argument("--order", type=int, default=3)
  parser.add_argument("--score_sentences", type=int, default=20000)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  before = rss_mib()
  start = time.perf_counter()
  lm = word_lm.WordLM(synthetic_sentences(args.sentences, args.mean_words, args.types, 0),
                      args.order)
  build_s = time.perf_counter() - start
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  held = rss_mib()
  probe = list(synthetic_sentences(args.score_sentences, args.mean_words, args.types, 1))
  start = time.perf_counter()
  total = sum(lm.log_prob(s) for s in probe)
  score_s = time.perf_counter() - start
  row = {"sentences": args.sentences, "mean_words": args.mean_words, "types": args.types,
         "order": args.order, "ngrams": len(lm.counts),
         "ngrams_by_order": [sum(len(g) == k for g in lm.counts)
                             for k in range(1, args.order + 1)],
         "discounts": [round(d, 3) for d in lm.discounts],
         "build_s": round(build_s, 1), "peak_rss_above_start_mib": round(peak - before),
         "rss_held_after_build_mib": round(held - before),
         "scored_sentences_per_s": round(len(probe) / score_s),
         "mean_log_prob_per_word": round(total / sum(len(s) + 1 for s in probe), 3)}
  print(json.dumps(row))
  if args.out:
    from benchmarks.common import machine  # pylint: disable=import-outside-toplevel
    with open(args.out, "a", encoding="utf-8") as f:
      f.write(json.dumps({**row, "machine": machine()}) + "\n")


if __name__ == "__main__":
  main()
