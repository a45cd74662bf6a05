"""What a head-selection model learned: which candidate heads each task uses in each layer.

Data-free: read off the selection logits of a checkpoint with the inference rule (top-H or
per-group argmax; multiformer_jax.model.head_selection.select). For heterogeneous candidates the
kinds a task selects are the automatic counterpart of the thesis's W_o-driven layout redesign.
"""

from __future__ import annotations

import collections
import os

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_jax import experiment
from multiformer_jax.analysis import internals, plots
from multiformer_jax.model import head_selection
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.runtime import tables


def selection_masks(logits: np.ndarray, num_heads: int, strategy: str) -> np.ndarray:
  """logits [tasks, layers, H'] -> bool [tasks, layers, H']: the heads used at inference."""
  indices, _ = head_selection.select(np.asarray(logits), num_heads, strategy)
  masks = np.zeros(np.shape(logits), bool)
  np.put_along_axis(masks, np.asarray(indices), True, axis=-1)
  return masks


def stacks(model_config, params) -> dict[str, dict]:
  """{'encoder' | 'decoder': {'masks': [tasks, layers, H'], 'labels': per layer the candidate
  kinds, 'logits'}} for each stack that selects heads."""
  out = {}
  if model_config.encoder_candidates:
    logits = np.asarray(params["encoder"]["head_selector"]["logits"])
    labels = [[str(k) for k in layout_lib.layer_head_kinds(layer)]
              for layer in model_config.layout]
    out["encoder"] = {"logits": logits, "labels": labels, "masks": selection_masks(
        logits, model_config.encoder_heads, model_config.selection_strategy)}
  if model_config.decoder_candidates:
    logits = np.asarray(params["decoder"]["head_selector"]["logits"])
    labels = [["full"] * model_config.decoder_candidates] * model_config.decoder_layers
    out["decoder"] = {"logits": logits, "labels": labels, "masks": selection_masks(
        logits, model_config.decoder_heads, model_config.selection_strategy)}
  return out


def shared_heads(masks: np.ndarray) -> np.ndarray:
  """[tasks, tasks]: the fraction of task a's selected heads (all layers) that task b also
  selects (paper figure 3: how much two tasks share)."""
  flat = masks.reshape(masks.shape[0], -1).astype(float)
  return (flat @ flat.T) / np.maximum(flat.sum(1, keepdims=True), 1)


def head_load(masks: np.ndarray) -> np.ndarray:
  """[layers, H']: how many tasks use each candidate head (paper figure 4)."""
  return masks.sum(0)


def kinds_per_task(masks: np.ndarray, labels, task_names) -> list[dict]:
  """Rows {task, kind: selected heads of that kind over all layers}."""
  kinds = sorted({label.split("(")[0] for layer in labels for label in layer})
  rows = []
  for t, name in enumerate(task_names):
    counts = collections.Counter(labels[l][h].split("(")[0]
                                 for l, h in zip(*np.nonzero(masks[t])))
    rows.append({"task": name, **{kind: counts.get(kind, 0) for kind in kinds}})
  return rows


def selection_rows(masks: np.ndarray, labels, task_names) -> list[dict]:
  """Rows {task, layer, selected: 'h (kind) ...'} of the inference-time selection."""
  rows = []
  for t, name in enumerate(task_names):
    for l in range(masks.shape[1]):
      chosen = np.flatnonzero(masks[t, l])
      rows.append({"task": name, "layer": l + 1,
                   "selected": " ".join(f"{h + 1}:{labels[l][h]}" for h in chosen)})
  return rows


def drift_rows(stacks_now: dict, stacks_initial: dict, stage: str) -> list[dict]:
  """Per stack: how far training moved the logits from their initial values, and the share of
  the heads selected now that the initial (random) logits did not select. A share near 0 means
  the selection is still the random initial one: train longer or raise
  train.selection_lr_multiplier."""
  rows = []
  for stack, info in stacks_now.items():
    start = stacks_initial[stack]
    rows.append({"stage": stage, "stack": stack,
                 "mean_abs_logit_change": float(np.abs(info["logits"] - start["logits"]).mean()),
                 "initial_logit_std": float(start["logits"].std()),
                 "selected_not_selected_at_init": float(
                     1 - (info["masks"] & start["masks"]).sum() / info["masks"].sum())})
  return rows


def analyze_selection(run: internals.Run, out_dir: str) -> dict:
  """Per stack (encoder, decoder self-attention) of a head-selection model: the selected heads
  per task and layer, heads shared between tasks, load per head; tables of the selection and
  of the kinds each task uses."""
  found = stacks(run.model.config, run.params)
  if not found:
    raise InvalidValue(f"{run.config.name} selects no heads (model.encoder_candidates and "
                     f"model.decoder_candidates are 0): nothing to analyse")
  os.makedirs(out_dir, exist_ok=True)
  source = f"{run.config.name}, {run.stage} {run.checkpoint}"
  paths, kinds, names_by_stack = {}, {}, {}
  for stack, info in found.items():
    masks, labels = info["masks"], info["labels"]
    names = names_by_stack[stack] = run.task_names(stack)
    base = os.path.join(out_dir, f"{run.stage}_{stack}")
    paths[f"{stack}_selected"] = plots.selected_heads(
        masks, labels, names, f"{stack} heads selected per task ({source})",
        base + "_selected.png")
    paths[f"{stack}_shared"] = plots.shared_heads(
        shared_heads(masks), names,
        f"{stack}: share of a task's heads also used by another", base + "_shared.png")
    paths[f"{stack}_load"] = plots.head_load(
        head_load(masks), labels, len(names),
        f"{stack}: tasks using each head", base + "_load.png")
    paths[f"{stack}_table"] = tables.write_table(
        selection_rows(masks, labels, names), base + "_selection",
        title=f"Heads selected at inference ({stack}, {source})").md
    kinds[stack] = kinds_per_task(masks, labels, names)
    paths[f"{stack}_kinds"] = tables.write_table(
        kinds[stack], base + "_kinds", title=f"Selected heads per kind ({stack}, {source})").md
  drift = drift_rows(found, stacks(
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
