"""A setting defined once: a dataclass field with its default, its meaning and whether it is a
config key. The classes that use the settings declare them (ModelConfig, PipelineConfig,
CorpusSpec) and configs/default.py reads their defaults with `config_defaults`."""

from __future__ import annotations

import dataclasses
from typing import Any


def setting(default, help_text: str, config_key: bool = True):
  """A field: its default, its help and whether it is a config key too."""
  return dataclasses.field(default=default, metadata={"help": help_text,
                                                      "config_key": config_key})


def config_fields(cls) -> dict[str, dataclasses.Field]:
  """{name: field} of the dataclass's fields that are config keys."""
  return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("config_key")}


def config_defaults(cls) -> dict[str, Any]:
  """{name: default} of the dataclass's fields that are config keys."""
  return {name: f.default for name, f in config_fields(cls).items()}
