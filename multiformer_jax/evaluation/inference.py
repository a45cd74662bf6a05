"""Decoding a split with a model: the jitted cached beam search and corpus scoring.

Shared by evaluation from checkpoints (`evaluate`) and by training, which scores the dev split
at each evaluation when eval.score_dev is set.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common.progress import progress_bar
from multiformer_common.token_ids import CTC_BLANK_ID, PAD_ID
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import decode, rate_norm
from multiformer_jax.evaluation.metrics import corpus_bleu, corpus_wer
from multiformer_jax.model import S2TModel, init_cache, split_tasks


@functools.lru_cache(maxsize=16)
def make_beam_search(model: S2TModel, beam: int, length_penalty: float, max_len_a: float,
                   max_len_b: int, min_len: int = 1, unk_penalty: float = 0.0,
                   nbest: bool = False, ctc_weight: float = 0.0, no_repeat_ngram_size: int = 0,
                   rate_norm_target: float = 0.0, rate_norm_max_stretch: float = 1.0):
  """-> jitted fn(params, features, lengths, tasks=None, prefix=None, key=None) -> tokens
  [batch, steps] (pad after the end): fairseq's beam search (`decode.beam_search`) with
  max_len = min(max_len_a * frames + max_len_b, max_target_positions - 1) per utterance.

  tasks: [batch] task ids or a pair (encoder ids, decoder ids) of a multi-task model; prefix: [batch] forced first tokens (target-
  language tags); key: the PRNG key of `noisy` head-selection inference. With nbest=True it
  returns every finalised hypothesis, best first: (tokens [batch, beam, steps], scores
  [batch, beam]). ctc_weight > 0: joint CTC/attention decoding with the model's CTC head
  (`decode.beam_search`'s `ctc`); a model without one decodes with attention alone.
  no_repeat_ngram_size: fairseq's --no-repeat-ngram-size (0: off).
  rate_norm_target > 0: speaking-rate normalisation (`rate_norm`): an utterance whose CTC
  greedy path has more pieces per encoder position than this is stretched in time by the ratio
  (at most rate_norm_max_stretch) before the search; max_len counts the frames given.

  Equal arguments (an equal model: the same config) give the same jitted function, so a search
  made again in one process (training's dev scoring, then evaluation after training; each file
  decoder of translate) reuses the programs already traced and compiled for its batch shapes.
  """
  cfg = model.config
  if not 0.0 <= ctc_weight <= 1.0:
    raise InvalidValue(f"eval.ctc_weight={ctc_weight}: valid values are in [0, 1] (0 = attention "
                     "alone, ESPnet decodes ASR with 0.3)")
  decode.check_no_repeat_ngram_size(no_repeat_ngram_size,
                                    f"eval.no_repeat_ngram_size={no_repeat_ngram_size}")
  joint_ctc = ctc_weight > 0 and cfg.ctc_scores_output
  rate_norm.check_settings(rate_norm_target, rate_norm_max_stretch)
  if rate_norm_target > 0 and not cfg.ctc_head:
    raise InvalidValue(f"eval.rate_norm_target={rate_norm_target}: speaking-rate normalisation "
                     "reads the model's CTC head and this model has none (train with "
                     "ctc_weight > 0, or set eval.rate_norm_target=0)")
  limit = cfg.max_target_positions - 1
  noisy = cfg.selection_inference == "noisy" and (cfg.encoder_candidates or
                                                  cfg.decoder_candidates)

  def translate(params, features, lengths, tasks=None, prefix=None, key=None):
    variables = {"params": params}
    if noisy:                # fresh selection noise for the encoder and every decoder step
      encoder_key, decoder_key = jax.random.split(key)
      rngs = lambda i: {"selection": jax.random.fold_in(decoder_key, i)}
    else:
      encoder_key, rngs = None, lambda i: {}
    encoder_tasks, decoder_tasks = split_tasks(tasks)
    batch = features.shape[0]
    max_steps = min(int(max_len_a * features.shape[1]) + max_len_b, limit) + 1   # static
    max_lengths = decode.max_target_lengths(lengths, max_len_a, max_len_b, limit)
    encode = lambda f, l, **kw: model.apply(variables, f, l, True, encoder_tasks,
                                            method=model.encode, **kw,
                                            rngs={"selection": encoder_key} if noisy else {})
    if rate_norm_target > 0:
      features, lengths = _rate_normalised(encode, features, lengths, rate_norm_target,
                                           rate_norm_max_stretch)
    encoded, mask = encode(features, lengths)
    cross_kv = model.apply(variables, encoded, method=model.cross_kv)
    cache = init_cache(cfg, batch * beam, max_steps)
    row_tasks = None if decoder_tasks is None else jnp.repeat(decoder_tasks, beam)  # [b*beam]

    def step_fn(tokens, index, cache):
      return model.apply(variables, tokens, index, cache, cross_kv, mask, row_tasks,
                         method=model.decode_step, rngs=rngs(index))
    ctc = None
    if joint_ctc:
      ctc = (model.apply(variables, encoded, method=model.ctc_log_probs),
             jnp.sum(mask, axis=1), ctc_weight, CTC_BLANK_ID)
    tokens, scores = decode.beam_search(step_fn, cache, batch, beam, max_steps, max_lengths,
                                        cfg.vocab_size, cfg.eos_id, cfg.pad_id, cfg.bos_id,
                                        length_penalty, prefix, min_len=min_len,
                                        unk_penalty=unk_penalty, nbest=nbest, ctc=ctc,
                                        no_repeat_ngram_size=no_repeat_ngram_size)
    return (tokens, scores) if nbest else tokens
  return jax.jit(translate)


def _rate_normalised(encode, features, lengths, target: float, max_stretch: float):
  """(features, lengths) with each utterance denser than `target` (CTC greedy pieces per
  encoder position, read by a first pass of `encode`) stretched in time (`rate_norm`)."""
  _, state = encode(features, lengths, mutable=["ctc"])
  ctc_logits, ctc_mask = state["ctc"]["logits"][0]
  density = rate_norm.greedy_density(ctc_logits, ctc_mask, CTC_BLANK_ID)
  factors = rate_norm.stretch_factors(density, target, max_stretch)
  out_frames = rate_norm.stretched_frames(features.shape[1], max_stretch)
  return rate_norm.stretch_features(features, lengths, factors, out_frames)


def setting_stages(eval_cfg, key: str) -> tuple:
  """eval.<key>, a stage or a sequence of stages, as a tuple; refuses a name not a stage."""
  stages = eval_cfg[key]
  stages = (stages,) if isinstance(stages, str) else tuple(stages)
  if not set(stages) <= set(ip.SPEECH_STAGES):
    raise InvalidValue(f"eval.{key}={stages!r}; valid: stages among {ip.SPEECH_STAGES}")
  return stages


def no_repeat_ngram_size(eval_cfg, stage: str | None) -> int:
  """eval.no_repeat_ngram_size where `stage` is in eval.no_repeat_ngram_stages (or None), else
  0: a translation's pieces rarely repeat four in a row where a transcript's may."""
  stages = setting_stages(eval_cfg, "no_repeat_ngram_stages")
  size = eval_cfg.no_repeat_ngram_size
  decode.check_no_repeat_ngram_size(size, f"eval.no_repeat_ngram_size={size}")
  return size if stage is None or stage in stages else 0


def rate_norm_settings(eval_cfg, stage: str | None) -> dict:
  """make_beam_search's rate_norm_* arguments: eval.rate_norm_target and rate_norm_max_stretch
  where `stage` is in eval.rate_norm_stages (or None), else off (target 0)."""
  stages = setting_stages(eval_cfg, "rate_norm_stages")
  target = eval_cfg.rate_norm_target
  max_stretch = eval_cfg.rate_norm_max_stretch
  rate_norm.check_settings(target, max_stretch)
  if stage is not None and stage not in stages:
    target = 0.0
  return {"rate_norm_target": target, "rate_norm_max_stretch": max_stretch}


def make_beam_search_for(model: S2TModel, eval_cfg, beam: int | None = None,
                       length_penalty: float | None = None, min_len: int | None = None,
                       ctc_weight: float | None = None, nbest: bool = False,
                       stage: str | None = None):
  """make_beam_search with a config's eval.* search settings (beam, length penalty, max_len_a/b,
  min_len, unk_penalty, ctc_weight, no_repeat_ngram_size where `stage` is in
  eval.no_repeat_ngram_stages, speaking-rate normalisation where it is in
  eval.rate_norm_stages); the arguments given replace theirs."""
  return make_beam_search(
      model, beam or eval_cfg.beam,
      eval_cfg.length_penalty if length_penalty is None else length_penalty,
      eval_cfg.max_len_a, eval_cfg.max_len_b,
      eval_cfg.min_len if min_len is None else min_len,
      eval_cfg.unk_penalty, nbest=nbest,
      ctc_weight=eval_cfg.ctc_weight if ctc_weight is None else ctc_weight,
      no_repeat_ngram_size=no_repeat_ngram_size(eval_cfg, stage),
      **rate_norm_settings(eval_cfg, stage))


def joint_ctc_weight(model: S2TModel, eval_cfg, ctc_weight: float | None = None) -> float:
  """The CTC weight a search with these settings uses: 0 for a model without a CTC head over
  its output vocabulary."""
  weight = eval_cfg.ctc_weight if ctc_weight is None else ctc_weight
  return weight if model.config.ctc_scores_output else 0.0


def decode_split(params, batcher: ip.Batcher, translate, progress: bool = True, seed: int = 0,
                 pick=None, cancelled=None):
  """-> hypotheses (detokenised) in corpus order; a multi-task model's task ids are the
  batcher's (its `tasks`). pick: for a `translate` made with nbest=True, a function
  (hypotheses, scores [beam], lengths [beam] in tokens with EOS) -> the index of the one to
  keep (e.g. `word_lm.rescore`). cancelled: a function asked before each batch; when it
  returns something true, decoding stops there and returns None."""
  data = batcher.data
  hypotheses = [None] * len(data)
  batches = progress_bar(ip.eval_batches(batcher), total=len(batcher.epoch_plan(0)),
                         desc=f"decoding {data.split}", unit="batch", disable=not progress)
  forced = 0 if data.prefix is None else 1                 # a forced target-language tag
  for n, batch in enumerate(batches):
    if cancelled is not None and cancelled():
      return None
    tasks = ip.batch_tasks(batch)
    prefix = None
    if data.prefix is not None:
      prefix = jnp.asarray(np.where(batch["index"] >= 0, data.prefix[batch["index"]],
                                    data.prefix[0]))
    out = translate(params, jnp.asarray(batch["features"]), jnp.asarray(batch["lengths"]),
                    tasks, prefix, jax.random.PRNGKey(seed + n))
    tokens = np.asarray(out) if pick is None else picked(out, data.vocab, forced, pick)
    for row, i in enumerate(batch["index"]):
      if i >= 0:
        hypotheses[i] = data.vocab.decode(tokens[row][forced:])
  return hypotheses


def picked(nbest_out, vocab, forced: int, pick):
  """(tokens [batch, beam, steps], scores [batch, beam]) of an nbest=True search -> the
  hypothesis `pick(texts, scores, lengths)` chooses of each row: tokens [batch, steps]. The
  texts leave out the `forced` prefix tokens; lengths count every token and the EOS."""
  nbest, scores = np.asarray(nbest_out[0]), np.asarray(nbest_out[1])
  lengths = np.sum(nbest != PAD_ID, axis=2) + 1                        # [batch, beam]
  texts = [[vocab.decode(hyp[forced:]) for hyp in row] for row in nbest]
  return np.stack([row[pick(row_texts, row_scores, row_lengths)] for row, row_texts,
                   row_scores, row_lengths in zip(nbest, texts, scores, lengths)])


def score(stage: str, hypotheses, references) -> dict:
  return corpus_bleu(hypotheses, references) if stage == "st" else \
      corpus_wer(hypotheses, references)
