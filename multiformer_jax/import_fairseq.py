"""Turn a fairseq S2T checkpoint and its data root into a run: the command line
`python -m multiformer_jax.import_fairseq` (the code and its options:
multiformer_jax/training/fairseq_run.py)."""

from multiformer_jax.training.fairseq_run import cli, import_run, main  # noqa: F401

if __name__ == "__main__":
  cli()
