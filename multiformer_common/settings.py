"""A setting defined once: a dataclass field with its default, its meaning, whether it is a
config key, and what values it takes. The classes that use settings declare them (ModelConfig,
PipelineConfig, CorpusSpec, the experiment schema's sections) and the experiment's defaults
are read from them with `config_defaults`; `typed_values` and `check_values` check a section of
a config against its class, naming the key and what would be valid."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from multiformer_common.errors import InvalidValue


class ConfigError(InvalidValue):
  """A config value that cannot be used, naming the key and what is valid."""


def setting(default, help_text: str, config_key: bool = True, choices=None, at_least=None,
            above=None, below=None, at_most=None):
  """A field: its default, its help, whether it is a config key too, and the values it takes
  (`choices`, or bounds: at_least <= v, above < v, v < below, v <= at_most)."""
  return dataclasses.field(default=default, metadata={
      "help": help_text, "config_key": config_key, "choices": choices, "at_least": at_least,
      "above": above, "below": below, "at_most": at_most})


def config_fields(cls) -> dict[str, dataclasses.Field]:
  """{name: field} of the dataclass's fields that are config keys."""
  return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("config_key")}


def config_defaults(cls) -> dict[str, Any]:
  """{name: default} of the dataclass's fields that are config keys."""
  return {name: f.default for name, f in config_fields(cls).items()}


def _type_ok(default, value) -> tuple[bool, Any]:
  if isinstance(default, bool):
    return isinstance(value, bool), value
  if isinstance(default, int):
    return isinstance(value, int) and not isinstance(value, bool), value
  if isinstance(default, float):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok, float(value) if ok else value
  if isinstance(default, str):
    return isinstance(value, str), value
  if isinstance(default, (tuple, list)):
    kinds = {type(v) for v in default} or {int, str}
    ok = isinstance(value, (list, tuple)) and all(type(v) in kinds for v in value)
    return ok, tuple(value) if ok else value
  return True, value


def refuse_unknown(values: Mapping[str, Any], known, section: str):
  """ConfigError naming each key of `values` not among `known`, with the valid ones."""
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise ConfigError(f"unknown config key(s) {[f'{section}.{k}' for k in unknown]}; valid "
                      f"keys of {section}: {sorted(known)}")


def typed_values(cls, values: Mapping[str, Any], section: str,
                 fields: Mapping[str, dataclasses.Field] | None = None) -> dict[str, Any]:
  """`values` (a config section) checked against the dataclass's fields (default: its config
  keys): unknown keys and values of the wrong type are errors naming `section`.key; ints are
  accepted for floats, lists for tuples. -> {name: value}."""
  fields = config_fields(cls) if fields is None else fields
  refuse_unknown(values, fields, section)
  typed = {}
  for name, value in values.items():
    default = fields[name].default
    ok, value = _type_ok(default, value)
    if not ok:
      raise ConfigError(f"{section}.{name}={value!r} has type {type(value).__name__}; "
                        f"expected {type(default).__name__} like {default!r}")
    typed[name] = value
  return typed


def check_values(cls, values: Mapping[str, Any], section: str):
  """Each value within its field's declared `choices` or bounds, else ConfigError naming
  `section`.key and what is valid."""
  for name, field in config_fields(cls).items():
    if name not in values:
      continue
    value, meta = values[name], field.metadata
    if meta.get("choices") is not None:
      members = value if isinstance(value, (tuple, list)) else (value,)
      bad = [v for v in members if v not in meta["choices"]]
      if bad:
        raise ConfigError(f"{section}.{name}={value!r}; valid: "
                          f"{' | '.join(repr(c) for c in meta['choices'])}"
                          f"{' (each of the list)' if isinstance(value, (tuple, list)) else ''}")
    bounds = [(meta.get("at_least"), lambda v, b: v >= b, ">="),
              (meta.get("above"), lambda v, b: v > b, ">"),
              (meta.get("below"), lambda v, b: v < b, "<"),
              (meta.get("at_most"), lambda v, b: v <= b, "<=")]
    for bound, holds, word in bounds:
      if bound is not None and not holds(value, bound):
        valid = " and ".join(f"{w} {b}" for b, _, w in bounds if b is not None)
        raise ConfigError(f"{section}.{name}={value!r}; valid: {valid}")
