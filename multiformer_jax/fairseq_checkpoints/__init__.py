"""fairseq S2T checkpoints in this toolkit, in one place: `checkpoint` maps a checkpoint's
state dict and arguments onto this model (pure numpy; `safe_pickle` reads a `.pt` without
torch and without running code from it), `thesis` reads the thesis's Multiformer arguments, and
`run_writer` writes a checkpoint and its data root as a run that every command reads. The
command is multiformer_jax/import_fairseq.py (`python -m multiformer_jax.import_fairseq`,
`multiformer-import-fairseq`)."""
