"""Trains (and optionally evaluates) an experiment from its config; `multiformer-train` is the
same command. Flags and behaviour: multiformer_jax/train.py.

    python run.py --config=configs/s2t_v2.py --workdir=runs/v2
"""

from multiformer_jax.train import cli

if __name__ == "__main__":
  cli()
