"""A fairseq S2T checkpoint becomes a run: `evaluate`, `analyze` and `translate` read it like a
run of run.py, and run.py fine-tunes from it (`--config.st.init_from=OUT`).

    python -m multiformer_jax.import_fairseq --checkpoint checkpoint_best.pt \
        --data MUSTC_ROOT/en-de --config-yaml config_st.yaml --stage st --out runs/fairseq_st

Writes OUT/config.json, OUT/{stage}/checkpoints and the data root's index (OUT/prepared unless
--prepared_dir). A `.pt` is read without torch and without running code from its pickle
(--trust_pickle unpickles fully with torch); a `.npz` of the state dict is read too. Nothing is
written unless the checkpoint, the data and their vocabulary fit together. How:
multiformer_jax/fairseq_checkpoints/run_writer.py.
"""

from __future__ import annotations

import argparse

from multiformer_jax.fairseq_checkpoints import run_writer
from multiformer_jax.runtime import process_setup


def main(argv=None):
  parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
  parser.add_argument("--checkpoint", required=True, help="fairseq .pt (or .npz state dict)")
  parser.add_argument("--data", required=True,
                      help="the fairseq data root (fbank80.zip, {split}_{stage}.tsv, yaml)")
  parser.add_argument("--config-yaml", default=None,
                      help="the data root's yaml of the checkpoint (default: config_STAGE.yaml)")
  parser.add_argument("--stage", default="st", choices=("asr", "st"))
  parser.add_argument("--out", required=True, help="the run directory to write")
  parser.add_argument("--prepared_dir", default=None,
                      help="where the root's index goes (default: OUT/prepared)")
  parser.add_argument("--trust_pickle", action="store_true",
                      help="read a .pt with PyTorch's full unpickler (needs torch). A pickle "
                           "can run any code when it is loaded: use this only for a file whose "
                           "origin you trust, and only if the default reader, which builds "
                           "nothing but what fairseq checkpoints hold, refuses it")
  args = parser.parse_args(argv)
  result = run_writer.import_run(args.checkpoint, args.data, args.stage, args.out, args.config_yaml,
                      args.prepared_dir, args.trust_pickle)
  print(f"{args.out}: the {args.stage} stage of {args.checkpoint} (step {result['step']}, "
        f"{result['vocab_size']} symbols); evaluate with\n  python -m multiformer_jax.evaluate "
        f"--workdir {args.out} --stage {args.stage}")


cli = process_setup.command(main)


if __name__ == "__main__":
  cli()
