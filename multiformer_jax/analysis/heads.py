"""Per-head analysis of the encoder self-attention (Multiformer thesis §4.3, figures 21-22).

Head h of a layer owns channels [h*hd, (h+1)*hd) of q/k/v (config order = channel order), so
it owns those *rows* of W_o (flax kernels are [in, out]) and those *columns* of W_v. A head
whose W_o rows sit near zero contributes little to the layer output; the thesis read its
redesigns off these distributions. The output-norm share measures the same thing on data:
‖z_{t,h} W_o^(h)‖₁ normalised over the heads of the position, median over positions, then
median over utterances.
"""

from __future__ import annotations

import os

import numpy as np

from multiformer_jax.analysis import internals, plots
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.runtime import tables


def head_labels(layer_layout: layout_lib.LayerLayout) -> list[str]:
  """One label per head of a layer, e.g. ['local(65)', 'conv(5,2)', 'conv(5,2)', ...]."""
  return [str(kind) for kind in layout_lib.layer_head_kinds(layer_layout)]


def encoder_attention_params(params, layer: int):
  return params["encoder"][f"layers_{layer}"]["self_attn"]


def head_weight_blocks(params, layer: int, num_heads: int) -> dict[str, np.ndarray]:
  """{'W_o': [H, hd, d] rows of W_o per head, 'W_v': [H, d, hd] columns of W_v per head}."""
  attn = encoder_attention_params(params, layer)
  w_o = np.asarray(attn["out_proj"]["kernel"], np.float32)      # [H*hd, d]
  w_v = np.asarray(attn["v_proj"]["kernel"], np.float32)        # [d, H*hd]
  d_model = w_o.shape[1]
  head_dim = w_o.shape[0] // num_heads
  return {"W_o": w_o.reshape(num_heads, head_dim, d_model),
          "W_v": np.moveaxis(w_v.reshape(d_model, num_heads, head_dim), 1, 0)}


def layer_weight_blocks(params, layout: layout_lib.Layout) -> list[dict[str, np.ndarray]]:
  """head_weight_blocks of every encoder layer."""
  return [head_weight_blocks(params, layer, sum(g.num_heads for g in layer_layout))
          for layer, layer_layout in enumerate(layout)]


def weight_norm_shares(blocks_per_layer) -> dict[str, np.ndarray]:
  """{'W_o' | 'W_v': [layers, H]} each head's Frobenius norm over the layer's total (a
  data-free companion of the output-norm share). blocks_per_layer: layer_weight_blocks."""
  shares = {"W_o": [], "W_v": []}
  for blocks in blocks_per_layer:
    for name, block in blocks.items():
      norms = np.sqrt((block.reshape(block.shape[0], -1) ** 2).sum(axis=1))
      shares[name].append(norms / norms.sum())
  return {name: np.stack(rows) for name, rows in shares.items()}


def utterance_head_shares(head_norms: np.ndarray) -> np.ndarray:
  """head_norms [n, H] of one utterance -> [H]: shares over heads per position, median over
  positions."""
  shares = head_norms / np.maximum(head_norms.sum(axis=1, keepdims=True), 1e-30)
  return np.median(shares, axis=0)


class HeadShareAccumulator:
  """Collects per-utterance head shares; `result()` is [layers, H], the median over utterances."""

  def __init__(self):
    self.per_layer: list[list[np.ndarray]] = []

  def add(self, layers: list[dict]):
    if not self.per_layer:
      self.per_layer = [[] for _ in layers]
    for rows, layer in zip(self.per_layer, layers):
      rows.append(utterance_head_shares(layer["head_norms"]))

  def result(self) -> np.ndarray:
    return np.stack([np.median(np.stack(rows), axis=0) for rows in self.per_layer])


def analyze_heads(run: internals.Run, out_dir: str, num_utterances: int = 100,
                  batch_size: int = 8, seed: int = 0, progress: bool = True) -> dict:
  """W_o rows and W_v columns per head; output-norm share per head. Returns paths and arrays."""
  os.makedirs(out_dir, exist_ok=True)
  layout = run.layout
  labels = [head_labels(layer) for layer in layout]
  blocks = layer_weight_blocks(run.params, layout)
  accumulator = HeadShareAccumulator()
  chosen = internals.sample_utterances(run.data, num_utterances, seed)
  count = len(chosen)
  for _, layers in internals.per_utterance(run, chosen, batch_size, False, progress):
    accumulator.add(layers)
  output_share = accumulator.result()
  weight_share = weight_norm_shares(blocks)
  tag = run.stage
  paths = {
      "W_o": plots.head_weight_distributions(blocks, labels, "W_o",
                                             os.path.join(out_dir, f"head_weights_W_o_{tag}.png")),
      "W_v": plots.head_weight_distributions(blocks, labels, "W_v",
                                             os.path.join(out_dir, f"head_weights_W_v_{tag}.png")),
      "output_share": plots.head_heatmap(
          output_share, labels, f"head output-norm share ({run.describe(count)})",
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
                                      title=f"Head analysis: {run.describe(count)}").md
  return {"paths": paths, "output_share": output_share, "rows": rows}
