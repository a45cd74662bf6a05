"""fairseq S2T checkpoints in this toolkit, in one place: `checkpoint` maps a checkpoint's
state dict and arguments onto this model (pure numpy; `safe_pickle` reads a `.pt` without
torch and without running code from it), `run` writes a
checkpoint and its data root as a run that every command reads, and `python -m
multiformer_jax.import_fairseq` is its command line (`multiformer-import-fairseq`)."""
