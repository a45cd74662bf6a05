"""The MT stage (`mt`): an MT-pretrained decoder (`st.decoder_init="mt"`) and stacked text
encoder (`st.text_encoder="mt"`) for the ST stage.

An MT model (model/mt_model.py: the source transcript's ASR pieces through a small
full-attention encoder, then the ST model's decoder) learns the prepared corpus's
(transcript, translation) pairs, which are cheap to train on; the ST stage then starts its
decoder (embeddings, layers, output projection) from the MT model's instead of from random
values, as ESPnet-ST and fairseq's speech-to-text recipes do with a pre-trained MT decoder. The
targets are the ST stage's own (its vocabulary, language tag and length cap).

It is a stage like ASR and ST, run before ST where ST reads it (experiment.stages_run): the
same loop (training/train.py), steps, checkpoints in {workdir}/mt/checkpoints, log.jsonl and
DONE.json, resumed where it stopped; what differs is built here: its data (pairs of token
arrays in mt.num_buckets widths, data/text_pairs.py), model, loss and dev BLEU (mt.score_dev,
beam mt.beam, at every evaluation). The ST stage reads its best checkpoint by dev loss.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common.token_ids import EOS_ID, PAD_ID
from multiformer_jax import experiment
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.data import text_pairs as tp
from multiformer_jax.evaluation.decode import beam_search
from multiformer_jax.evaluation.metrics import corpus_bleu
from multiformer_jax.model.decoder import init_cache
from multiformer_jax.model.mt_model import MTModel
from multiformer_jax.model.s2t import jitted_init
from multiformer_jax.model.stacked import text_layers_config
from multiformer_jax.runtime.train_log import StageLogger
from multiformer_jax.training.loss import make_mt_loss_sums
from multiformer_jax.training.optimizer import freezes, make_optimizer, trained_predicate
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.training.stage import StageRun, stage_checkpoints, starting_state
from multiformer_jax.training.steps import TrainState, create_state, make_steps

STAGE = experiment.MT_STAGE
DECODE_ROWS = 100            # sentences per beam-search batch (one compiled shape)


def check_prepared(config):
  """What the MT stage needs of the prepared data, where it runs (the config itself is
  checked by multiformer_jax.schema when it is loaded)."""
  if STAGE not in experiment.stages_run(config):
    return
  if "asr" not in ip.read_summary(config.data.prepared_dir)["vocab"]:
    setting = ("st.decoder_init='mt'" if experiment.st_decoder_from_mt(config)
               else "st.text_encoder='mt'")
    raise InvalidValue(f"{setting}: {config.data.prepared_dir} has no ASR vocabulary "
                     f"for the source transcripts the MT model reads")


def split_data(config, split: str) -> ip.SplitData:
  """The ST view of a prepared split with the source transcripts' ASR pieces."""
  pipeline = dataclasses.replace(experiment.pipeline_config(config, "st"), source_ctc=True)
  return ip.SplitData(pipeline, split)


def mt_model(config, data: ip.SplitData) -> MTModel:
  """The MT model: the ST decoder's shapes, config.mt's text encoder and dropout."""
  st_model_cfg = experiment.model_config_for(config, data.vocab.size, None, "st")
  model_cfg = text_layers_config(st_model_cfg, config.mt.encoder_layers, config.mt.dropout)
  return MTModel(model_cfg, int(data.summary["vocab"]["asr"]["size"]))


def init_mt_params(model: MTModel, key):
  """Initial parameters (their shapes do not depend on the dummy batch's, a host array as in
  init_params)."""
  dummy = np.full((1, 8), EOS_ID, np.int32)
  return jitted_init(model)({"params": key}, dummy, dummy)["params"]


def _padded_chunks(n: int, size: int):
  """(row indices [size], how many are real) covering range(n) in chunks of `size`; the last
  chunk repeats row 0 so that every chunk has one shape."""
  for start in range(0, n, size):
    real = min(size, n - start)
    rows = np.concatenate([np.arange(start, start + real), np.zeros(size - real, np.int64)])
    yield rows, real


class MTTranslator:
  """The MT model's beam search (the evaluation's: evaluation/decode.py) over text pairs:
  up to the pairs' width - 1 target tokens, DECODE_ROWS sentences a compiled batch."""

  def __init__(self, model: MTModel, vocab, beam: int, length_penalty: float):
    self.model, self.vocab, self.beam = model, vocab, beam
    self.length_penalty = length_penalty
    self._translate = jax.jit(self.translate_tokens)

  def translate_tokens(self, params, source, prefix):
    """source [batch, S] -> the best hypotheses' tokens [batch, S]."""
    variables, model, cfg = {"params": params}, self.model, self.model.config
    encoded, mask = model.apply(variables, source, method=model.encode)
    cross = model.apply(variables, encoded, method=model.cross_kv)
    batch, steps = source.shape
    cache = init_cache(cfg, batch * self.beam, steps)

    def step_fn(tokens, index, cache):
      return model.apply(variables, tokens, index, cache, cross, mask, method=model.decode_step)
    return beam_search(step_fn, cache, batch, self.beam, steps, jnp.full((batch,), steps - 1),
                       cfg.vocab_size, EOS_ID, PAD_ID, 0, self.length_penalty, prefix)[0]

  def __call__(self, params, pairs: tp.TextPairs, cancelled=None) -> list[str] | None:
    """-> the pairs' translations; None if `cancelled()` (asked before each chunk) is true."""
    hypotheses = []
    for rows, real in _padded_chunks(len(pairs), DECODE_ROWS):
      if cancelled is not None and cancelled():
        return None
      prefix = None if pairs.prefix is None else jnp.asarray(pairs.prefix[rows])
      tokens = np.asarray(self._translate(params, pairs.source[rows], prefix))
      hypotheses += [self.vocab.decode([t for t in row if t != PAD_ID]) for row in tokens[:real]]
    return hypotheses


class MTDevScorer:
  """The dev split's BLEU of the current parameters (mt.score_dev, beam mt.beam), at every
  evaluation: the stage loop's dev scorer (stage.DevScorer's interface)."""
  metric = "bleu"

  def __init__(self, translate: MTTranslator, dev: tp.TextPairs):
    self.translate, self.dev, self.beam = translate, dev, translate.beam

  def __call__(self, params, cancelled=None) -> dict | None:
    """-> {'dev_bleu', 'dev_decode_s'}; None if `cancelled()` turned true while decoding."""
    start = time.perf_counter()
    hypotheses = self.translate(params, self.dev, cancelled)
    if hypotheses is None:
      return None
    bleu = corpus_bleu(hypotheses, self.dev.references)["bleu"]
    return {"dev_bleu": bleu, "dev_decode_s": round(time.perf_counter() - start, 1)}


def stage_pairs(config, log: logging.Logger) -> tuple[tp.TextPairs, tp.TextPairs, ip.SplitData]:
  """-> (training pairs, dev pairs, the training split's ST view)."""
  mt = config.mt
  train_data = split_data(config, config.data.train_split)
  dev_data = split_data(config, config.data.dev_split)
  length = mt.length or tp.pair_length(train_data)
  train, dev = tp.text_pairs(train_data, length), tp.text_pairs(dev_data, length)
  if mt.text_only:
    speech_pairs = len(train)
    train = tp.with_text_only(train, train_data)
    log.info("stage mt: %d pairs of text without speech join the %d transcript pairs",
             len(train) - speech_pairs, speech_pairs)
  log.info("stage mt: %d train / %d dev pairs of <= %d pieces a side (%d / %d cut)",
           len(train), len(dev), length, train.truncated, dev.truncated)
  return train, dev, train_data


def prepare(config, stage: str, workdir: str, dp: DataParallel, logger: StageLogger
            ) -> tuple[StageRun, TrainState]:
  """stage.prepare_stage for the MT stage (`stage` is "mt"): its pairs, model, loss,
  optimizer, steps, checkpoints and dev BLEU, and the state it starts from (resumed, or
  mt.init_from's)."""
  assert stage == STAGE, stage
  log, mt = logger.log, config.mt
  train, dev, train_data = stage_pairs(config, log)
  batchers = [tp.TextPairBatcher(pairs, training, mt.batch, mt.num_buckets, config.data.seed,
                                 dp.global_batch_multiple, jax.process_index(),
                                 jax.process_count()) for pairs, training in ((train, True),
                                                                              (dev, False))]
  model = mt_model(config, train_data)
  plan = experiment.UpdatePlan(0, mt.update_freq, jax.device_count())
  log.info("stage mt: batches (pairs, width) %s, dev %s; an update is %d batch(es); text "
           "encoder %s", batchers[0].shapes, batchers[1].shapes, plan.update_freq,
           model.config.encoder_layout)
  trained = trained_predicate(mt) if freezes(mt) else None
  tx, schedule = make_optimizer(config.train, mt)
  checkpoints = stage_checkpoints(config, STAGE, workdir)
  state = create_state(model, tx, experiment.stage_key(config, STAGE), init_mt_params)
  iterator = ip.TrainIterator(batchers[0])    # in the loop: a batch is a few array copies
  state, evaluation_due = starting_state(config, STAGE, workdir, state, checkpoints, iterator,
                                         log)
  log.info("mt: %d parameters", sum(x.size for x in jax.tree_util.tree_leaves(state.params)))
  train_step, eval_step = make_steps(
      model, tx, schedule, dp, config.train.label_smoothing, trained=trained,
      loss_sums=make_mt_loss_sums(model, config.train.label_smoothing))
  scorer = MTDevScorer(MTTranslator(model, train_data.vocab, mt.beam,
                                    config.eval.length_penalty), dev) if (
      jax.process_index() == 0 and mt.score_dev) else None
  return StageRun(config, STAGE, model, dp, train, iterator, batchers[1], checkpoints, logger,
                  train_step, eval_step, scorer, plan, evaluation_due, mt.score_dev), state

