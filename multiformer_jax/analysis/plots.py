"""PNG figures of the analyses (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position


def _grid(count: int, width: float = 3.2, height: float = 2.6):
  cols = min(count, 4)
  rows = math.ceil(count / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
  for ax in axes.ravel()[count:]:
    ax.set_visible(False)
  return fig, axes.ravel()


def _save(fig, path: str):
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def head_weight_distributions(blocks_per_layer, labels_per_layer, matrix: str, path: str):
  """Thesis figures 21-22: per layer, the distribution of each head's weights in `matrix`."""
  fig, axes = _grid(len(blocks_per_layer))
  for layer, (blocks, labels, ax) in enumerate(zip(blocks_per_layer, labels_per_layer, axes)):
    values = [b.ravel() for b in blocks[matrix]]
    parts = ax.violinplot(values, showmedians=True, showextrema=False)
    for body in parts["bodies"]:
      body.set_alpha(0.6)
    ax.set_xticks(range(1, len(values) + 1),
                  [f"{h + 1}\n{label}" for h, label in enumerate(labels)], fontsize=7)
    ax.set_title(f"layer {layer + 1}: {matrix} per head", fontsize=9)
    ax.axhline(0, color="grey", lw=0.5)
  return _save(fig, path)


def head_heatmap(shares: np.ndarray, labels_per_layer, title: str, path: str):
  """layers x heads heatmap, each cell annotated with the head's kind and share."""
  layers, heads = shares.shape
  fig, ax = plt.subplots(figsize=(1.6 * heads + 2, 0.55 * layers + 1.5))
  image = ax.imshow(shares, cmap="viridis", aspect="auto", vmin=0)
  for l in range(layers):
    for h in range(heads):
      bright = shares[l, h] > shares.max() * 0.6
      ax.text(h, l, f"{labels_per_layer[l][h]}\n{shares[l, h]:.3f}", ha="center",
              va="center", fontsize=6.5, color="black" if bright else "white")
  ax.set_xticks(range(heads), [f"head {h + 1}" for h in range(heads)])
  ax.set_yticks(range(layers), [f"layer {l + 1}" for l in range(layers)])
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, fraction=0.04)
  return _save(fig, path)


def contribution_matrices(matrices, title: str, path: str, hide_diagonal: bool = False,
                          windows=None):
  """Paper figures 4-5: one heatmap per layer (rows: outputs i, columns: inputs j), rows
  normalised; the main diagonal optionally hidden; local windows optionally outlined."""
  fig, axes = _grid(len(matrices), 3.0, 3.0)
  for layer, (c, ax) in enumerate(zip(matrices, axes)):
    c = c / np.maximum(c.sum(axis=1, keepdims=True), 1e-30)
    if hide_diagonal:
      c = c.copy()
      np.fill_diagonal(c, np.nan)
    ax.imshow(c, cmap="Blues", interpolation="nearest")
    n = c.shape[0]
    if windows is not None and windows[layer]:
      r = windows[layer] // 2
      ax.plot(np.arange(n), np.clip(np.arange(n) - r, 0, n - 1), color="red", lw=0.6)
      ax.plot(np.arange(n), np.clip(np.arange(n) + r, 0, n - 1), color="red", lw=0.6)
      ax.set_title(f"layer {layer + 1} (w={windows[layer]})", fontsize=9)
    else:
      ax.set_title(f"layer {layer + 1}", fontsize=9)
    ax.set_xlabel("input token j", fontsize=7)
    ax.set_ylabel("output token i", fontsize=7)
    ax.tick_params(labelsize=6)
  fig.suptitle(title, fontsize=10)
  return _save(fig, path)


def diagonality_curves(curves, title: str, path: str):
  """Paper figure 2: D(w, l) against w for every layer of one utterance."""
  fig, ax = plt.subplots(figsize=(6, 4))
  colours = plt.cm.viridis(np.linspace(0, 1, len(curves)))
  for layer, (curve, colour) in enumerate(zip(curves, colours)):
    ax.plot(np.arange(1, len(curve) + 1), curve, color=colour, label=f"layer {layer + 1}")
  ax.set_xscale("log")
  ax.set_xlabel("window w (tokens)")
  ax.set_ylabel("D(w, l)")
  ax.set_ylim(0, 1.02)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=6, ncol=2)
  return _save(fig, path)


def ccd_by_layer(series: dict, title: str, path: str):
  """Paper figure 3: CCD per layer, one line per stage (ASR dashed, ST solid), ± std band.

  series: {label: (mean [layers], std [layers])}."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, (mean, std) in series.items():
    layers = np.arange(1, len(mean) + 1)
    style = "--" if label.lower().startswith("asr") else "-"
    ax.plot(layers, mean, style, marker="o", label=label)
    ax.fill_between(layers, np.asarray(mean) - std, np.asarray(mean) + std, alpha=0.15)
  ax.set_xlabel("encoder layer")
  ax.set_ylabel("CCD")
  ax.set_xticks(np.arange(1, len(next(iter(series.values()))[0]) + 1))
  ax.set_title(title, fontsize=10)
  ax.legend()
  return _save(fig, path)


def window_sizes(table, path: str):
  """Per layer: selected window w^l (bars) and CL(l, w^l) ± std (line, right axis)."""
  layers = np.arange(1, len(table) + 1)
  fig, ax = plt.subplots(figsize=(6, 3.5))
  colours = ["tab:grey" if row["attention"] == "full" else "tab:blue" for row in table]
  ax.bar(layers, [row["window"] for row in table], color=colours)
  ax.set_xlabel("encoder layer (grey: kept full)")
  ax.set_ylabel("window w^l")
  ax.set_xticks(layers)
  right = ax.twinx()
  right.errorbar(layers, [row["cl_mean"] for row in table], [row["cl_std"] for row in table],
                 color="tab:red", marker="o", capsize=3)
  right.set_ylabel("CL(l, w^l)", color="tab:red")
  ax.set_title("window selection (Algorithm 1)", fontsize=10)
  return _save(fig, path)


def selected_heads(masks: np.ndarray, labels, task_names, title: str, path: str):
  """Per task a layers x candidates grid, the selected heads filled, each cell's kind written."""
  tasks, layers, candidates = masks.shape
  fig, axes = _grid(tasks, width=0.55 * candidates + 1.6, height=0.38 * layers + 1.2)
  for t, ax in enumerate(axes[:tasks]):
    ax.imshow(masks[t], cmap="Blues", vmin=0, vmax=1.4, aspect="auto")
    for l in range(layers):
      for h in range(candidates):
        ax.text(h, l, labels[l][h].split("(")[0][:4], ha="center", va="center", fontsize=5.5,
                color="white" if masks[t, l, h] else "grey")
    ax.set_xticks(range(candidates), [str(h + 1) for h in range(candidates)], fontsize=7)
    ax.set_yticks(range(layers), [str(l + 1) for l in range(layers)], fontsize=7)
    ax.set_xlabel("candidate head", fontsize=7)
    ax.set_ylabel("layer", fontsize=7)
    ax.set_title(f"{task_names[t]}", fontsize=9)
  fig.suptitle(title, fontsize=10)
  return _save(fig, path)


def shared_heads(matrix: np.ndarray, task_names, title: str, path: str):
  """tasks x tasks: the fraction of a task's selected heads another task also selects."""
  n = len(task_names)
  fig, ax = plt.subplots(figsize=(0.7 * n + 2.5, 0.6 * n + 2))
  image = ax.imshow(matrix, cmap="viridis", vmin=0, vmax=1)
  for a in range(n):
    for b in range(n):
      ax.text(b, a, f"{matrix[a, b]:.2f}", ha="center", va="center", fontsize=7,
              color="black" if matrix[a, b] > 0.6 else "white")
  ax.set_xticks(range(n), task_names, rotation=45, fontsize=8)
  ax.set_yticks(range(n), task_names, fontsize=8)
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, fraction=0.04)
  return _save(fig, path)


def head_load(load: np.ndarray, labels, num_tasks: int, title: str, path: str):
  """layers x candidates: how many tasks use each head."""
  layers, candidates = load.shape
  fig, ax = plt.subplots(figsize=(0.7 * candidates + 2.5, 0.45 * layers + 1.5))
  image = ax.imshow(load, cmap="magma", vmin=0, vmax=num_tasks, aspect="auto")
  for l in range(layers):
    for h in range(candidates):
      ax.text(h, l, f"{labels[l][h].split('(')[0][:4]}\n{int(load[l, h])}", ha="center",
              va="center", fontsize=6, color="white" if load[l, h] < num_tasks * 0.6 else "black")
  ax.set_xticks(range(candidates), [str(h + 1) for h in range(candidates)])
  ax.set_yticks(range(layers), [f"layer {l + 1}" for l in range(layers)])
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, fraction=0.04, label="tasks using the head")
  return _save(fig, path)
