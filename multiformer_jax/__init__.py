"""multiformer-jax: Multiformer / local / head-selection attention for speech translation.

Public API:
    build_model(config)            -> S2TModel (flax.linen) from a ConfigDict or ModelConfig
    init_params(model, key)        -> parameters
    parse_layout(text, ...)        -> per-layer head groups, validated
    format_layout(layout)          -> canonical text
    ModelConfig                    -> the frozen model configuration
"""

from multiformer_jax.layout import LayoutError, format_layout, parse_layout
from multiformer_jax.model import (S2TModel, build_model, count_params, init_cache,
                                   init_params, model_config_from)
from multiformer_jax.model_config import ConfigError, ModelConfig
