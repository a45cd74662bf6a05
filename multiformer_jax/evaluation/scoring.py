"""Scores a trained stage on a split: the library of the `evaluate` command
(multiformer_jax/evaluate.py, where its options are) and of training's evaluation after it
trains.

Reads the config saved by run.py in the workdir, averages checkpoints if asked, decodes every
utterance of the split once, and writes the directory of these settings,
`{workdir}/{stage}/eval_{split}/{selection}_beam{B}_{digest}/` (evaluation/results.py): hyp.txt and
ref.txt (detokenised, in corpus order) and results.json (score, sacreBLEU signature or WER
normalisation, scores per language / pair / domain and the head-selection paper's averages
(AVG-A / AVG-T / AVG-Z over directions, AVG over ASR languages), checkpoint description,
decoding settings) and ids.txt (the utterance ids). Utterances whose task a multi-task model
does not have (a pair-keyed model on a zero-shot direction) are counted in `left_out`, not
decoded. With eval.lm_weight > 0 (or --lm_weight), the stages in eval.lm_stages keep, of each
utterance's `beam` finished hypotheses, the best after rescoring with a word n-gram LM of the
stage's training targets (`word_lm`).
"""

from __future__ import annotations

import os
import time

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common import atomic
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import word_lm
from multiformer_jax.evaluation.trained_stage import load_trained_stage
from multiformer_jax.evaluation.results import RESULTS, search_settings
from multiformer_jax.evaluation.results import directory as results_directory
from multiformer_jax.evaluation.inference import (decode_split, joint_ctc_weight,
                                                  make_beam_search_for, no_repeat_ngram_size,
                                                  rate_norm_settings, score)
from multiformer_jax.experiment import known_task_rows, pipeline_config, training_pairs
from multiformer_jax.runtime.train_log import setup_logging


def scores_by_tag(stage: str, data: ip.SplitData, hypotheses, tag_names) -> dict:
  """{tag: {value: score and utterance count}} for each tag with several values in the split
  (per language, per domain, per task: the rows of the per-task results table)."""
  grouped = {}
  for tag in tag_names:
    values = np.asarray(data.tag_values[tag]).astype(str)
    distinct = sorted(set(values))
    if len(distinct) < 2:
      continue
    grouped[tag] = {}
    for value in distinct:
      rows = np.flatnonzero(values == value)
      result = score(stage, [hypotheses[i] for i in rows], [data.references[i] for i in rows])
      metric = "bleu" if stage == "st" else "wer"
      grouped[tag][value] = {metric: result[metric], "utterances": int(len(rows))}
  return grouped


def paper_averages(stage: str, by_tag: dict, split_pairs, trained_pairs, left_out) -> dict:
  """The averages the head-selection paper reports (Gong et al. 2022), of per-direction or
  per-language scores, not of one corpus score: ST Table 4's AVG-A (every direction of the
  split), AVG-T (the directions trained on) and AVG-Z (the zero-shot ones); ASR Table 2's AVG
  over the source languages. None where a direction is missing (`left_out`: no task in the
  model) or there is none; {} for a split of one direction / language."""
  if stage == "asr":
    per_lang = by_tag.get("source_lang", {})
    return {"AVG": round(float(np.mean([r["wer"] for r in per_lang.values()])), 2)} \
        if per_lang else {}
  per_pair = {p: r["bleu"] for p, r in by_tag.get("pair", {}).items()}
  if len(split_pairs) < 2:
    return {}

  def mean(pairs):
    if not pairs or any(p in left_out or p not in per_pair for p in pairs):
      return None
    return round(float(np.mean([per_pair[p] for p in pairs])), 2)
  trained = [p for p in split_pairs if p in set(trained_pairs)]
  zero_shot = [p for p in split_pairs if p not in set(trained_pairs)]
  return {"AVG-A": mean(list(split_pairs)), "AVG-T": mean(trained), "AVG-Z": mean(zero_shot),
          "zero_shot_pairs": zero_shot}


def stage_language_model(config, stage: str, settings: dict) -> word_lm.WordLM:
  """A word LM of the stage's training targets (English transcripts for ASR, translations for
  ST), its unigram level backed off as `settings` says in the targets' language."""
  train = ip.SplitData(pipeline_config(config, stage), config.data.train_split)
  side = 0 if stage == "asr" else 1
  languages = sorted({str(pair).split("-")[side] for pair in train.tag_values["pair"]})
  if settings["unigram"] == "wordfreq" and len(languages) != 1:
    raise InvalidValue(f"eval.lm_unigram='wordfreq' takes the word frequencies of one language; "
                     f"the {stage} targets are in {languages}. Use eval.lm_unigram='uniform'.")
  return word_lm.build_lm(train.references, settings["order"], settings["unigram"],
                          languages[0])


def lm_rescorer(config, stage: str, settings: dict, beam: int, length_penalty: float):
  """-> pick(texts, scores, lengths): the index of the best of an n-best list after rescoring
  with the stage's word LM (`inference.decode_split`'s `pick`)."""
  start = time.time()
  model_lm = stage_language_model(config, stage, settings)
  setup_logging().info(
      "rescoring each utterance's %d-best with a word %d-gram LM of the %s training targets "
      "(weight %g, unigram back-off: %s; built in %.1f s)", beam, settings["order"], stage,
      settings["weight"], settings["unigram"], time.time() - start)
  return lambda texts, scores, lengths: word_lm.rescore(
      texts, scores, lengths, model_lm, settings["weight"], length_penalty)


def evaluate_stage(config, workdir: str, stage: str, split: str, checkpoint: str | None = None,
                   average_last: int | None = None, beam: int | None = None,
                   length_penalty: float | None = None, progress: bool = True,
                   min_len: int | None = None, ctc_weight: float | None = None,
                   lm_weight: float | None = None) -> dict:
  """Decodes and scores `split` with the config's eval.* settings (each argument given replaces
  its own), writing the results to the directory of these settings (results.directory)."""
  log = setup_logging()
  e = config.eval
  settings = search_settings(config, stage, checkpoint, average_last, beam, length_penalty,
                             min_len, ctc_weight, lm_weight)
  checkpoint, average_last, beam = (settings["checkpoint"], settings["averaged"],
                                    settings["beam"])
  length_penalty, min_len, lm = (settings["length_penalty"], settings["min_len"],
                                 settings["lm"])
  data = ip.SplitData(pipeline_config(config, stage, "test"), split)
  split_pairs = ip.split_tags(data)["pair"]
  # Task ids are the training split's (as in training), whatever the evaluated split holds.
  trained = load_trained_stage(workdir, config, stage, data.vocab.size, checkpoint,
                               average_last)
  model, params, which, tasks = trained.model, trained.params, trained.checkpoint, trained.tasks
  data, left_out = known_task_rows(data, tasks)
  if left_out:
    log.warning("%s: %d utterances have no task in the model (it was never trained on them) "
                "and are not decoded: %s", split, sum(left_out.values()), left_out)
  batcher = ip.Batcher(data, False, tasks=tasks)
  ctc_weight = joint_ctc_weight(model, e, settings["ctc_weight"])
  log.info("evaluating %s on %s (%d utterances) with %s, beam %d%s", stage, split, len(data),
           which, beam, f", joint CTC/attention (ctc_weight {ctc_weight})" if ctc_weight else "")
  unk_penalty = e.unk_penalty
  pick = lm_rescorer(config, stage, lm, beam, length_penalty) if lm else None
  translate = make_beam_search_for(model, e, beam, length_penalty, min_len, ctc_weight,
                                 nbest=lm is not None, stage=stage)
  search = "fairseq 0.12.2 beam search" + (
      f", joint CTC/attention scores (ctc_weight {ctc_weight})" if ctc_weight else "") + (
      f", n-best rescored with a word {lm['order']}-gram LM (weight {lm['weight']}, unigram "
      f"{lm['unigram']})" if lm else "")
  rate = rate_norm_settings(e, stage)
  if rate["rate_norm_target"]:
    search += (f", speaking-rate normalisation (CTC greedy density above "
               f"{rate['rate_norm_target']:g} stretched, at most "
               f"{rate['rate_norm_max_stretch']:g}x)")
  start = time.time()
  hypotheses = decode_split(params, batcher, translate, progress, config.train.seed, pick)
  references = data.references
  overall = score(stage, hypotheses, references)
  if stage == "asr" and len(references) > 1:
    # Chance level: the same hypotheses against the references in a fixed shuffled order. A
    # split whose audio is linked to its text reads far below it.
    shuffled = np.random.default_rng(0).permutation(len(references))
    overall["wer_shuffled_references"] = score(
        stage, hypotheses, [references[i] for i in shuffled])["wer"]
  per_tag = scores_by_tag(stage, data, hypotheses, ip.TAG_NAMES)
  left_out_pairs = sorted(set(split_pairs) - set(ip.split_tags(data)["pair"]))
  averages = paper_averages(stage, per_tag, split_pairs, training_pairs(config, stage),
                            left_out_pairs)
  out_dir = results_directory(workdir, stage, split, settings)
  os.makedirs(out_dir, exist_ok=True)
  ids = [str(i) for i in data.ids]
  for name, lines in (("hyp.txt", hypotheses), ("ref.txt", references), ("ids.txt", ids)):
    atomic.write_text(os.path.join(out_dir, name), "".join(line + "\n" for line in lines))
  result = {"stage": stage, "split": split, "utterances": len(data), **overall,
            "by_tag": per_tag, "averages": averages,
            "task_keys": {side: k.field for side, k in (tasks or {}).items()},
            "left_out": left_out,
            "checkpoint": which, "beam": beam, "length_penalty": length_penalty,
            "max_len": f"{e.max_len_a} * frames + {e.max_len_b}", "min_len": min_len,
            "unk_penalty": unk_penalty, "ctc_weight": ctc_weight,
            "no_repeat_ngram_size": no_repeat_ngram_size(e, stage), "lm": lm,
            "rate_norm": rate if rate["rate_norm_target"] else None, "search": search,
            "decode_s": round(time.time() - start, 1), "config": config.name,
            "settings": settings, "directory": out_dir}
  atomic.write_json(os.path.join(out_dir, RESULTS), result, indent=1, ensure_ascii=False)
  log.info("%s %s: %s", stage, split, f"BLEU {overall['bleu']}, chrF {overall['chrf']}"
           if stage == "st" else f"WER {overall['wer']} (against shuffled references "
           f"{overall.get('wer_shuffled_references')})")
  if averages:
    log.info("  averages (Gong et al. 2022): %s", ", ".join(
        f"{k} {'—' if v is None else v}" for k, v in averages.items() if k.startswith("AVG")))
  for tag, values in per_tag.items():
    log.info("  by %s: %s", tag, ", ".join(f"{v} {r.get('bleu', r.get('wer'))}"
                                           for v, r in values.items()))
  return result
