"""The papers' analyses of a trained run: the command line `python -m multiformer_jax.analyze` (the code and its
options: multiformer_jax/analysis/analyze.py)."""

from multiformer_jax.analysis.analyze import cli, main  # noqa: F401

if __name__ == "__main__":
  cli()
