"""An experiment's schema, in one place: every key of a config declared once with its default,
meaning and valid values (`sections`, and the library classes it reads: ModelConfig,
PipelineConfig, CorpusSpec), the base config built from them (`base_config`), what experiments
share (`variants`: the `:arg` of --config, runlocal, a paper's batch per update), and the one
check of a loaded config (`check`). configs/ holds experiments alone; each starts from
`base_config()` and ends with `apply_arg(config, arg)`."""

from multiformer_jax.schema.base import base_config
from multiformer_jax.schema.validation import check
from multiformer_jax.schema.saved import load_config
from multiformer_jax.schema.variants import (NODOWN_BATCH, NODOWN_MEMORY_OPTIONS, VARIANTS,
                                             apply_arg, batch_per_update, no_downsampling,
                                             runlocal)

__all__ = ["base_config", "check", "load_config", "apply_arg", "batch_per_update",
           "no_downsampling", "runlocal", "VARIANTS", "NODOWN_BATCH", "NODOWN_MEMORY_OPTIONS"]
