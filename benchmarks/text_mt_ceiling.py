"""What a config's ST decoder reaches when it reads the source text instead of speech.

    python -m benchmarks.text_mt_ceiling --config configs/quickstart.py \
        --out docs/quickstart/text_mt_ceiling.json [--updates 3000 --dropout 0.3]

Trains the MT stage (multiformer_jax/training/mt_stage.py, through the stage loop: the source's
ASR SentencePiece pieces through `--encoder_layers` Transformer layers of full attention, then
the config's decoder with its ST vocabulary) on the prepared corpus's (transcript, translation)
pairs, with the ST stage's label smoothing and learning-rate schedule decaying over
`--updates`. Every `--eval_every` updates it reports the dev loss, perplexity and BLEU, then the
dev and tst-COMMON BLEU of the checkpoint with the lowest dev loss, with the evaluation's beam
search (the config's eval.beam, or `--beam`, and length penalty).
The speech model's ST stage cannot translate better than this MT model does: the figure
tells whether a BLEU target is within what the corpus's pairs teach a decoder of this size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.common import machine
from multiformer_common.cli_errors import load_config_file
from multiformer_jax.evaluation.metrics import corpus_bleu
from multiformer_jax.data import text_pairs as tp
from multiformer_jax.training import mt_stage, train, transfer
from multiformer_jax.training.parallel import DataParallel


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--out", default="docs/quickstart/text_mt_ceiling.json")
  parser.add_argument("--workdir", default=None,
                      help="where the MT stage trains (its checkpoints); default: a temporary "
                           "directory")
  parser.add_argument("--prepared_dir", default=None, help="default: the config's")
  parser.add_argument("--test_split", default=None, help="default: the config's")
  parser.add_argument("--updates", type=int, default=3000)
  parser.add_argument("--eval_every", type=int, default=1000)
  parser.add_argument("--batch", type=int, default=128, help="sentence pairs per update")
  parser.add_argument("--dropout", type=float, default=0.3)
  parser.add_argument("--encoder_layers", type=int, default=3)
  parser.add_argument("--length", type=int, default=48, help="pieces per side (truncated)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--beam", type=int, default=None, help="default: the config's eval.beam")
  args = parser.parse_args(argv)

  logging.basicConfig(level=logging.INFO, format="%(message)s")
  log = logging.getLogger("text_mt_ceiling")
  config = load_config_file(args.config)
  if args.prepared_dir:
    config.data.prepared_dir = args.prepared_dir
  test_split = args.test_split or config.data.test_split
  config.data.target_lang_tag = False
  config.train.seed = args.seed
  mt, st = config.mt, config.st
  mt.lr, mt.lr_scheduler = st.lr, st.lr_scheduler
  mt.warmup_updates = min(st.warmup_updates, args.updates // 2)
  mt.max_updates, mt.eval_every, mt.batch = args.updates, args.eval_every, args.batch
  mt.encoder_layers, mt.dropout, mt.length, mt.text_only = (args.encoder_layers, args.dropout,
                                                            args.length, False)
  beam = mt.beam = args.beam or config.eval.beam
  with tempfile.TemporaryDirectory() as scratch:
    workdir = args.workdir or scratch
    summary = train.run_stage(config, mt_stage.STAGE, workdir, DataParallel("pmap"))
    params, which = transfer.read_mt_params(workdir)
    with open(os.path.join(workdir, mt_stage.STAGE, "log.jsonl"), encoding="utf-8") as f:
      evaluations = [{k: r[k] for k in ("step", "dev_loss", "dev_ppl", "dev_bleu") if k in r}
                     for r in map(json.loads, f) if "dev_loss" in r]
  train_pairs, dev, train_data = mt_stage.stage_pairs(config, log)
  test = tp.text_pairs(mt_stage.split_data(config, test_split), args.length)
  model = mt_stage.mt_model(config, train_data)
  translate = mt_stage.MTTranslator(model, train_data.vocab, beam, config.eval.length_penalty)
  hypotheses = translate(params, test)
  result = {
      "config": args.config, "machine": machine(), "command": " ".join(sys.argv),
      "pairs": {"train": len(train_pairs), "dev": len(dev), "test": len(test)},
      "truncated_pairs": {"train": train_pairs.truncated, "dev": dev.truncated,
                          "test": test.truncated},
      "model": {"encoder": model.config.encoder_layout, "d_model": model.config.d_model,
                "decoder_layers": model.config.decoder_layers, "dropout": args.dropout,
                "target_vocab": train_data.vocab.size, "source_vocab": model.source_vocab},
      "updates": args.updates, "batch": args.batch, "beam": beam,
      "evaluations": evaluations, "best_update": summary["best_step"], "kept": which,
      "dev_bleu": corpus_bleu(translate(params, dev), dev.references)["bleu"],
      "test": {"split": test_split, "bleu": corpus_bleu(hypotheses, test.references)["bleu"]},
      "examples": [{"reference": r, "hypothesis": h}
                   for r, h in list(zip(test.references, hypotheses))[:5]],
  }
  print(json.dumps(result["test"]))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1, ensure_ascii=False)
  return result


if __name__ == "__main__":
  main()
