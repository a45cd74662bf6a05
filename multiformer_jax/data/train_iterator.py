"""The training batches in order: a pure function of (seed, epoch), the iterator state is
(epoch, batches consumed), so a resumed run continues with exactly the next batch; the same
batches can be assembled ahead by worker processes into shared memory.
"""

from __future__ import annotations

import collections


from multiformer_jax.data.workers import SlotPool, WorkerPool, batch_bytes
from multiformer_jax.data.batching import Batcher


class TrainIterator:
  """Endless training batches; `state()` / `restore()` give exact resumption.

  Batches are views of reused buffers (multiformer_jax.data.workers.SlotPool): a buffer is
  written again only once nothing refers to the batch it held, so the memory is touched once,
  not allocated per batch. With `workers` > 0 the batches are assembled ahead (reading, CMVN,
  SpecAugment, padding) by that many background processes straight into shared memory (multiformer_jax.data.workers),
  up to `prefetch` batches ahead of the training loop (default: two per worker), in plan
  order. A batch is a pure function of (seed, epoch, position), so prefetching changes
  neither the batches nor `state()`: the state names the next batch the loop will receive,
  whatever has been assembled ahead. Call `close()` (or use `with`) to stop the workers.
  """

  def __init__(self, batcher: Batcher, epoch: int = 0, position: int = 0, workers: int = 0,
               prefetch: int | None = None):
    self.batcher = batcher
    self.epoch, self.position = epoch, position
    self.workers = workers
    self.prefetch = max(prefetch if prefetch is not None else 2 * workers, 1)
    self._plans = {}
    self._pool = None
    self._inline_slots = None                 # buffers reused by batches assembled here
    self._pending = collections.deque()       # (number, bucket) of the next batches, in order
    self._submitted = None                    # (epoch, position) of the next batch to submit
    self._numbers = 0

  def state(self) -> dict:
    return {"epoch": self.epoch, "position": self.position}

  def restore(self, state: dict):
    self.epoch, self.position = int(state["epoch"]), int(state["position"])
    self._drop_pending()

  def __iter__(self):
    return self

  def _plan(self, epoch: int):
    if epoch not in self._plans:
      self._plans = {e: p for e, p in self._plans.items() if e >= epoch - 1}
      self._plans[epoch] = self.batcher.epoch_plan(epoch)
    return self._plans[epoch]

  def _normalise(self, epoch: int, position: int) -> tuple[int, int]:
    while position >= len(self._plan(epoch)):
      epoch, position = epoch + 1, 0
    return epoch, position

  def __next__(self) -> dict:
    self.epoch, self.position = self._normalise(self.epoch, self.position)
    if self.workers > 0:
      batch = self._next_prefetched()
    else:
      bucket, indices = self._plan(self.epoch)[self.position]
      if self._inline_slots is None:
        self._inline_slots = SlotPool(batch_bytes(self.batcher), shared=False)
      batch = self._inline_slots.views(self._inline_slots.acquire(),
                                       self.batcher.layout(bucket))
      self.batcher.assemble_into(batch, bucket, indices, self.epoch)
    self.position += 1
    return batch

  def _next_prefetched(self) -> dict:
    if self._pool is None:
      self._pool = WorkerPool(self.batcher, self.workers)
    if self._submitted is None:
      self._submitted = (self.epoch, self.position)
    while len(self._pending) < self.prefetch:
      epoch, position = self._normalise(*self._submitted)
      bucket, indices = self._plan(epoch)[position]
      self._pool.submit(self._numbers, bucket, indices, epoch)
      self._pending.append((self._numbers, bucket))
      self._numbers += 1
      self._submitted = (epoch, position + 1)
    number, bucket = self._pending.popleft()
    return self._pool.take(number, bucket)

  def _drop_pending(self):
    if self._pool is not None:
      self._pool.cancel()
    self._pending.clear()
    self._submitted = None

  def close(self):
    self._drop_pending()
    if self._pool is not None:
      self._pool.close()
      self._pool = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False
