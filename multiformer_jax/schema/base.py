"""The base experiment: every key of a config at its default, read from the classes that
declare them (schema.sections, ModelConfig, PipelineConfig, CorpusSpec). Each experiment in
configs/ starts from it and overrides a few keys."""

from __future__ import annotations

import ml_collections

from multiformer_common import settings
from data_prep.embedded import spec as embedded_spec
from multiformer_jax.data import input_pipeline
from multiformer_jax.model import model_config
from multiformer_jax.schema import sections

NAME = "default"


def base_config() -> ml_collections.ConfigDict:
  """Every key at its default; `python run.py --config=... --print_config` shows them with an
  experiment's values."""
  config = ml_collections.ConfigDict()
  config.name = NAME
  config.reported = _section(sections.Reported)
  config.model = ml_collections.ConfigDict(model_config.config_defaults())
  data = config.data = _section(sections.DataSettings)
  data.update(input_pipeline.config_defaults())
  data.embedded = ml_collections.ConfigDict(embedded_spec.config_defaults())
  for name in ("train", "asr", "st", "mt", "eval"):
    config[name] = _section(sections.SECTIONS[name])
  return config


def _section(cls) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(settings.config_defaults(cls))
