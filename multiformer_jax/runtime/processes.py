"""What several JAX processes (one per host, `jax.distributed.initialize`) must decide once and
agree on: the shared preparation is done by process 0 while the others wait, and a choice
that reads the shared disk (which checkpoint to resume from) is made from process 0's view.
With one process each helper is the plain single-process action, with no collective."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np


def single() -> bool:
  return jax.process_count() == 1


def broadcast_int(value: int) -> int:
  """Process 0's `value`, on every process."""
  if single():
    return int(value)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int64)))


def all_true(flag: bool) -> bool:
  """Whether `flag` holds on every process (each process passes its own)."""
  if single():
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(np.all(multihost_utils.process_allgather(np.asarray(bool(flag)))))


def barrier(name: str):
  """Waits until every process reaches the barrier `name`."""
  if not single():
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(name)


def on_first_process(action: Callable[[], None], what: str):
  """Runs `action` on process 0 while the others wait; an error there is raised there and, as
  a RuntimeError naming `what`, on every other process (none waits for ever)."""
  if single():
    action()
    return
  error = None
  if jax.process_index() == 0:
    try:
      action()
    except Exception as caught:  # pylint: disable=broad-except  # raised below, after telling
      error = caught
  failed = broadcast_int(error is not None)
  if error is not None:
    raise error
  if failed:
    raise RuntimeError(f"process 0 failed {what} (its log says why); process "
                       f"{jax.process_index()} stops too")


def client():
  """JAX's distributed key-value store client (the coordination service that
  jax.distributed.initialize started; orbax reaches it the same way)."""
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("several processes but no jax.distributed client")
  return client


def publish(key: str, value: str):
  """Sets `key` in the run's key-value store (overwriting); no-op with one process."""
  if not single():
    client().key_value_set(f"multiformer_jax/{key}", value, allow_overwrite=True)


def read_published(key: str) -> str | None:
  """The value another process published under `key`, or None (does not wait)."""
  if single():
    return None
  try:
    return client().key_value_try_get(f"multiformer_jax/{key}")
  except Exception as error:  # pylint: disable=broad-except  # JaxRuntimeError
    if str(error).startswith("NOT_FOUND"):
      return None
    raise
