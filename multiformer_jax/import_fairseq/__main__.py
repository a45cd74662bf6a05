"""`python -m multiformer_jax.import_fairseq`: multiformer_jax/import_fairseq/run.py's command."""

from multiformer_jax.import_fairseq.run import cli

if __name__ == "__main__":
  cli()
