"""The text stage: an MT-pretrained decoder (`st.decoder_init="mt"`) and stacked text encoder
(`st.text_encoder="mt"`) for the ST stage.

A text-to-text model (model/text_model.py: the source transcript's ASR pieces through a small
full-attention encoder, then the ST model's decoder) learns the prepared corpus's
(transcript, translation) pairs, which are cheap to train on; the ST stage then starts its
decoder (embeddings, layers, output projection) from the text model's instead of from random
values, as ESPnet-ST and fairseq's speech-to-text recipes do with a pre-trained MT decoder. The
targets are the ST stage's own (its vocabulary, language tag and length cap).

The stage writes {workdir}/mt/: params.msgpack (the parameters with the lowest dev
perplexity), log.jsonl (its evaluations) and DONE.json (its summary, with the dev BLEU of those
parameters: what the pairs teach a decoder of this size). It is short and keeps no
checkpoints: a run stopped during it starts it again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from data_prep.common import atomic
from data_prep.common.token_ids import EOS_ID, PAD_ID
from multiformer_jax import experiment
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation.decode import beam_search
from multiformer_jax.evaluation.metrics import corpus_bleu
from multiformer_jax.model.decoder import init_cache
from multiformer_jax.model.stacked import text_layers_config
from multiformer_jax.model.text_model import TextToText
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.training.loss import label_smoothed_nll
from multiformer_jax.training.optimizer import make_optimizer

STAGE = "mt"
PARAMS = "params.msgpack"
DECODE_ROWS = 100            # sentences per beam-search batch (one compiled shape)
MAX_PAIR_LENGTH = 128        # the widest pair arrays when mt.length is 0 (automatic)


def starts_decoder(config) -> bool:
  """Whether the ST stage starts its decoder from the text stage's."""
  return "st" in config.train.stages and config.st.decoder_init == STAGE


def stacks_encoder(config) -> bool:
  """Whether a trained ST stage stacks the text stage's encoder on its speech encoder."""
  return "st" in config.train.stages and experiment.stacks_text_encoder(config)


def wanted(config) -> bool:
  """Whether the run trains a text stage: its ST stage starts the decoder or a stacked text
  encoder from one."""
  return starts_decoder(config) or stacks_encoder(config)


def check_config(config, prepared: bool = False):
  """Refuses settings the text stage cannot honour, before anything trains (with `prepared`,
  also what the prepared data must have)."""
  init = config.st.decoder_init
  if init not in ("", STAGE):
    raise ValueError(f"st.decoder_init={init!r}; valid: '' (a fresh decoder) or 'mt' (the "
                     f"text stage's)")
  stacked = config.st.text_encoder
  if stacked not in ("", STAGE):
    raise ValueError(f"st.text_encoder={stacked!r}; valid: '' (none) or 'mt' (the text "
                     f"stage's encoder stacked on the speech encoder)")
  if stacked and not config.st.ctc_weight > 0:
    raise ValueError("st.text_encoder='mt' reads the ST stage's CTC head over the source "
                     f"pieces: set st.ctc_weight > 0 (it is {config.st.ctc_weight})")
  if not wanted(config):
    return
  setting = "st.decoder_init='mt'" if starts_decoder(config) else "st.text_encoder='mt'"
  if config.mt.max_updates < 1 or config.mt.batch < 1:
    raise ValueError(f"{setting} trains a text stage: mt.max_updates="
                     f"{config.mt.max_updates} and mt.batch={config.mt.batch} must be >= 1")
  tags = experiment.stack_task_tags(config.model)
  if any(tags.values()):
    raise ValueError(f"{setting} needs a model without task-keyed stacks (model "
                     f"task tags {tags}): the text model has no task ids")
  if prepared and "asr" not in ip.read_summary(config.data.prepared_dir)["vocab"]:
    raise ValueError(f"{setting}: {config.data.prepared_dir} has no ASR vocabulary "
                     f"for the source transcripts the text model reads")


@dataclasses.dataclass
class TextPairs:
  """A split's pairs as fixed-width arrays, PAD-filled: source = ASR pieces + EOS, prev = EOS +
  target tokens, target = target tokens + EOS (the ST batch's convention)."""
  source: np.ndarray          # [n, length] int32
  prev: np.ndarray            # [n, length] int32
  target: np.ndarray          # [n, length] int32
  prefix: np.ndarray | None   # [n] forced first token (a target-language tag) or None
  references: list[str]
  truncated: int              # pairs with a side cut to fit `length`

  def __len__(self):
    return len(self.references)

  @property
  def lengths(self) -> np.ndarray:
    """[n] the columns each pair fills: its longer side's tokens with EOS."""
    return np.maximum((self.source != PAD_ID).sum(1), (self.target != PAD_ID).sum(1))

  def rows(self, index, width: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arrays of rows `index`, cut to their first `width` columns (None: all)."""
    return tuple(a[index, :width] for a in (self.source, self.prev, self.target))


def bucket_edges(lengths: np.ndarray, num_buckets: int, width: int) -> list[int]:
  """Batch widths: the lengths' quantiles at 1/num_buckets, 2/num_buckets, ... rounded up to
  multiples of 8, the last `width` (one compiled update per width)."""
  edges = {min(width, 8 * math.ceil(np.quantile(lengths, q / num_buckets) / 8))
           for q in range(1, num_buckets)}
  return sorted(edges | {width})


def training_batches(lengths: np.ndarray, edges: list[int], batch: int, rng):
  """Endless (rows [batch], width): each pair goes to the narrowest width that holds it; an
  epoch shuffles every bucket, cuts it into batches (the last one filled from the bucket's
  start) and shuffles the batches."""
  bucket_of = np.searchsorted(edges, lengths)
  buckets = [np.flatnonzero(bucket_of == b) for b in range(len(edges))]
  while True:
    plan = []
    for b, members in enumerate(buckets):
      if not len(members):
        continue
      order = rng.permutation(members)
      order = np.resize(order, batch * math.ceil(len(order) / batch))
      plan += [(order[i:i + batch], edges[b]) for i in range(0, len(order), batch)]
    for i in rng.permutation(len(plan)):
      yield plan[i]


def split_data(config, split: str) -> ip.SplitData:
  """The ST view of a prepared split with the source transcripts' ASR pieces."""
  pipeline = dataclasses.replace(experiment.pipeline_config(config, "st"), source_ctc=True)
  return ip.SplitData(pipeline, split)


def pair_length(data: ip.SplitData, cap: int) -> int:
  """Array width for the pairs: the longer side's 99th percentile + EOS, a multiple of 8,
  at most `cap` (longer sides are cut)."""
  longest = np.maximum(data.source_tokens.lengths, data.tokens.lengths) + 1
  return int(min(cap, 8 * math.ceil(np.percentile(longest, 99) / 8)))


def text_pairs(data: ip.SplitData, length: int) -> TextPairs:
  n = len(data)
  source, prev, target = (np.full((n, length), PAD_ID, np.int32) for _ in range(3))
  truncated = 0
  for i in range(n):
    src, tgt = data.source_tokens[i][:length - 1], data.tokens[i][:length - 1]
    truncated += (len(data.source_tokens[i]) > length - 1) or (len(data.tokens[i]) > length - 1)
    source[i, :len(src)], source[i, len(src)] = src, EOS_ID
    prev[i, 0], prev[i, 1:len(tgt) + 1] = EOS_ID, tgt
    target[i, :len(tgt)], target[i, len(tgt)] = tgt, EOS_ID
  return TextPairs(source, prev, target, data.prefix, list(data.references), truncated)


def with_text_only(pairs: TextPairs, data: ip.SplitData, length: int) -> TextPairs:
  """`pairs` and the prepared parallel text without speech of `data`'s pairs (ASR pieces on
  the source side, the ST vocabulary's on the target side), as more rows."""
  if pairs.prefix is not None:
    raise ValueError("mt.text_only: the text without speech has no target-language tags; "
                     "use it with a single-target corpus (data.target_lang_tag=false)")
  used = sorted(set(map(str, data.tag_values["pair"])))
  source_lang, target_lang = used[0].split("-")
  sources = ip.text_only_lines(data.config.prepared_dir, source_lang, used)
  targets = ip.text_only_lines(data.config.prepared_dir, target_lang, used)
  asr_vocab = ip.task_vocabulary(data.config.prepared_dir, "asr")
  extra = [(asr_vocab.encode(s), data.vocab.encode(t)) for s, t in zip(sources, targets)]
  rows = [np.full((len(extra), length), PAD_ID, np.int32) for _ in range(3)]
  truncated = 0
  for i, (src, tgt) in enumerate(extra):
    truncated += len(src) > length - 1 or len(tgt) > length - 1
    src, tgt = src[:length - 1], tgt[:length - 1]
    rows[0][i, :len(src)], rows[0][i, len(src)] = src, EOS_ID
    rows[1][i, 0], rows[1][i, 1:len(tgt) + 1] = EOS_ID, tgt
    rows[2][i, :len(tgt)], rows[2][i, len(tgt)] = tgt, EOS_ID
  source, prev, target = (np.concatenate([a, b]) for a, b in zip(
      (pairs.source, pairs.prev, pairs.target), rows))
  return TextPairs(source, prev, target, None, pairs.references + targets,
                   pairs.truncated + truncated)


def _padded_chunks(n: int, size: int):
  """(row indices [size], how many are real) covering range(n) in chunks of `size`; the last
  chunk repeats row 0 so that every chunk has one shape."""
  for start in range(0, n, size):
    real = min(size, n - start)
    rows = np.concatenate([np.arange(start, start + real), np.zeros(size - real, np.int64)])
    yield rows, real


class TextTrainer:
  """The text model, its jitted update, dev perplexity and beam search."""

  def __init__(self, config, model_cfg, source_vocab: int, vocab, mt_cfg, beam: int):
    self.model = TextToText(model_cfg, source_vocab)
    self.model_cfg, self.vocab, self.beam = model_cfg, vocab, beam
    self.length_penalty = config.eval.length_penalty
    self.smoothing = config.train.label_smoothing
    self.tx, _ = make_optimizer(config.train, mt_cfg)
    model, smoothing, tx = self.model, self.smoothing, self.tx

    def train_step(params, opt_state, source, prev, target, step_key):
      def loss_fn(p):
        logits = model.apply({"params": p}, source, prev, False, rngs={"dropout": step_key})
        loss, nll, tokens = label_smoothed_nll(logits, target, smoothing)
        return loss / tokens, nll / tokens
      (_, nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, nll

    def nll_sum(params, source, prev, target):
      logits = model.apply({"params": params}, source, prev, True)
      _, nll, tokens = label_smoothed_nll(logits, target, smoothing)
      return nll, tokens

    self.train_step = jax.jit(train_step, donate_argnums=(0, 1))
    self.nll_sum = jax.jit(nll_sum)
    self.translate = jax.jit(self._translate)

  def init(self, key, pairs: TextPairs):
    params = jax.jit(self.model.init)(key, pairs.source[:2], pairs.prev[:2])["params"]
    return params, self.tx.init(params)

  def _translate(self, params, source, prefix):
    variables, model = {"params": params}, self.model
    encoded, mask = model.apply(variables, source, method=model.encode)
    cross = model.apply(variables, encoded, method=model.cross_kv)
    batch, steps = source.shape
    cache = init_cache(self.model_cfg, batch * self.beam, steps)

    def step_fn(tokens, index, cache):
      return model.apply(variables, tokens, index, cache, cross, mask, method=model.decode_step)
    return beam_search(step_fn, cache, batch, self.beam, steps, jnp.full((batch,), steps - 1),
                       self.model_cfg.vocab_size, EOS_ID, PAD_ID, 0, self.length_penalty,
                       prefix)[0]

  def perplexity(self, params, pairs: TextPairs, batch: int) -> float:
    nll = tokens = 0.0
    for rows, real in _padded_chunks(len(pairs), batch):
      source, prev, target = pairs.rows(rows)
      target = target.copy()
      target[real:] = PAD_ID                       # the repeated rows add nothing
      n, t = self.nll_sum(params, source, prev, target)
      nll, tokens = nll + float(n), tokens + float(t)
    return math.exp(min(nll / max(tokens, 1.0), 50.0))

  def translations(self, params, pairs: TextPairs) -> list[str]:
    hypotheses = []
    for rows, real in _padded_chunks(len(pairs), DECODE_ROWS):
      prefix = None if pairs.prefix is None else jnp.asarray(pairs.prefix[rows])
      tokens = np.asarray(self.translate(params, pairs.source[rows], prefix))
      hypotheses += [self.vocab.decode([t for t in row if t != PAD_ID]) for row in tokens[:real]]
    return hypotheses


def train_text_model(trainer: TextTrainer, train: TextPairs, dev: TextPairs, mt_cfg, key,
                     seed: int, log: logging.Logger, on_evaluation=None):
  """Trains mt_cfg.max_updates updates of mt_cfg.batch pairs (epochs of shuffled pairs in
  mt_cfg.num_buckets widths), with the dev perplexity every mt_cfg.eval_every updates -> (the
  parameters with the lowest dev perplexity, their update, [evaluations])."""
  init_key, key = jax.random.split(key)
  params, opt_state = trainer.init(init_key, train)
  lengths = train.lengths
  edges = bucket_edges(lengths, mt_cfg.num_buckets, train.source.shape[1])
  batches = training_batches(lengths, edges, mt_cfg.batch, np.random.default_rng(seed))
  log.info("mt: batches of %d pairs, widths %s", mt_cfg.batch, edges)
  best, evaluations, start = (float("inf"), None, 0), [], time.time()
  for update in range(1, mt_cfg.max_updates + 1):
    rows, width = next(batches)
    key, step_key = jax.random.split(key)
    params, opt_state, train_nll = trainer.train_step(params, opt_state,
                                                      *train.rows(rows, width), step_key)
    if update % mt_cfg.eval_every == 0 or update == mt_cfg.max_updates:
      dev_ppl = trainer.perplexity(params, dev, mt_cfg.batch)
      evaluations.append({"update": update, "train_nll": round(float(train_nll), 3),
                          "dev_ppl": round(dev_ppl, 2), "seconds": round(time.time() - start, 1)})
      log.info("mt step %d: train nll %.3f, dev ppl %.2f", update, float(train_nll), dev_ppl)
      if on_evaluation is not None:
        on_evaluation(evaluations[-1])
      if dev_ppl < best[0]:
        best = (dev_ppl, jax.device_get(params), update)
  return best[1], best[2], evaluations


def run_text_stage(config, workdir: str, log: logging.Logger) -> dict:
  """Trains the text stage (or reads its summary when it finished before) -> its summary."""
  stage_dir = os.path.join(workdir, STAGE)
  done_path = os.path.join(stage_dir, DONE)
  if os.path.exists(done_path):
    with open(done_path, encoding="utf-8") as f:
      log.info("stage mt already finished (%s): skipped", done_path)
      return json.load(f)
  os.makedirs(stage_dir, exist_ok=True)
  primary = jax.process_index() == 0
  mt = config.mt
  start = time.time()
  train_data = split_data(config, config.data.train_split)
  dev_data = split_data(config, config.data.dev_split)
  length = mt.length or pair_length(train_data, MAX_PAIR_LENGTH)
  train, dev = text_pairs(train_data, length), text_pairs(dev_data, length)
  if mt.text_only:
    speech_pairs = len(train)
    train = with_text_only(train, train_data, length)
    log.info("stage mt: %d pairs of text without speech join the %d transcript pairs",
             len(train) - speech_pairs, speech_pairs)
  trainer = make_trainer(config, train_data)
  log.info("stage mt: %d train / %d dev pairs of <= %d pieces a side (%d / %d cut), %d "
           "updates of %d pairs, text encoder %s", len(train), len(dev), length,
           train.truncated, dev.truncated, mt.max_updates, mt.batch,
           trainer.model_cfg.encoder_layout)
  log_path = os.path.join(stage_dir, "log.jsonl")
  if primary and os.path.exists(log_path):
    os.remove(log_path)                       # a stage stopped before: it starts again

  def record(evaluation):
    if primary:
      with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(evaluation) + "\n")

  params, best_update, evaluations = train_text_model(
      trainer, train, dev, mt, experiment.stage_key(config, STAGE), config.train.seed, log,
      record)
  dev_bleu = None
  if mt.score_dev:
    decode_start = time.time()
    dev_bleu = corpus_bleu(trainer.translations(params, dev), dev.references)["bleu"]
    log.info("stage mt: dev BLEU %.2f of update %d's parameters (beam %d, %.0f s)", dev_bleu,
             best_update, mt.beam, time.time() - decode_start)
  summary = {"stage": STAGE, "updates": mt.max_updates, "best_step": best_update,
             "best_dev_ppl": min(e["dev_ppl"] for e in evaluations), "dev_bleu": dev_bleu,
             "pairs": {"train": len(train), "dev": len(dev)}, "length": length,
             "truncated": {"train": train.truncated, "dev": dev.truncated},
             "wall_s": round(time.time() - start, 1)}
  if primary:
    _atomic_write(os.path.join(stage_dir, PARAMS), flax.serialization.msgpack_serialize(params))
    _atomic_write(done_path, json.dumps(summary, indent=1).encode())
  log.info("stage mt finished in %.0f s", summary["wall_s"])
  return summary


def make_trainer(config, data: ip.SplitData) -> TextTrainer:
  """The text stage's model (the ST decoder's shapes, config.mt's text encoder and dropout)
  with its update and beam search."""
  st_model_cfg = experiment.model_config_for(config, data.vocab.size, None, "st")
  model_cfg = text_layers_config(st_model_cfg, config.mt.encoder_layers, config.mt.dropout)
  return TextTrainer(config, model_cfg, int(data.summary["vocab"]["asr"]["size"]), data.vocab,
                     config.mt, config.mt.beam)


def read_params(workdir: str):
  """The text stage's kept parameters in `workdir`."""
  path = os.path.join(workdir, STAGE, PARAMS)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: the text stage did not finish (rerun the "
                            f"same command to train it)")
  with open(path, "rb") as f:
    return flax.serialization.msgpack_restore(f.read())


def _atomic_write(path: str, data: bytes):
  with atomic.atomic_open(path, "wb") as f:
    f.write(data)
