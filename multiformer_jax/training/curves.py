"""What a run shows a person: each stage's learning curve, and examples next to the scores."""

from __future__ import annotations

import json
import os

from multiformer_jax.evaluation import results


def read_log(stage_dir: str) -> tuple[list[dict], list[dict]]:
  """(training rows, dev rows) of a stage's log.jsonl."""
  train_rows, dev_rows = [], []
  path = os.path.join(stage_dir, "log.jsonl")
  if not os.path.exists(path):
    return train_rows, dev_rows
  with open(path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      if "loss" in row and "step" in row:
        train_rows.append(row)
      elif "dev_loss" in row:
        dev_rows.append(row)
  return train_rows, dev_rows


def plot_learning_curve(stage_dir: str, stage: str) -> str | None:
  """Writes `{stage_dir}/learning_curve.png`: training and dev loss per target token against
  updates and, on a second axis, the dev WER or BLEU at each evaluation when training scored
  the dev split (eval.score_dev), else the dev perplexity; returns its path, or None when
  nothing was logged."""
  train_rows, dev_rows = read_log(stage_dir)
  if not train_rows and not dev_rows:
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  figure, loss_axis = plt.subplots(figsize=(7, 4))
  if train_rows:
    loss_axis.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows],
                   label="train loss", color="tab:blue")
  if dev_rows:
    loss_axis.plot([r["step"] for r in dev_rows], [r["dev_loss"] for r in dev_rows], "o-",
                   label="dev loss", color="tab:orange")
  loss_axis.set_xlabel("updates")
  loss_axis.set_ylabel("loss per target token")
  loss_axis.grid(alpha=0.3)
  loss_axis.legend(loc="upper right")
  second = dev_score_series(dev_rows)
  if second:
    label, steps, values = second
    score_axis = loss_axis.twinx()
    score_axis.plot(steps, values, "s--", color="tab:green", label=label)
    if label == "dev perplexity":
      score_axis.set_yscale("log")
    score_axis.set_ylabel(label)
    score_axis.legend(loc="upper center")
  loss_axis.set_title(f"{stage}: learning curve")
  path = os.path.join(stage_dir, "learning_curve.png")
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  plt.close(figure)
  return path


def dev_score_series(dev_rows: list[dict]) -> tuple[str, list, list] | None:
  """(label, steps, values) of the curve's second axis: dev WER or BLEU where the rows have it
  (eval.score_dev), otherwise dev perplexity; None without dev rows."""
  for key, label in (("dev_wer", "dev WER"), ("dev_bleu", "dev BLEU"),
                     ("dev_ppl", "dev perplexity")):
    rows = [r for r in dev_rows if key in r]
    if rows:
      return label, [r["step"] for r in rows], [r[key] for r in rows]
  return None


def _lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def examples(workdir: str, split: str, config, count: int = 5) -> list[dict]:
  """`count` utterances of a split the run evaluated (with its config's settings), evenly
  spread, with both stages' references and hypotheses: [{id, asr_ref, asr_hyp, st_ref,
  st_hyp}] (a stage not evaluated is left out)."""
  stages = {}
  for stage in ("asr", "st"):
    directory = results.find(workdir, stage, split, config)
    if directory and all(os.path.exists(os.path.join(directory, f))
                         for f in ("ids.txt", "hyp.txt", "ref.txt")):
      ids = _lines(os.path.join(directory, "ids.txt"))
      stages[stage] = dict(zip(ids, zip(_lines(os.path.join(directory, "ref.txt")),
                                        _lines(os.path.join(directory, "hyp.txt")))))
  if not stages:
    return []
  common = sorted(set.intersection(*(set(s) for s in stages.values())))
  chosen = [common[i * len(common) // count] for i in range(min(count, len(common)))]
  rows = []
  for utterance in chosen:
    row = {"id": utterance}
    for stage, by_id in stages.items():
      row[f"{stage}_ref"], row[f"{stage}_hyp"] = by_id[utterance]
    rows.append(row)
  return rows


def format_examples(rows: list[dict]) -> str:
  blocks = []
  for row in rows:
    lines = [f"{row['id']}"]
    for key, label in (("asr_ref", "transcript"), ("asr_hyp", "ASR"), ("st_ref", "translation"),
                       ("st_hyp", "ST")):
      if key in row:
        lines.append(f"  {label:<12}{row[key]}")
    blocks.append("\n".join(lines))
  return "\n".join(blocks)
