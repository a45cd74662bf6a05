"""Transcribe and translate your own audio files: the command line `python -m multiformer_jax.translate` (the code and its
options: multiformer_jax/evaluation/translate.py)."""

from multiformer_jax.evaluation.translate import cli, main  # noqa: F401
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags

if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  cli()
