"""Training batches assembled by worker processes straight into shared memory.

The main process owns a set of batch slots: memory shared with every worker (an anonymous
memfd on Linux, reached by the workers through /proc; elsewhere a temporary file), each as
large as the largest batch. A task names a slot and a batch of the plan; a worker writes
that batch into the slot (`Batcher.assemble_into`: the features are copied once, from the
page cache into the slot) and answers with the task's number. The main process hands out
numpy views of the slot: no batch is pickled, copied or sent through a pipe, so its share
per batch is a queue message and a few views, whatever the batch's size.

A slot is reused only when nothing refers to its batch any more: its views hang off one
array per batch whose finaliser returns the slot (a device array made from a view without a
copy, as jax may on a CPU, keeps it alive as long as it needs it). A consumer that keeps
batches gets new slots instead of stalling. Tasks go to whichever worker is free; batches
come back in the order asked for. A worker that dies is named with its exit code. Batches
assembled in the main process reuse slots the same way (anonymous memory, not shared).
"""

from __future__ import annotations

import collections
import mmap
import multiprocessing
import os
import queue
import tempfile
import threading
import traceback
import weakref

import numpy as np

from multiformer_common.errors import InvalidValue, ResourceError
from multiformer_common import signals

POLL_S = 1.0           # how often a wait for a batch checks that the workers are alive


def _layout_offsets(layout: dict) -> tuple[dict, int]:
  """{field: (shape, dtype)} -> ({field: (offset, shape, dtype)}, bytes), fields 64-byte
  aligned."""
  offsets, end = {}, 0
  for name, (shape, dtype) in layout.items():
    offsets[name] = (end, shape, dtype)
    end += (int(np.prod(shape)) * dtype.itemsize + 63) // 64 * 64
  return offsets, end


def _views(buffer, layout: dict) -> dict:
  placed, _ = _layout_offsets(layout)
  return {name: np.ndarray(shape, dtype, buffer, offset)
          for name, (offset, shape, dtype) in placed.items()}


class _Slot:
  """One batch's worth of memory, mapped here; shared: `where` is how a worker opens it."""

  def __init__(self, size: int, shared: bool):
    self.fd = self.path = None
    if not shared:
      self.map = mmap.mmap(-1, size)
      return
    if hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd"):
      self.fd = os.memfd_create("multiformer_jax-batch")
      self.where, self.path = f"/proc/{os.getpid()}/fd/{self.fd}", None
    else:
      self.fd, self.path = tempfile.mkstemp(
          prefix="multiformer_jax-batch-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
      self.where = self.path
    try:
      os.posix_fallocate(self.fd, 0, size) if hasattr(os, "posix_fallocate") else \
          os.ftruncate(self.fd, size)
    except OSError as error:
      self.close()
      raise ResourceError(error.errno, f"no memory for a training batch slot of {size / 2**20:.0f} "
                    f"MiB ({error.strerror}): lower data.loader_workers (each has two slots) "
                    f"or data.max_frames") from None
    self.map = mmap.mmap(self.fd, size)

  def close(self):
    try:
      if getattr(self, "map", None) is not None:
        self.map.close()
    except BufferError:          # a batch of this slot is still referred to: freed with it
      pass
    if self.fd is not None:
      os.close(self.fd)
    if self.path and os.path.exists(self.path):
      os.remove(self.path)


class SlotPool:
  """Buffers of `size` bytes for batches, handed out as numpy views and reused once nothing
  refers to the views of a batch any more (a finaliser on the one array they hang off)."""

  def __init__(self, size: int, shared: bool):
    self.size, self.shared = size, shared
    self.slots: list[_Slot] = []
    self._free = collections.deque()
    self._lock = threading.Lock()            # finalisers may run on another thread

  def acquire(self) -> int:
    """A free slot, or a new one if every slot's batch is still referred to."""
    with self._lock:
      if self._free:
        return self._free.popleft()
    self.slots.append(_Slot(self.size, self.shared))
    return len(self.slots) - 1

  def release(self, slot: int):
    with self._lock:
      self._free.append(slot)

  def where(self, slot: int) -> str:
    return self.slots[slot].where

  def views(self, slot: int, layout: dict) -> dict:
    """The batch in `slot` as views; the slot is released when none is referred to."""
    owner = np.frombuffer(self.slots[slot].map, np.uint8, self.size)
    weakref.finalize(owner, self.release, slot)
    return _views(owner, layout)

  def close(self):
    for slot in self.slots:
      slot.close()
    self.slots = []


def batch_bytes(batcher) -> int:
  """The bytes of the largest batch of `batcher`'s buckets (a slot's size)."""
  return max(_layout_offsets(batcher.layout(b))[1] for b in range(len(batcher.buckets)))


def _worker_main(batcher, tasks, results, parent: int):
  """A worker: (number, slot path, size, bucket, indices, epoch) -> the batch in the slot.
  Stop signals are its parent's (it ignores them); it ends when told to, or on its own once
  its parent is gone (killed without closing the pool)."""
  signals.ignore_stop_signals()
  maps = {}
  while True:
    try:
      task = tasks.get(timeout=POLL_S)
    except queue.Empty:
      if os.getppid() != parent:
        return
      continue
    if task is None:
      return
    number, where, size, bucket, indices, epoch = task
    try:
      if where not in maps:
        with open(where, "r+b") as f:
          maps[where] = mmap.mmap(f.fileno(), size)
      batch = _views(maps[where], batcher.layout(bucket))
      batcher.assemble_into(batch, bucket, indices, epoch)
      del batch
      results.put((number, None))
    except Exception:  # pylint: disable=broad-except  # reported to the main process
      results.put((number, traceback.format_exc()))


class WorkerPool:
  """`workers` processes assembling `batcher`'s batches into shared slots, in the order
  `submit` numbers them; `take(number)` -> that batch as numpy views."""

  def __init__(self, batcher, workers: int):
    if workers < 1:
      raise InvalidValue(f"data.loader_workers={workers}; a worker pool needs at least 1")
    self.batcher = batcher
    self.slots = SlotPool(batch_bytes(batcher), shared=True)
    self._task_slot = {}                     # number -> slot of submitted, untaken batches
    self._done = {}                          # number -> error text or None
    context = multiprocessing.get_context("spawn")
    signals.start_resource_tracker()
    with signals.stop_signals_blocked():       # the workers start ignoring them
      self._tasks, self._results = context.Queue(), context.Queue()
      self._processes = [context.Process(target=_worker_main, daemon=True,
                                         args=(batcher, self._tasks, self._results,
                                               os.getpid()))
                         for _ in range(workers)]
      for process in self._processes:
        process.start()
    self._closed = False

  def submit(self, number: int, bucket: int, indices: np.ndarray, epoch: int):
    slot = self.slots.acquire()
    self._task_slot[number] = slot
    self._tasks.put((number, self.slots.where(slot), self.slots.size, bucket,
                     np.asarray(indices), epoch))

  def _wait(self, number: int) -> str | None:
    """Waits until task `number` is done -> its error text or None."""
    while number not in self._done:
      try:
        done, error = self._results.get(timeout=POLL_S)
      except queue.Empty:
        self._check_alive()
        continue
      self._done[done] = error
    return self._done.pop(number)

  def take(self, number: int, bucket: int) -> dict:
    """The batch submitted as `number` (waits for it): views of its slot, which returns to
    the pool when none of them is referred to any more."""
    error = self._wait(number)
    slot = self._task_slot.pop(number)
    if error is not None:
      self.slots.release(slot)
      raise RuntimeError(f"a loader worker failed assembling a training batch:\n{error}")
    return self.slots.views(slot, self.batcher.layout(bucket))

  def cancel(self):
    """Forgets the submitted batches: waits for those being assembled (a worker may still
    write into their slots) and returns their slots."""
    if self._closed:                         # the workers are gone (stopped or dead)
      self._task_slot.clear()
      return
    for number in sorted(self._task_slot):
      self._wait(number)
      self.slots.release(self._task_slot.pop(number))

  def _check_alive(self):
    for process in self._processes:
      if process.exitcode is not None:
        self.close()
        raise RuntimeError(f"a loader worker process (pid {process.pid}) died with exit code "
                           f"{process.exitcode} (a negative code is the signal that ended it, "
                           f"e.g. -9: killed, often for lack of memory)")

  def close(self):
    if self._closed:
      return
    self._closed = True
    for _ in self._processes:
      try:
        self._tasks.put(None)
      except (OSError, ValueError):
        pass
    for process in self._processes:
      process.join(timeout=5)
      if process.is_alive():
        process.terminate()
        process.join()
    self._tasks.close()
    self._results.close()
    self.slots.close()

