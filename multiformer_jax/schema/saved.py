"""A run's config as run.py saved it beside the checkpoints (config.json), read back over the
base config: a key the saved config lacks (a run from before the key existed) reads its
default. Checked as a loaded config is."""

from __future__ import annotations

import json
import os

import ml_collections

from multiformer_common.errors import MissingInput
from multiformer_jax.runtime import run_record
from multiformer_jax.schema import base, validation


def load_config(workdir: str, check_corpus: bool = True):
  """The config of the run in `workdir`. With `check_corpus`, refuses a prepared corpus whose
  vocabularies or CMVN statistics are not the ones the run trained with
  (runtime/run_record.py)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise MissingInput(f"{path} not found: evaluation reads the config saved by run.py "
                            f"beside the checkpoints; pass the run's --workdir")
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  config = ml_collections.ConfigDict(_over(base.base_config().to_dict(), saved))
  validation.check(config)
  if check_corpus:
    run_record.check_corpus(workdir, config.data.prepared_dir, "read the run",
                            data_order=False)
  return config


def _over(defaults: dict, saved: dict) -> dict:
  """`saved` with the keys it lacks taken from `defaults`, section by section."""
  merged = dict(defaults)
  for key, value in saved.items():
    merged[key] = (_over(defaults[key], value) if isinstance(value, dict) and
                   isinstance(defaults.get(key), dict) else value)
  return merged
