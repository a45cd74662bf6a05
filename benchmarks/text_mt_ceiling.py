"""What a config's ST decoder reaches when it reads the source text instead of speech.

    python benchmarks/text_mt_ceiling.py --config configs/quickstart.py \
        --out docs/quickstart/text_mt_ceiling.json [--updates 3000 --dropout 0.3]

Trains the text stage's model (multiformer_jax/training/text_stage.py: the source's ASR
SentencePiece pieces through `--encoder_layers` Transformer layers of full attention, then the
config's decoder with its ST vocabulary) on the prepared corpus's (transcript, translation)
pairs, with the ST stage's label smoothing and learning-rate schedule decaying over
`--updates`. Every `--eval_every` updates it reports the dev perplexity, then the dev and
tst-COMMON BLEU of the parameters with the lowest dev perplexity, with the evaluation's beam
search (the config's eval.beam, or `--beam`, and length penalty).
The speech model's ST stage cannot translate better than this text model does: the figure
tells whether a BLEU target is within what the corpus's pairs teach a decoder of this size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import flax
import jax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks.common import machine  # noqa: E402
from data_prep.common.cli_errors import load_config_file  # noqa: E402
from multiformer_jax.evaluation.metrics import corpus_bleu  # noqa: E402
from multiformer_jax.training import text_stage  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--out", default="docs/quickstart/text_mt_ceiling.json")
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
  parser.add_argument("--save_params", default=None,
                      help="write the parameters with the lowest dev perplexity here (msgpack)")
  args = parser.parse_args(argv)

  logging.basicConfig(level=logging.INFO, format="%(message)s")
  log = logging.getLogger("text_mt_ceiling")
  config = load_config_file(args.config)
  if args.prepared_dir:
    config.data.prepared_dir = args.prepared_dir
  test_split = args.test_split or config.data.test_split
  config.data.target_lang_tag = False
  mt, st = config.mt, config.st
  mt.lr, mt.lr_scheduler = st.lr, st.lr_scheduler
  mt.warmup_updates = min(st.warmup_updates, args.updates // 2)
  mt.max_updates, mt.eval_every, mt.batch = args.updates, args.eval_every, args.batch
  mt.encoder_layers, mt.dropout = args.encoder_layers, args.dropout
  beam = mt.beam = args.beam or config.eval.beam
  data = {name: text_stage.split_data(config, name)
          for name in ("train", config.data.dev_split, test_split)}
  train, dev, test = (text_stage.text_pairs(data[name], args.length)
                      for name in ("train", config.data.dev_split, test_split))
  vocab = data["train"].vocab
  trainer = text_stage.make_trainer(config, data["train"])     # the text stage's model
  model_cfg, source_vocab = trainer.model_cfg, trainer.model.source_vocab
  params, best_update, evaluations = text_stage.train_text_model(
      trainer, train, dev, mt, jax.random.PRNGKey(args.seed), args.seed, log,
      lambda evaluation: print(json.dumps(evaluation), flush=True))
  dev_bleu = corpus_bleu(trainer.translations(params, dev), dev.references)["bleu"]
  hypotheses = trainer.translations(params, test)
  result = {
      "config": args.config, "machine": machine(), "command": " ".join(sys.argv),
      "pairs": {"train": len(train), "dev": len(dev), "test": len(test)},
      "truncated_pairs": {"train": train.truncated, "dev": dev.truncated,
                          "test": test.truncated},
      "model": {"encoder": model_cfg.encoder_layout, "d_model": model_cfg.d_model,
                "decoder_layers": model_cfg.decoder_layers, "dropout": args.dropout,
                "target_vocab": vocab.size, "source_vocab": source_vocab},
      "updates": args.updates, "batch": args.batch, "beam": beam,
      "evaluations": evaluations, "best_update": best_update, "dev_bleu": dev_bleu,
      "test": {"split": test_split, "ppl": round(trainer.perplexity(params, test, args.batch), 2),
               "bleu": corpus_bleu(hypotheses, test.references)["bleu"]},
      "examples": [{"reference": r, "hypothesis": h}
                   for r, h in list(zip(test.references, hypotheses))[:5]],
  }
  print(json.dumps(result["test"]))
  if args.save_params:
    with open(args.save_params, "wb") as f:
      f.write(flax.serialization.msgpack_serialize(params))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1, ensure_ascii=False)
  return result


if __name__ == "__main__":
  main()
