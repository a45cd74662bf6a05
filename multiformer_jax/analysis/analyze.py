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
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

from data_prep.common import cli_errors
from multiformer_jax import experiment
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.analysis import diagonality as diag
from multiformer_jax.analysis import heads as heads_lib
from multiformer_jax.analysis import internals, plots
from multiformer_jax.analysis import selection as selection_lib
from multiformer_jax.runtime import process_setup, tables
from multiformer_jax import schema
from multiformer_jax.schema import sections

DEFAULT_FULL_CL_THRESHOLD = 0.25


def _source(run: internals.Run, count: int) -> str:
  return (f"{run.config.name}, {run.stage} {run.checkpoint}, {count} utterances of "
          f"{run.data.split}")


# ----------------------------------------------------------------------------- heads
def analyze_heads(run: internals.Run, out_dir: str, num_utterances: int = 100,
                  batch_size: int = 8, seed: int = 0, progress: bool = True) -> dict:
  """W_o rows and W_v columns per head; output-norm share per head. Returns paths and arrays."""
  os.makedirs(out_dir, exist_ok=True)
  layout = run.layout
  labels = [heads_lib.head_labels(layer) for layer in layout]
  blocks = heads_lib.layer_weight_blocks(run.params, layout)
  accumulator = heads_lib.HeadShareAccumulator()
  chosen = internals.sample_utterances(run.data, num_utterances, seed)
  count = len(chosen)
  for _, layers in internals.per_utterance(run, chosen, batch_size, False, progress):
    accumulator.add(layers)
  output_share = accumulator.result()
  weight_share = heads_lib.weight_norm_shares(blocks)
  tag = run.stage
  paths = {
      "W_o": plots.head_weight_distributions(blocks, labels, "W_o",
                                             os.path.join(out_dir, f"head_weights_W_o_{tag}.png")),
      "W_v": plots.head_weight_distributions(blocks, labels, "W_v",
                                             os.path.join(out_dir, f"head_weights_W_v_{tag}.png")),
      "output_share": plots.head_heatmap(
          output_share, labels, f"head output-norm share ({_source(run, count)})",
          os.path.join(out_dir, f"head_output_share_{tag}.png")),
  }
  rows = []
  for l, layer_labels in enumerate(labels):
    for h, label in enumerate(layer_labels):
      rows.append({"layer": l + 1, "head": h + 1, "kind": label,
                   "output_share": float(output_share[l, h]),
                   "W_o_norm_share": float(weight_share["W_o"][l, h]),
                   "W_v_norm_share": float(weight_share["W_v"][l, h]),
                   "W_o_abs_mean": float(np.abs(blocks[l]["W_o"][h]).mean()),
                   "W_v_abs_mean": float(np.abs(blocks[l]["W_v"][h]).mean())})
  paths["table"] = tables.write_table(rows, os.path.join(out_dir, f"heads_{tag}"),
                                      title=f"Head analysis: {_source(run, count)}").md
  return {"paths": paths, "output_share": output_share, "rows": rows}


# ----------------------------------------------------------------------------- contributions
class ContributionStats:
  """Per layer and utterance: the D(w) curve, CCD and the Algorithm-1 window."""

  def __init__(self, threshold: float, patience_fraction: float):
    self.threshold, self.patience_fraction = threshold, patience_fraction
    self.curves: list[list[np.ndarray]] = []       # [layer][utterance] D(w) curve
    self.windows: list[list[int]] = []             # [layer][utterance] Algorithm-1 window

  @property
  def count(self) -> int:
    """Utterances added so far."""
    return len(self.curves[0]) if self.curves else 0

  def add(self, layers: list[dict]):
    if not self.curves:
      self.curves = [[] for _ in layers]
      self.windows = [[] for _ in layers]
    for l, layer in enumerate(layers):
      c = layer["contributions"]
      self.curves[l].append(diag.diagonality_curve(c))
      self.windows[l].append(diag.select_window(c, self.threshold, self.patience_fraction))

  def ccd_mean_std(self, area=diag.curve_area):
    """Per layer (mean, std) over the utterances of `area` (normalised CCD by default)."""
    ccd = [[area(curve) for curve in curves] for curves in self.curves]
    return np.array([np.mean(v) for v in ccd]), np.array([np.std(v) for v in ccd])

  def contribution_loss(self, layer: int, window: int):
    """CL(l, w) over the utterances: (mean, std)."""
    losses = [1.0 - diag.curve_at(curve, window) for curve in self.curves[layer]]
    return float(np.mean(losses)), float(np.std(losses))


def collect_contributions(run: internals.Run, num_utterances: int, batch_size: int, seed: int,
                          example: int, threshold: float = 0.01,
                          patience_fraction: float = 0.1, progress: bool = True,
                          residual: bool = True):
  """-> (ContributionStats, contribution matrices of the example utterance per layer,
  its corpus index). `example` indexes the sampled utterances sorted by length (-1: median)."""
  stats = ContributionStats(threshold, patience_fraction)
  chosen = internals.sample_utterances(run.data, num_utterances, seed)
  example_index = int(chosen[len(chosen) // 2 if example < 0 else min(example, len(chosen) - 1)])
  example_matrices = None
  for index, layers in internals.per_utterance(run, chosen, batch_size, True, progress,
                                               residual):
    stats.add(layers)
    if index == example_index:
      example_matrices = [layer["contributions"] for layer in layers]
  return stats, example_matrices, example_index


def analyze_contributions(runs: list[internals.Run], out_dir: str, num_utterances: int = 100,
                          batch_size: int = 8, seed: int = 0, example: int = -1,
                          hide_diagonal: bool = True, progress: bool = True,
                          residual: bool = True) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  series, rows, paths = {}, [], {}
  several = len({run.config.name for run in runs}) > 1     # runs compared: files per run
  for run in runs:
    stats, matrices, index = collect_contributions(run, num_utterances, batch_size, seed,
                                                   example, progress=progress,
                                                   residual=residual)
    count = stats.count
    utt = run.data.ids[index]
    tag = f"{run.stage}_{run.config.name}" if several else run.stage
    paths[f"contributions_{tag}"] = plots.contribution_matrices(
        matrices, f"{run.stage.upper()} contributions, utterance {utt}"
        + (f", {run.config.name}" if several else "")
        + (" (main diagonal hidden)" if hide_diagonal else ""),
        os.path.join(out_dir, f"contributions_{tag}.png"), hide_diagonal)
    paths[f"diagonality_{tag}"] = plots.diagonality_curves(
        [diag.diagonality_curve(c) for c in matrices],
        f"{run.stage.upper()} D(w, l), utterance {utt}",
        os.path.join(out_dir, f"diagonality_{tag}.png"))
    mean, std = stats.ccd_mean_std()
    area_mean, area_std = stats.ccd_mean_std(diag.curve_area_unnormalised)
    series[f"{run.stage.upper()} ({run.config.name})"] = (mean, std)
    for l in range(len(mean)):
      rows.append({"stage": run.stage, "layer": l + 1, "ccd_mean": float(mean[l]),
                   "ccd_std": float(std[l]), "ccd_area_mean": float(area_mean[l]),
                   "ccd_area_std": float(area_std[l]), "utterances": count,
                   "run": run.config.name})
  paths["ccd"] = plots.ccd_by_layer(series, f"CCD per layer ({count} utterances of "
                                    f"{runs[0].data.split})", os.path.join(out_dir, "ccd.png"))
  paths["table"] = tables.write_table(rows, os.path.join(out_dir, "ccd"),
                                      title="Cumulative contribution diagonality per layer").md
  return {"paths": paths, "rows": rows}


# ----------------------------------------------------------------------------- windows
def efficient_layout(table: list[dict]) -> str:
  """'3x(4*full) 1x(4*local(5)) ...' from the window table (equal consecutive layers merged)."""
  return layout_lib.format_layout(tuple(
      (layout_lib.HeadGroup(layout_lib.FullHeads() if row["attention"] == "full"
                            else layout_lib.LocalHeads(row["window"]), row["heads"]),)
      for row in table))


def window_table(stats: ContributionStats, layout, full_cl_threshold: float,
                 full_layers=None) -> list[dict]:
  """Table 1 of the paper: per layer μ ± σ of the selected windows, w^l, CL(l, w^l) ± std, and
  the attention the efficient model uses (full where CL exceeds the threshold, or the layers
  given explicitly)."""
  table = []
  for l, windows in enumerate(stats.windows):
    mean, std, window = diag.window_from_samples(windows)
    cl_mean, cl_std = stats.contribution_loss(l, window)
    full = (l + 1 in full_layers) if full_layers else cl_mean > full_cl_threshold
    table.append({"layer": l + 1, "mu": round(mean, 2), "sigma": round(std, 2),
                  "window": window, "cl_mean": round(cl_mean, 4), "cl_std": round(cl_std, 4),
                  "attention": "full" if full else f"local({window})",
                  "heads": sum(g.num_heads for g in layout[l])})
  return table


def write_efficient_config(run: internals.Run, table: list[dict], path: str, command: str,
                           count: int) -> str:
  """A config file that run.py trains as is: the analysed run's config with the efficient
  encoder layout (and a new name); the window table is in its docstring."""
  config = json.loads(run.config.to_json_best_effort())
  layout = efficient_layout(table)
  layout_lib.parse_layout(layout, len(table), config["model"]["encoder_heads"])   # validates
  name = f"{config['name']}_windows"
  rows = "\n".join(f"  layer {r['layer']:2d}: mu {r['mu']:6.2f} +- {r['sigma']:5.2f}  w {r['window']:3d}"
                   f"  CL {r['cl_mean']:.3f} +- {r['cl_std']:.3f}  -> {r['attention']}"
                   for r in table)
  text = f'''"""Efficient model chosen by window selection (Alastruey et al. 2022, Algorithm 1).

Generated {datetime.date.today().isoformat()} by
  {command}
from {_source(run, count)}.

{rows}

Layout: {layout}

Run:  python run.py --config={path} --workdir=runs/{name}
      (variants and key=value after a colon, as every config: {path}:train.seed=2)
"""

import json

import ml_collections

from multiformer_jax import schema

ANALYSED_CONFIG = json.loads({json.dumps(json.dumps(config, indent=1))})
ENCODER_LAYOUT = {layout!r}


def get_config(arg=None):
  config = ml_collections.ConfigDict(ANALYSED_CONFIG)
  config.name = {name!r}
  config.model.encoder_layout = ENCODER_LAYOUT
  config.reported = schema.base_config().reported     # no published figure
  return schema.apply_arg(config, arg)
'''
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return path


def select_windows(run: internals.Run, out_dir: str, num_utterances: int = 400,
                   batch_size: int = 8, seed: int = 0, threshold: float = 0.01,
                   patience_fraction: float = 0.1,
                   full_cl_threshold: float = DEFAULT_FULL_CL_THRESHOLD, full_layers=None,
                   config_out: str | None = None, example: int = -1, command: str = "",
                   progress: bool = True, residual: bool = True) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  stats, matrices, index = collect_contributions(run, num_utterances, batch_size, seed, example,
                                                 threshold, patience_fraction, progress,
                                                 residual)
  count = stats.count
  table = window_table(stats, run.layout, full_cl_threshold, full_layers)
  paths = {"table": tables.write_table(
      table, os.path.join(out_dir, f"windows_{run.stage}"),
      title=f"Window selection: {_source(run, count)}, t={threshold}, "
            f"patience N*{patience_fraction}").md,
           "windows": plots.window_sizes(table, os.path.join(out_dir,
                                                             f"windows_{run.stage}.png")),
           "contributions": plots.contribution_matrices(
               matrices, f"{run.stage.upper()} contributions with the selected windows, "
               f"utterance {run.data.ids[index]} (main diagonal hidden)",
               os.path.join(out_dir, f"contributions_windows_{run.stage}.png"), True,
               [None if r["attention"] == "full" else r["window"] for r in table])}
  config_out = config_out or os.path.join(out_dir, f"{run.config.name}_windows.py")
  paths["config"] = write_efficient_config(run, table, config_out, command, count)
  return {"paths": paths, "table": table, "layout": efficient_layout(table)}


# ----------------------------------------------------------------------------- selection
def analyze_selection(run: internals.Run, out_dir: str) -> dict:
  """Per stack (encoder, decoder self-attention) of a head-selection model: the selected heads
  per task and layer, heads shared between tasks, load per head; tables of the selection and
  of the kinds each task uses."""
  stacks = selection_lib.stacks(run.model.config, run.params)
  if not stacks:
    raise ValueError(f"{run.config.name} selects no heads (model.encoder_candidates and "
                     f"model.decoder_candidates are 0): nothing to analyse")
  os.makedirs(out_dir, exist_ok=True)
  source = f"{run.config.name}, {run.stage} {run.checkpoint}"
  paths, kinds, names_by_stack = {}, {}, {}
  for stack, info in stacks.items():
    masks, labels = info["masks"], info["labels"]
    names = names_by_stack[stack] = run.task_names(stack)
    base = os.path.join(out_dir, f"{run.stage}_{stack}")
    paths[f"{stack}_selected"] = plots.selected_heads(
        masks, labels, names, f"{stack} heads selected per task ({source})",
        base + "_selected.png")
    paths[f"{stack}_shared"] = plots.shared_heads(
        selection_lib.shared_heads(masks), names,
        f"{stack}: share of a task's heads also used by another", base + "_shared.png")
    paths[f"{stack}_load"] = plots.head_load(
        selection_lib.head_load(masks), labels, len(names),
        f"{stack}: tasks using each head", base + "_load.png")
    paths[f"{stack}_table"] = tables.write_table(
        selection_lib.selection_rows(masks, labels, names), base + "_selection",
        title=f"Heads selected at inference ({stack}, {source})").md
    kinds[stack] = selection_lib.kinds_per_task(masks, labels, names)
    paths[f"{stack}_kinds"] = tables.write_table(
        kinds[stack], base + "_kinds", title=f"Selected heads per kind ({stack}, {source})").md
  drift = selection_lib.drift_rows(stacks, selection_lib.stacks(
      run.model.config, initial_selection_params(run)), run.stage)
  paths["drift"] = tables.write_table(
      drift, os.path.join(out_dir, f"{run.stage}_drift"),
      title=f"Selection logits against their initial values ({source})").md
  return {"paths": paths, "kinds": kinds, "tasks": names_by_stack, "drift": drift}


def initial_selection_params(run: internals.Run):
  """The initial parameters of the run's selection logits, re-drawn from its seed. The ST
  encoder starts from the ASR encoder when the run trained ASR first, so its initial encoder
  logits are the ASR stage's."""
  initial = experiment.initial_params(run.model, experiment.stage_key(run.config, run.stage))
  if run.stage == "st" and "asr" in run.config.train.stages:
    asr_start = experiment.initial_params(run.model, experiment.stage_key(run.config, "asr"))
    initial = {**initial, "encoder": asr_start["encoder"]}
  return initial


# ----------------------------------------------------------------------------- CLI
def _common(parser):
  parser.add_argument("--workdir", required=True, help="a run directory written by run.py")
  parser.add_argument("--split", default=None, help="default: the config's data.dev_split")
  parser.add_argument("--checkpoint", default="best", choices=sections.SELECTIONS)
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


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  heads = sub.add_parser("heads", help="W_o / W_v per head and head output-norm shares")
  _common(heads)
  heads.add_argument("--stage", default="st", choices=("asr", "st"))
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
  windows.add_argument("--full_cl_threshold", type=float, default=DEFAULT_FULL_CL_THRESHOLD,
                       help="layers whose CL(l, w^l) exceeds this keep full attention")
  windows.add_argument("--full_layers", type=int, nargs="*", default=None,
                       help="1-based layers that keep full attention (overrides the threshold)")
  windows.add_argument("--config_out", default=None, help="default: {out}/{name}_windows.py")
  _contribution_options(windows)
  selection = sub.add_parser("selection", help="heads selected per task, sharing, load")
  _common(selection)
  selection.add_argument("--stage", default="st", choices=("asr", "st"))
  args = parser.parse_args(argv)
  if args.num_utterances < 1 or args.batch_size < 1:
    parser.error(f"--num_utterances ({args.num_utterances}) and --batch_size "
                 f"({args.batch_size}) must be >= 1")
  load = lambda stage: internals.load_run(args.workdir, stage, args.split, args.checkpoint,
                                          args.average_last)
  common = dict(num_utterances=args.num_utterances, batch_size=args.batch_size, seed=args.seed,
                progress=not args.no_progress)
  if args.command == "selection":
    result = analyze_selection(load(args.stage), args.out)
    for stack, rows in result["kinds"].items():
      print(stack, "kinds per task:", rows)
    for row in result["drift"]:
      print(row)
    print(json.dumps(result["paths"], indent=1))
    return
  if schema.load_config(args.workdir).model.get("encoder_candidates"):
    raise SystemExit(f"{args.command}: the per-head W_o and contribution analyses need every "
                     f"head to own its W_o rows; in a head-selection model the W_o slots are "
                     f"shared by candidates. Use: python -m multiformer_jax.analyze selection")
  if args.command == "heads":
    result = analyze_heads(load(args.stage), args.out, **common)
  elif args.command == "contributions":
    runs = [internals.load_run(workdir, stage, args.split, args.checkpoint, args.average_last)
            for workdir in [args.workdir] + args.compare for stage in args.stages]
    result = analyze_contributions(runs, args.out,
                                   example=args.example, hide_diagonal=not args.show_diagonal,
                                   residual=not args.no_residual, **common)
  else:
    result = select_windows(load(args.stage), args.out, threshold=args.threshold,
                            patience_fraction=args.patience,
                            full_cl_threshold=args.full_cl_threshold,
                            full_layers=args.full_layers, config_out=args.config_out,
                            example=args.example, residual=not args.no_residual,
                            command="python -m multiformer_jax.analyze " + " ".join(
                                argv if argv is not None else sys.argv[1:]), **common)
    with open(result["paths"]["table"], encoding="utf-8") as f:
      print(f.read())
    print("layout:", result["layout"])
  print(json.dumps(result["paths"], indent=1))


# The command line and console script: the process set up, user errors -> their message and
# exit status 2.
cli = process_setup.command(cli_errors.command_line_entry(main))


if __name__ == "__main__":
  cli()
