"""Evaluation from checkpoints: the command line `python -m multiformer_jax.evaluate` (the code and its
options: multiformer_jax/evaluation/evaluate.py)."""

from multiformer_jax.evaluation.evaluate import cli, main  # noqa: F401

if __name__ == "__main__":
  cli()
