"""How a multi-task model's task ids are read from a split (TaskKey) and from a batch
(batch_tasks).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from multiformer_jax.data.prepared import SplitData


@dataclasses.dataclass(frozen=True)
class TaskKey:
  """How one stack's task ids are read: the tag column and the task names in id order."""
  field: str
  names: tuple[str, ...]

  def ids(self, data: SplitData) -> np.ndarray:
    """[rows] the task id of each row of `data` (-1: a value with no task)."""
    position = {name: i for i, name in enumerate(self.names)}
    return np.array([position.get(str(v), -1) for v in data.tag_values[self.field]], np.int32)


def batch_tasks(batch):
  """(encoder task ids, decoder task ids) [batch] each of a multi-task batch (None for a stack
  without a task key), or None for a one-task model. The model clips ids into its task range,
  so a padding row's id does not matter."""
  if "encoder_task" not in batch and "decoder_task" not in batch:
    return None
  return batch.get("encoder_task"), batch.get("decoder_task")
