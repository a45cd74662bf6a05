"""The model: head layouts, the attention kinds (attention/), the conv subsampler, encoder and
decoder layers, head selection and adapters, and the S2T Transformer that joins them
(`s2t.py`, whose public names are re-exported here). Nothing here reads data or files (a
fairseq checkpoint is converted by multiformer_jax.import_fairseq)."""

from multiformer_jax.model.s2t import (S2TModel, build_model, count_params, init_cache,
                                        init_params, model_config_from, split_tasks)

__all__ = ["S2TModel", "build_model", "count_params", "init_cache", "init_params",
           "model_config_from", "split_tasks"]
