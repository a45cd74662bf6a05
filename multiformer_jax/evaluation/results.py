"""Where an evaluation's outputs are kept: one directory per stage, split, checkpoint selection
and search settings, `{workdir}/{stage}/eval_{split}/{selection}_beam{B}_{digest}/` (hyp.txt,
ref.txt, ids.txt, results.json with the settings), so that evaluating the same split again
with another selection or beam adds a directory instead of replacing the first one. The digest
is of every setting that changes the search (`search_settings`); the run's own evaluation is
the one with its config's settings (`read`).
"""

from __future__ import annotations

import hashlib
import json
import os

from multiformer_common.errors import InvalidValue
from multiformer_jax.evaluation import word_lm
from multiformer_jax.evaluation.inference import (no_repeat_ngram_size, rate_norm_settings,
                                                  setting_stages)

RESULTS = "results.json"


def averaged_count(config, checkpoint: str) -> int:
  """How many checkpoints evaluation by `checkpoint` averages (1 for latest and best)."""
  if checkpoint == "average":
    return config.eval.average_last
  if checkpoint == "around_best":
    return config.eval.average_around_best
  return 1


def lm_settings(config, stage: str, weight: float | None = None) -> dict | None:
  """The word-LM rescoring eval.lm_* asks of this stage ({weight, order, unigram}), or None
  (weight 0, or the stage not in eval.lm_stages). `weight` replaces eval.lm_weight. Refuses
  settings that are not valid, whatever the weight (training checks them before it starts)."""
  e = config.eval
  weight = e.lm_weight if weight is None else weight
  stages = setting_stages(e, "lm_stages")
  if weight < 0:
    raise InvalidValue(f"eval.lm_weight={weight}; valid: >= 0 (0 = no LM rescoring)")
  order, unigram = e.lm_order, e.lm_unigram
  word_lm.check_settings(order, unigram)
  if not weight or stage not in stages:
    return None
  return {"weight": float(weight), "order": order, "unigram": unigram}


def search_settings(config, stage: str, checkpoint: str | None = None,
                    average_last: int | None = None, beam: int | None = None,
                    length_penalty: float | None = None, min_len: int | None = None,
                    ctc_weight: float | None = None, lm_weight: float | None = None) -> dict:
  """Every setting of an evaluation of `stage`: the config's eval.*, each argument given
  replacing its own."""
  e = config.eval
  checkpoint = checkpoint or e.checkpoint
  rate = rate_norm_settings(e, stage)
  return {"checkpoint": checkpoint,
          "averaged": average_last or averaged_count(config, checkpoint),
          "beam": beam or e.beam,
          "length_penalty": e.length_penalty if length_penalty is None else length_penalty,
          "min_len": e.min_len if min_len is None else min_len,
          "max_len_a": e.max_len_a, "max_len_b": e.max_len_b, "unk_penalty": e.unk_penalty,
          "ctc_weight": e.ctc_weight if ctc_weight is None else ctc_weight,
          "lm": lm_settings(config, stage, lm_weight),
          "no_repeat_ngram_size": no_repeat_ngram_size(e, stage),
          "rate_norm": rate if rate["rate_norm_target"] else None}


def directory(workdir: str, stage: str, split: str, settings: dict) -> str:
  """The directory of the evaluation of `split` with `settings`."""
  digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
  averaged = settings["averaged"] if settings["checkpoint"] in ("average", "around_best") \
      else ""
  return os.path.join(workdir, stage, f"eval_{split}",
                      f"{settings['checkpoint']}{averaged}_beam{settings['beam']}_{digest}")


def find(workdir: str, stage: str, split: str, config) -> str | None:
  """The directory of the run's own evaluation of `split` (its config's settings), or of the
  one evaluation made with other settings if there is only one; None if there is none. A run
  evaluated before the directories were kept per settings has its results in eval_{split}/."""
  own = directory(workdir, stage, split, search_settings(config, stage))
  if os.path.exists(os.path.join(own, RESULTS)):
    return own
  split_dir = os.path.join(workdir, stage, f"eval_{split}")
  if os.path.exists(os.path.join(split_dir, RESULTS)):
    return split_dir
  others = [os.path.join(split_dir, d) for d in sorted(os.listdir(split_dir))
            if os.path.exists(os.path.join(split_dir, d, RESULTS))] \
      if os.path.isdir(split_dir) else []
  return others[0] if len(others) == 1 else None


def read(workdir: str, stage: str, split: str, config) -> dict | None:
  """results.json of `find`'s evaluation, or None."""
  found = find(workdir, stage, split, config)
  if found is None:
    return None
  with open(os.path.join(found, RESULTS), encoding="utf-8") as f:
    return json.load(f)


def evaluated_splits(workdir: str, stage: str) -> list[str]:
  """The splits of a stage with at least one evaluation."""
  stage_dir = os.path.join(workdir, stage)
  splits = []
  for entry in sorted(os.listdir(stage_dir)) if os.path.isdir(stage_dir) else []:
    path = os.path.join(stage_dir, entry)
    if entry.startswith("eval_") and (os.path.exists(os.path.join(path, RESULTS)) or any(
        os.path.exists(os.path.join(path, d, RESULTS)) for d in os.listdir(path)
        if os.path.isdir(os.path.join(path, d)))):
      splits.append(entry[len("eval_"):])
  return splits
