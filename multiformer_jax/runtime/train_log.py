"""Training logs: python logging, a JSONL file, TensorBoard scalars, a progress bar with ETA."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from multiformer_common.progress import progress_bar

DONE = "DONE.json"   # a stage's summary, written when it finishes: its presence marks it done


def setup_logging(level=logging.INFO):
  root = logging.getLogger("multiformer_jax")
  root.propagate = False        # absl's handler would print every line twice
  try:
    from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
    absl_logging.set_verbosity(absl_logging.WARNING)   # orbax / TFDS chatter
  except ImportError:
    pass
  if not root.handlers:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
  root.setLevel(level)
  return root


class StageLogger:
  """Accumulates step metrics on device, flushes them every `log_every` updates (the host
  sync), and writes `{stage_dir}/log.jsonl` and TensorBoard events in `{stage_dir}/tb`."""

  def __init__(self, stage_dir: str, stage: str, primary: bool = True):
    """primary: this process writes the files (in a multi-process run only process 0 does;
    every process still logs to stderr)."""
    self.log = setup_logging()
    self.stage = stage
    self.dir = stage_dir
    self.jsonl = open(os.path.join(stage_dir, "log.jsonl"), "a", encoding="utf-8") \
        if primary else None
    self.writer = None
    try:
      if primary:
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
        self.writer = SummaryWriter(os.path.join(stage_dir, "tb"))
    except ImportError:
      self.log.warning("tensorboardX not installed: no TensorBoard scalars (JSONL only)")
    self.pending = []
    self.waited = 0.0                 # seconds the loop waited for batches since the last flush
    self.consecutive_nonfinite = 0
    self.skipped_total = 0
    self.bar = None
    self.t0 = self.t_flush = time.time()

  def start(self, step: int, total: int):
    self.bar = progress_bar(total=total, initial=step, desc=self.stage, unit="upd")
    self.t0 = self.t_flush = time.time()
    self.log.info("%s: training from update %d to %d; its programs are compiled first (the "
                  "progress bar's first rate includes that)", self.stage, step, total)

  def accumulate(self, metrics, utterance_ids=None):
    """metrics of one micro-batch (on device); utterance_ids: the ids of every utterance of the
    update it completes (logged if the update turns out non-finite)."""
    self.pending.append((metrics, utterance_ids))

  def data_wait(self, seconds: float):
    """Time the training loop spent waiting for its next batch (input pipeline)."""
    self.waited += seconds

  def flush(self, step: int) -> int:
    """Reads the pending metrics (blocks), logs them; returns consecutive non-finite skips."""
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    if not self.pending:
      return self.consecutive_nonfinite
    values = jax.device_get([m for m, _ in self.pending])
    update_ids = [ids for _, ids in self.pending]
    self.pending = []
    first = lambda x: float(np.asarray(x).reshape(-1)[0])
    skipped_ids = []                   # per skipped update: the ids of its utterances
    for m, ids in zip(values, update_ids):
      if "finite" in m:
        finite = bool(first(m["finite"]))
        self.consecutive_nonfinite = 0 if finite else self.consecutive_nonfinite + 1
        if not finite:
          skipped_ids.append(list(ids or []))
    sums = {}
    for m in values:
      for k in ("loss", "nll", "tokens", "frames", "examples"):
        sums[k] = sums.get(k, 0.0) + first(m[k])
    last = next((m for m in reversed(values) if "grad_norm" in m), {})
    waited, self.waited = self.waited, 0.0
    now = time.time()
    elapsed = now - self.t_flush
    self.t_flush = now
    tokens = max(sums.get("tokens", 0.0), 1.0)
    record = {"stage": self.stage, "step": step, "loss": sums["loss"] / tokens,
              "nll": sums["nll"] / tokens, "lr": first(last.get("lr", 0.0)),
              "grad_norm": first(last.get("grad_norm", 0.0)),
              "frames_per_s": sums["frames"] / max(elapsed, 1e-9),
              "step_time_s": elapsed / max(len([m for m in values if "grad_norm" in m]), 1),
              "data_wait_s": round(waited, 4),
              "data_wait_fraction": round(waited / max(elapsed, 1e-9), 4),
              "skipped_updates": len(skipped_ids)}
    if any("ctc" in m for m in values):  # hybrid CTC/attention: the CTC loss per target token
      record["ctc"] = sum(first(m["ctc"]) for m in values if "ctc" in m) / tokens
    if any("kl" in m for m in values):   # head selection: the token-weighted KL of the samples
      record["selection_kl"] = sum(first(m["kl"]) for m in values if "kl" in m) / tokens
    self.scalars(step, record)
    if self.bar is not None:
      self.bar.n = step
      self.bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                           refresh=True)
    if skipped_ids:
      self.skipped_total += len(skipped_ids)
      self.scalars(step, {"skipped_utterances": json.dumps(skipped_ids),
                          "skipped_total": self.skipped_total})
      self.log.warning("%s step %d: %d update(s) skipped for a non-finite loss or gradient "
                       "(%d skipped so far); their utterances: %s", self.stage, step,
                       len(skipped_ids), self.skipped_total, skipped_ids)
    return self.consecutive_nonfinite

  def scalars(self, step: int, values: dict):
    if self.jsonl is not None:
      self.jsonl.write(json.dumps({"stage": self.stage, "step": step, **{
          k: v for k, v in values.items() if isinstance(v, (int, float, str))}}) + "\n")
      self.jsonl.flush()
    if self.writer is not None:
      for k, v in values.items():
        if isinstance(v, (int, float)) and k != "step":
          self.writer.add_scalar(f"{self.stage}/{k}", v, step)
      self.writer.flush()

  def elapsed(self) -> float:
    return time.time() - self.t0

  def close(self):
    if self.bar is not None:
      self.bar.close()
    if self.jsonl is not None:
      self.jsonl.close()
    if self.writer is not None:
      self.writer.close()
