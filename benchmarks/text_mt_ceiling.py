"""What a config's ST decoder reaches when it reads the source text instead of speech.

    python benchmarks/text_mt_ceiling.py --config configs/quickstart.py \
        --out docs/quickstart/text_mt_ceiling.json [--updates 3000 --dropout 0.3]

Trains a text-to-text model on the prepared corpus's (transcript, translation) pairs: the
source's ASR SentencePiece pieces embedded and run through `--encoder_layers` Transformer
layers of full attention, then the config's decoder (its width, depth, heads and ST
vocabulary), with the ST stage's label smoothing and optimizer (`train.make_optimizer`: its
learning rate, schedule and warmup, decaying over `--updates`). Every `--eval_every` updates
it reports the dev perplexity and BLEU with the evaluation's beam search
(`decode.beam_search`, the config's beam, or `--beam`, and length penalty), and at the end tst-COMMON BLEU
of the parameters with the lowest dev perplexity.
The speech model's ST stage cannot translate better than this text model does: the figure
tells whether a BLEU target is within what the corpus's pairs teach a decoder of this size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks.common import machine  # noqa: E402
from data_prep import index_io  # noqa: E402
from data_prep.cli_errors import load_config_file  # noqa: E402
from data_prep.vocab import EOS_ID as EOS, PAD_ID as PAD, Vocabulary  # noqa: E402
from multiformer_jax.evaluation.decode import beam_search  # noqa: E402
from multiformer_jax.evaluation.metrics import corpus_bleu, label_smoothed_nll  # noqa: E402
from multiformer_jax.model.decoder import Decoder, init_cache  # noqa: E402
from multiformer_jax.model.encoder import EncoderLayer  # noqa: E402
from multiformer_jax.model.feedforward import layer_norm  # noqa: E402
from multiformer_jax.model.model_config import ModelConfig  # noqa: E402
from multiformer_jax.model.positions import padded_positions  # noqa: E402
from multiformer_jax.training.train import make_optimizer  # noqa: E402



class TextToText(nn.Module):
  """Source pieces [batch, S] -> the config's decoder over a full-attention text encoder."""
  config: ModelConfig
  source_vocab: int

  def setup(self):
    self.embed_source = nn.Embed(self.source_vocab, self.config.d_model)
    self.layers = [EncoderLayer(self.config, layer, i, name=f"layers_{i}")
                   for i, layer in enumerate(self.config.layout)]
    self.layer_norm = layer_norm("layer_norm")
    self.decoder = Decoder(self.config, name="decoder")

  def encode(self, source, deterministic: bool = True):
    mask = source != PAD
    x = math.sqrt(self.config.d_model) * self.embed_source(source)
    x = x + padded_positions(mask, self.config.d_model)
    for layer in self.layers:
      x = layer(x, mask, deterministic)
    return self.layer_norm(x), mask

  def __call__(self, source, prev_tokens, deterministic: bool = True):
    encoded, mask = self.encode(source, deterministic)
    return self.decoder(prev_tokens, encoded, mask, deterministic)

  def cross_kv(self, encoded):
    return self.decoder.cross_kv(encoded)

  def decode_step(self, tokens, index, cache, cross_kv, mask):
    return self.decoder.decode_step(tokens, index, cache, cross_kv, mask)


def load_split(prepared_dir, split, source_vocab, target_vocab, length):
  """-> (source [n, length], decoder input [n, length], target [n, length], references,
  truncated count); source ends with EOS, target = tokens + EOS, both padded."""
  index = index_io.load(os.path.join(prepared_dir, "index", f"{split}.npz"))
  references = [str(t) for t in index["target_text"]]
  n = len(references)
  source, prev, target = (np.full((n, length), PAD, np.int32) for _ in range(3))
  truncated = 0
  for i, (src, tgt) in enumerate(zip(index["source_text"], references)):
    s = source_vocab.encode(str(src))[:length - 1] + [EOS]
    t = target_vocab.encode(tgt)
    truncated += len(t) > length - 1
    t = t[:length - 1]
    source[i, :len(s)] = s
    prev[i, 0], prev[i, 1:len(t) + 1] = EOS, t
    target[i, :len(t)], target[i, len(t)] = t, EOS
  return source, prev, target, references, truncated


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

  config = load_config_file(args.config)
  prepared = args.prepared_dir or config.data.prepared_dir
  test_split = args.test_split or config.data.test_split
  with open(os.path.join(prepared, "prepared.json"), encoding="utf-8") as f:
    vocabs = json.load(f)["vocab"]
  source_vocab = Vocabulary(os.path.join(prepared, vocabs["asr"]["model"]))
  target_vocab = Vocabulary(os.path.join(prepared, vocabs["st"]["model"]))
  splits = {name: load_split(prepared, name, source_vocab, target_vocab, args.length)
            for name in ("train", config.data.dev_split, test_split)}
  train, dev, test = (splits[name] for name in ("train", config.data.dev_split, test_split))
  m = config.model
  model_cfg = ModelConfig(
      vocab_size=target_vocab.size, d_model=m.d_model, ffn_dim=m.ffn_dim,
      encoder_layers=args.encoder_layers, encoder_heads=m.encoder_heads,
      encoder_layout=f"{args.encoder_layers}x({m.encoder_heads}*full)",
      decoder_layers=m.decoder_layers, decoder_heads=m.decoder_heads, qkv_bias=m.qkv_bias,
      dropout=args.dropout, attention_dropout=args.dropout, activation_dropout=args.dropout)
  model = TextToText(model_cfg, source_vocab.size)
  st, e = config.st, config.eval
  if args.beam:
    e.beam = args.beam
  st.max_updates = args.updates
  st.warmup_updates = min(st.warmup_updates, args.updates // 2)
  key = jax.random.PRNGKey(args.seed)
  params = jax.jit(model.init)(key, train[0][:2], train[1][:2])["params"]
  tx, _ = make_optimizer(config.train, st)
  opt_state = tx.init(params)
  smoothing = config.train.label_smoothing

  @jax.jit
  def train_step(params, opt_state, source, prev, target, step_key):
    def loss_fn(p):
      logits = model.apply({"params": p}, source, prev, False, rngs={"dropout": step_key})
      loss, nll, tokens = label_smoothed_nll(logits, target, smoothing)
      return loss / tokens, nll / tokens
    (_, nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, nll

  @jax.jit
  def nll_sum(params, source, prev, target):
    logits = model.apply({"params": params}, source, prev, True)
    _, nll, tokens = label_smoothed_nll(logits, target, smoothing)
    return nll, tokens

  @jax.jit
  def translate(params, source):
    variables = {"params": params}
    encoded, mask = model.apply(variables, source, method=model.encode)
    cross = model.apply(variables, encoded, method=model.cross_kv)
    batch, steps = source.shape[0], args.length
    cache = init_cache(model_cfg, batch * e.beam, steps)

    def step_fn(tokens, index, cache):
      return model.apply(variables, tokens, index, cache, cross, mask, method=model.decode_step)
    return beam_search(step_fn, cache, batch, e.beam, steps, jnp.full((batch,), steps - 1),
                       model_cfg.vocab_size, EOS, PAD, 0, e.length_penalty)[0]

  def evaluate(params, data):
    nll, tokens = nll_sum(params, *data[:3])
    hypotheses = []
    for start in range(0, len(data[0]), 100):
      for row in np.asarray(translate(params, data[0][start:start + 100])):
        hypotheses.append(target_vocab.decode([int(t) for t in row if t != PAD]))
    return math.exp(float(nll) / float(tokens)), corpus_bleu(hypotheses, data[3])["bleu"], \
        hypotheses

  rng = np.random.default_rng(args.seed)
  evaluations, best = [], (float("inf"), None, 0)
  start = time.time()
  for update in range(1, args.updates + 1):
    rows = rng.integers(0, len(train[0]), args.batch)
    key, step_key = jax.random.split(key)
    params, opt_state, train_nll = train_step(params, opt_state, train[0][rows], train[1][rows],
                                              train[2][rows], step_key)
    if update % args.eval_every == 0 or update == args.updates:
      dev_ppl, dev_bleu, _ = evaluate(params, dev)
      evaluations.append({"update": update, "train_nll": round(float(train_nll), 3),
                          "dev_ppl": round(dev_ppl, 2), "dev_bleu": dev_bleu,
                          "seconds": round(time.time() - start, 1)})
      print(json.dumps(evaluations[-1]), flush=True)
      if dev_ppl < best[0]:
        best = (dev_ppl, params, update)
  test_ppl, test_bleu, hypotheses = evaluate(best[1], test)
  result = {
      "config": args.config, "machine": machine(), "command": " ".join(sys.argv),
      "pairs": {"train": len(train[0]), "dev": len(dev[0]), "test": len(test[0])},
      "truncated_targets": {"train": train[4], "dev": dev[4], "test": test[4]},
      "model": {"encoder": model_cfg.encoder_layout, "d_model": model_cfg.d_model,
                "decoder_layers": model_cfg.decoder_layers, "dropout": args.dropout,
                "target_vocab": target_vocab.size, "source_vocab": source_vocab.size},
      "updates": args.updates, "batch": args.batch, "beam": e.beam,
      "evaluations": evaluations, "best_update": best[2],
      "test": {"split": test_split, "ppl": round(test_ppl, 2), "bleu": test_bleu},
      "examples": [{"reference": r, "hypothesis": h}
                   for r, h in list(zip(test[3], hypotheses))[:5]],
  }
  print(json.dumps(result["test"]))
  if args.save_params:
    with open(args.save_params, "wb") as f:
      f.write(flax.serialization.msgpack_serialize(jax.device_get(best[1])))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1, ensure_ascii=False)
  return result


if __name__ == "__main__":
  main()
