"""What the analyses read from a trained run: the model, the parameters of a checkpoint, a
random sample of utterances, and per encoder layer the internals of the attention block.

Everything is evaluation mode (no dropout, fixed kernel features) and float32, whatever
`model.dtype` the run trained with, so the decompositions are exact.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from multiformer_common.progress import progress_bar
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.analysis import contributions as contrib
from multiformer_jax.model import S2TModel
from multiformer_jax.evaluation.trained_stage import checkpoints_dir, load_trained_stage
from multiformer_jax.experiment import known_task_rows, pipeline_config
from multiformer_jax import schema


@dataclasses.dataclass
class Run:
  """One stage of a trained run, ready to analyse."""
  config: object           # the run's saved ml_collections config
  stage: str
  model: S2TModel
  params: dict
  checkpoint: str          # which checkpoint (description)
  data: ip.SplitData
  batcher: ip.Batcher
  tasks: dict | None = None  # {'encoder' | 'decoder': TaskKey} of a multi-task model

  def task_names(self, stack: str) -> list[str]:
    """The task names of the encoder or decoder in id order (['all'] for one task)."""
    key = (self.tasks or {}).get(stack)
    return list(key.names) if key else ["all"]

  @property
  def layout(self):
    return self.model.config.layout

  def describe(self, count: int) -> str:
    """'s2t_v2, st best, 100 utterances of dev': what an analysis's figures were made from."""
    return (f"{self.config.name}, {self.stage} {self.checkpoint}, {count} utterances of "
            f"{self.data.split}")


def load_run(workdir: str, stage: str, split: str | None = None, checkpoint: str = "best",
             average_last: int = 10) -> Run:
  """The run's config, a checkpoint of `stage` (latest | best | average | around_best) and a
  split."""
  config = schema.load_config(workdir)
  checkpoints_dir(workdir, stage)          # named before the split is read
  data = ip.SplitData(pipeline_config(config, stage, "test"), split or config.data.dev_split)
  trained = load_trained_stage(workdir, config, stage, data.vocab.size, checkpoint,
                               average_last, dtype="float32")
  data, _ = known_task_rows(data, trained.tasks)
  return Run(config, stage, trained.model, trained.params, trained.checkpoint, data,
             ip.Batcher(data, False, tasks=trained.tasks), trained.tasks)


def sample_utterances(data: ip.SplitData, count: int, seed: int = 0) -> np.ndarray:
  """`count` random utterance indices of the split (all of them if it has fewer), sorted by
  length so that batches waste little padding."""
  rng = np.random.default_rng(seed)
  chosen = rng.choice(len(data), size=min(count, len(data)), replace=False)
  return chosen[np.argsort(data.n_frames[chosen], kind="stable")]


def batches(batcher: ip.Batcher, indices: np.ndarray, batch_size: int) -> Iterator[dict]:
  """Batches of the chosen utterances, each padded to its longest member's bucket (so a run
  compiles at most one program per bucket)."""
  for start in range(0, len(indices), batch_size):
    chunk = indices[start:start + batch_size]
    bucket = int(batcher.bucket_of[chunk].max())
    yield batcher.assemble(bucket, np.pad(chunk, (0, batch_size - len(chunk)),
                                          constant_values=-1), 0)


def _layer_internals(model: S2TModel, features, lengths, with_contributions: bool,
                     residual: bool):
  """Per encoder layer: head output norms and (optionally) the contribution matrix."""
  encoder = model.encoder
  x, mask = encoder.embed(features, lengths)
  layers = []
  for layer in encoder.layers:
    attn = layer.self_attn
    ln_x = layer.self_attn_layer_norm(x)
    z = attn.heads_output(ln_x, mask)                                  # [b, n, H, hd]
    out = {"head_norms": contrib.head_output_norms(
        z, attn.out_proj.variables["params"]["kernel"])}                # [b, n, H]
    if with_contributions:
      mixing, values, _ = contrib.attention_taps(attn, ln_x, mask)
      out["contributions"] = contrib.contribution_matrix(mixing, values, x, mask,
                                                         residual)        # [b, n, n]
    layers.append(out)
    x = layer(x, mask)
  return mask, layers


def make_internals_fn(model: S2TModel, with_contributions: bool, residual: bool = True):
  """-> jitted fn(params, features, lengths) -> (mask [b, n], [per layer dict])."""
  def fn(params, features, lengths):
    return nn.apply(_layer_internals, model)({"params": params}, features, lengths,
                                             with_contributions, residual)
  return jax.jit(fn)


def per_utterance(run: Run, indices: np.ndarray, batch_size: int, with_contributions: bool,
                  progress: bool = True, residual: bool = True) -> Iterator[tuple]:
  """For the utterances `indices` (see sample_utterances), yields (utterance index,
  [per layer dict of numpy arrays cut to the valid tokens])."""
  internals = make_internals_fn(run.model, with_contributions, residual)
  bar = progress_bar(total=len(indices), desc=f"{run.stage} {run.data.split}", unit="utt",
                     disable=not progress)
  for batch in batches(run.batcher, indices, batch_size):
    mask, layers = jax.device_get(internals(run.params, jnp.asarray(batch["features"]),
                                            jnp.asarray(batch["lengths"])))
    for row, index in enumerate(batch["index"]):
      if index < 0:
        continue
      n = int(mask[row].sum())
      cut = []
      for layer in layers:
        item = {"head_norms": layer["head_norms"][row, :n]}
        if with_contributions:
          item["contributions"] = layer["contributions"][row, :n, :n]
        cut.append(item)
      bar.update(1)
      yield int(index), cut
  bar.close()
