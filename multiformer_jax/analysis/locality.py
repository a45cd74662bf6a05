"""The locality paper's analyses of a trained run (Alastruey et al. 2022): Pre-LN token
contributions per layer with their diagonality D(w, l) and CCD (figures 2-5), and Algorithm 1's
window selection with the efficient model it gives (Table 1), as a config run.py trains as is.
The decomposition is contributions.py, the diagonality and the window rule diagonality.py.
"""

from __future__ import annotations

import datetime
import json
import os

import numpy as np

from multiformer_jax.analysis import diagonality as diag
from multiformer_jax.analysis import internals, plots
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.runtime import tables

DEFAULT_FULL_CL_THRESHOLD = 0.25


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
from {run.describe(count)}.

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
      title=f"Window selection: {run.describe(count)}, t={threshold}, "
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
