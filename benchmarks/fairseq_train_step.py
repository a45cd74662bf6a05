"""fairseq's s2t_transformer_s training step on the same batch shape as benchmarks/train_step.py
(the side-by-side reference). Run in an environment with torch and fairseq 0.12.2 (see
tests/fixtures/make_fairseq_fixture.py for the Python 3.11 patch fairseq needs):

    /tmp/fsenv/bin/python -m benchmarks.fairseq_train_step --out docs/benchmarks/fairseq_train_step.jsonl

One update = forward (dropout on), fairseq's label-smoothed NLL (eps 0.1), backward, clip-norm
10, torch.optim.Adam (fairseq's own Adam adds eps before the bias correction instead of after:
the same cost).
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.data import Dictionary
from fairseq.models.speech_to_text import s2t_transformer


class Task:
  def __init__(self, dictionary):
    self.target_dictionary = dictionary


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--out", default="docs/benchmarks/fairseq_train_step.jsonl")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--frames", type=int, default=1000)
  parser.add_argument("--tokens", type=int, default=50)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--matmul_peak", type=float, default=None,
                      help="matmul_peak_flops of the train_step.jsonl run beside this one "
                           "(the report then counts the two as side by side)")
  args = parser.parse_args()
  torch.manual_seed(0)
  model_args = argparse.Namespace(input_feat_per_channel=80, input_channels=1,
                                  max_source_positions=6000, max_target_positions=1024)
  s2t_transformer.s2t_transformer_s(model_args)
  dictionary = Dictionary()
  for i in range(8000 - 4):
    dictionary.add_symbol(f"piece{i}")
  model = s2t_transformer.S2TTransformerModel.build_model(model_args, Task(dictionary)).train()
  optimizer = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.9, 0.98), eps=1e-8)
  rng = np.random.default_rng(0)
  features = torch.from_numpy(rng.normal(size=(args.batch, args.frames, 80)).astype(np.float32))
  lengths = torch.full((args.batch,), args.frames, dtype=torch.long)
  prev = torch.from_numpy(rng.integers(4, 8000, size=(args.batch, args.tokens)))
  target = torch.from_numpy(rng.integers(4, 8000, size=(args.batch, args.tokens)))

  def step():
    optimizer.zero_grad()
    logits, _ = model(features, lengths, prev)
    lprobs = torch.log_softmax(logits.float(), dim=-1).view(-1, logits.size(-1))
    loss, _ = label_smoothed_nll_loss(lprobs, target.view(-1), 0.1, ignore_index=1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    optimizer.step()
    return float(loss)

  for _ in range(2):
    step()
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
  seconds = statistics.median(times)
  row = {"config": "fairseq s2t_transformer_s", "seconds": round(seconds, 4),
         "frames_per_s": round(args.batch * args.frames / seconds, 1),
         "torch": torch.__version__, "threads": torch.get_num_threads(),
         "parameters": sum(p.numel() for p in model.parameters()),
         "date": time.strftime("%Y-%m-%d"), "peak": args.matmul_peak,
         "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
         "command": " ".join(sys.argv)}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(json.dumps(row) + "\n")
  print(json.dumps(row))


if __name__ == "__main__":
  main()
