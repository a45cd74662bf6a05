"""python -m data_prep.embedded --out data/embedded: builds the embedded corpus (build.py)."""

from data_prep.embedded.build import cli

if __name__ == "__main__":
  cli()
