"""multiformer-jax: Multiformer / local / head-selection attention for speech translation.

Public API:
    build_model(config)            -> S2TModel (flax.linen) from a ConfigDict or ModelConfig
    init_params(model, key)        -> parameters
    parse_layout(text, ...)        -> per-layer head groups, validated
    format_layout(layout)          -> canonical text
    ModelConfig                    -> the frozen model configuration

Layout (arrows run one way: run.py -> training -> evaluation -> model, data, runtime):
    model/       head layouts, attention kinds, subsampler, encoder, decoder, head selection
    data/        the input pipeline: prepared data -> padded batches
    runtime/     checkpoints and saved configs, logs, fault injection, huge pages
    training/    the training loop, data parallelism, learning curves
    evaluation/  beam search, metrics, evaluation from checkpoints, translate
    analysis/    heads, contributions, windows, head selection: the papers' analyses
    experiment   what a config means for one stage (pipeline, task keys, model config)
    evaluate, translate, analyze, ablate: the command lines (python -m multiformer_jax.X)

The names are imported on first use, so that modules without JAX (the input pipeline's
worker processes import `multiformer_jax.data.input_pipeline`) do not load JAX and Flax.
"""

import importlib

_EXPORTS = {
    "LayoutError": "model.layout", "format_layout": "model.layout",
    "parse_layout": "model.layout",
    "S2TModel": "model.s2t", "build_model": "model.s2t", "count_params": "model.s2t",
    "init_cache": "model.s2t", "init_params": "model.s2t", "model_config_from": "model.s2t",
    "ConfigError": "model.model_config", "ModelConfig": "model.model_config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"multiformer_jax.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'multiformer_jax' has no attribute {name!r}")
