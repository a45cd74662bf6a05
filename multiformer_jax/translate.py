"""Transcribe and translate your own audio files: the command line `python -m multiformer_jax.translate` (the code and its
options: multiformer_jax/evaluation/translate.py)."""

from multiformer_jax.evaluation.translate import cli, main  # noqa: F401

if __name__ == "__main__":
  cli()
