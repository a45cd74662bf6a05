"""multiformer-jax: Multiformer / local / head-selection attention for speech translation.

Public API:
    build_model(config)            -> S2TModel (flax.linen) from a ConfigDict or ModelConfig
    init_params(model, key)        -> parameters
    parse_layout(text, ...)        -> per-layer head groups, validated
    format_layout(layout)          -> canonical text
    ModelConfig                    -> the frozen model configuration

The names are imported on first use, so that modules without JAX (the input pipeline's
worker processes import `multiformer_jax.input_pipeline`) do not load JAX and Flax.
"""

import importlib

_EXPORTS = {
    "LayoutError": "layout", "format_layout": "layout", "parse_layout": "layout",
    "S2TModel": "model", "build_model": "model", "count_params": "model",
    "init_cache": "model", "init_params": "model", "model_config_from": "model",
    "ConfigError": "model_config", "ModelConfig": "model_config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"multiformer_jax.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'multiformer_jax' has no attribute {name!r}")
