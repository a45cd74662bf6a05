"""A trained stage of a run, loaded one way for everything that reads it (evaluate, translate,
the analyses): its task keys, its model (the vocabulary, tasks and stage-dependent parts such as
the CTC head and the stacked text encoder, as training built it) and a checkpoint selection's
parameters."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from multiformer_common.errors import MissingInput
from multiformer_jax.data.input_pipeline import SPEECH_STAGES, TaskKey
from multiformer_jax.experiment import model_config_for, task_keys
from multiformer_jax.model import S2TModel
from multiformer_jax.runtime import checkpoints as ckpt_lib


@dataclasses.dataclass
class TrainedStage:
  model: S2TModel
  params: dict               # device arrays
  checkpoint: str            # which checkpoint(s): e.g. "average of 10 (updates 9100-10000)"
  tasks: dict[str, TaskKey] | None


def checkpoints_dir(workdir: str, stage: str) -> str:
  """The stage's checkpoint directory; FileNotFoundError naming the stages that have one."""
  directory = os.path.join(workdir, stage, "checkpoints")
  if not os.path.isdir(directory):
    stages = [s for s in SPEECH_STAGES if os.path.isdir(os.path.join(workdir, s, "checkpoints"))]
    raise MissingInput(f"{workdir} has no {stage} checkpoints ({directory}); stages with "
                            f"checkpoints: {stages or 'none'}")
  return directory


def load_trained_stage(workdir: str, config, stage: str, vocab_size: int, checkpoint: str,
                       averaged: int, dtype: str | None = None) -> TrainedStage:
  """`stage` of the run in `workdir` (its saved `config`), with a decoder vocabulary of
  `vocab_size`: the model, and the parameters of `checkpoint` (latest | best | average |
  around_best, averaging `averaged`). `dtype` replaces model.dtype (the analyses: float32)."""
  directory = checkpoints_dir(workdir, stage)
  tasks = task_keys(config, stage)
  model_config = model_config_for(config, vocab_size, tasks, stage)
  if dtype is not None:
    model_config = dataclasses.replace(model_config, dtype=dtype)
  params, which = ckpt_lib.StageCheckpoints(directory).select_params(checkpoint, averaged)
  return TrainedStage(S2TModel(model_config), jax.tree_util.tree_map(jnp.asarray, params),
                      which, tasks)
