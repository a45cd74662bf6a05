"""Analyses of a trained run's encoder self-attention, one command each:

    # W_o / W_v per head (thesis §4.3, figures 21-22) and each head's output-norm share
    python -m multiformer_jax.analyze heads --workdir runs/v2 --stage st --out analysis/v2

    # Pre-LN token contributions, D(w, l) and CCD per layer, ASR and ST on one plot (paper fig. 2-5)
    python -m multiformer_jax.analyze contributions --workdir runs/v2 --stages asr st \
        --out analysis/v2 [--show_diagonal] [--compare runs/full runs/local ...]

    # Window selection (Algorithm 1) -> Table-1-style table and a config run.py trains as is
    python -m multiformer_jax.analyze windows --workdir runs/v2 --stage st --num_utterances 400 \
        --out analysis/v2 [--config_out configs/v2_windows.py]

    # Head selection: the heads (and kinds) each task selects, sharing and load (Gong et al.
    # figures 3-4); data-free, from the selection logits
    python -m multiformer_jax.analyze selection --workdir runs/hs --stage st --out analysis/hs

Every command reads the config saved in the workdir, a checkpoint (--checkpoint best | latest |
average | around_best), N random utterances of a split (--split, default the config's dev
split; --seed), and writes PNG plots and CSV + markdown tables to --out.

Each analysis is beside its helpers: heads (multiformer_jax/analysis/heads.py), contributions
and windows (analysis/locality.py), selection (analysis/selection.py).
"""

from __future__ import annotations

import argparse
import json
import sys

from multiformer_jax.analysis import heads, internals, locality, selection
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import process_setup


def _common(parser):
  parser.add_argument("--workdir", required=True, help="a run directory written by run.py")
  parser.add_argument("--split", default=None, help="default: the config's data.dev_split")
  parser.add_argument("--checkpoint", default="best", choices=ckpt_lib.SELECTIONS)
  parser.add_argument("--average_last", type=int, default=10,
                      help="checkpoints averaged by average (the last N) and around_best")
  parser.add_argument("--num_utterances", type=int, default=100)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--seed", type=int, default=0, help="which random utterances")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--no_progress", action="store_true")


def _contribution_options(parser):
  parser.add_argument("--example", type=int, default=-1,
                      help="which sampled utterance to plot (by length; -1: the median)")
  parser.add_argument("--no_residual", action="store_true",
                      help="leave the residual x_i out of C_ii (the paper keeps it)")


def _per_head(run: internals.Run, command: str) -> internals.Run:
  """The run, if every head of its encoder owns its W_o rows (not a head-selection model)."""
  if run.config.model.get("encoder_candidates"):
    raise SystemExit(f"{command}: the per-head W_o and contribution analyses need every "
                     f"head to own its W_o rows; in a head-selection model the W_o slots are "
                     f"shared by candidates. Use: python -m multiformer_jax.analyze selection")
  return run


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  heads_parser = sub.add_parser("heads", help="W_o / W_v per head and head output-norm shares")
  _common(heads_parser)
  heads_parser.add_argument("--stage", default="st", choices=("asr", "st"))
  contributions = sub.add_parser("contributions", help="token contributions, D(w,l), CCD")
  _common(contributions)
  contributions.add_argument("--stages", nargs="+", default=["asr", "st"],
                             choices=("asr", "st"))
  contributions.add_argument(
      "--show_diagonal", action="store_true",
      help="draw the main diagonal too; by default it is hidden, as in the locality paper's "
           "figures: it holds most of each row and would leave the rest of the map blank")
  contributions.add_argument(
      "--compare", nargs="*", default=[],
      help="more run directories analysed the same way: their CCD per layer on one plot "
           "(e.g. the layouts of an ablation); per-run files are named after each config")
  _contribution_options(contributions)
  windows = sub.add_parser("windows", help="Algorithm 1 window selection and a config")
  _common(windows)
  windows.add_argument("--stage", default="st", choices=("asr", "st"))
  windows.add_argument("--threshold", type=float, default=0.01)
  windows.add_argument("--patience", type=float, default=0.1,
                       help="stop after N*patience consecutive diagonals below the threshold")
  windows.add_argument("--full_cl_threshold", type=float,
                       default=locality.DEFAULT_FULL_CL_THRESHOLD,
                       help="layers whose CL(l, w^l) exceeds this keep full attention")
  windows.add_argument("--full_layers", type=int, nargs="*", default=None,
                       help="1-based layers that keep full attention (overrides the threshold)")
  windows.add_argument("--config_out", default=None, help="default: {out}/{name}_windows.py")
  _contribution_options(windows)
  selection_parser = sub.add_parser("selection", help="heads selected per task, sharing, load")
  _common(selection_parser)
  selection_parser.add_argument("--stage", default="st", choices=("asr", "st"))
  args = parser.parse_args(argv)
  if args.num_utterances < 1 or args.batch_size < 1:
    parser.error(f"--num_utterances ({args.num_utterances}) and --batch_size "
                 f"({args.batch_size}) must be >= 1")
  load = lambda stage: internals.load_run(args.workdir, stage, args.split, args.checkpoint,
                                          args.average_last)
  common = dict(num_utterances=args.num_utterances, batch_size=args.batch_size, seed=args.seed,
                progress=not args.no_progress)
  if args.command == "selection":
    result = selection.analyze_selection(load(args.stage), args.out)
    for stack, rows in result["kinds"].items():
      print(stack, "kinds per task:", rows)
    for row in result["drift"]:
      print(row)
    print(json.dumps(result["paths"], indent=1))
    return
  if args.command == "heads":
    result = heads.analyze_heads(_per_head(load(args.stage), args.command), args.out, **common)
  elif args.command == "contributions":
    runs = [_per_head(internals.load_run(workdir, stage, args.split, args.checkpoint,
                                         args.average_last), args.command)
            for workdir in [args.workdir] + args.compare for stage in args.stages]
    result = locality.analyze_contributions(runs, args.out, example=args.example,
                                            hide_diagonal=not args.show_diagonal,
                                            residual=not args.no_residual, **common)
  else:
    result = locality.select_windows(
        _per_head(load(args.stage), args.command), args.out, threshold=args.threshold,
        patience_fraction=args.patience, full_cl_threshold=args.full_cl_threshold,
        full_layers=args.full_layers, config_out=args.config_out, example=args.example,
        residual=not args.no_residual, command="python -m multiformer_jax.analyze " + " ".join(
            argv if argv is not None else sys.argv[1:]), **common)
    with open(result["paths"]["table"], encoding="utf-8") as f:
      print(f.read())
    print("layout:", result["layout"])
  print(json.dumps(result["paths"], indent=1))


cli = process_setup.command(main)


if __name__ == "__main__":
  cli()
