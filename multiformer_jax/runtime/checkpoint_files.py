"""Telling a damaged checkpoint from one that cannot be restored for another reason.

Every checkpoint step gets a manifest once orbax has finished writing it: each file's size and
CRC32 (`{step}/files.json`). When a restore fails, the files are checked against it: a file
missing, truncated or changed means the checkpoint is damaged, and only then is it moved aside
(and the previous one tried). Otherwise the cause is elsewhere (tensors that no longer fit the
config, memory, an I/O error) and the run stops, naming it: nothing is discarded for a cause
that a rerun with the right config or more memory would not have. A step written before
manifests were kept (or killed between orbax's commit and the manifest) is judged by the error:
a failure to read its data is damage; memory, I/O and shape errors are not.
"""

from __future__ import annotations

import errno
import json
import os
import zlib

import jax

from multiformer_common import atomic

MANIFEST = "files.json"
# OSErrors that say the storage failed now, not that the files are damaged.
TRANSIENT_ERRNOS = {errno.EIO, errno.ESTALE, errno.EAGAIN, errno.ETIMEDOUT, errno.ENOMEM,
                    errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EMFILE, errno.ENFILE}


def _crc32(path: str) -> int:
  value = 0
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      value = zlib.crc32(block, value)
  return value


def _files(step_dir: str) -> list[str]:
  found = []
  for root, _, names in os.walk(step_dir):
    found += [os.path.relpath(os.path.join(root, n), step_dir) for n in names]
  return sorted(f for f in found if f != MANIFEST)


def write_manifest(step_dir: str):
  """Records every file of a finished checkpoint step with its size and CRC32."""
  atomic.write_json(os.path.join(step_dir, MANIFEST), {
      name: [os.path.getsize(os.path.join(step_dir, name)),
             _crc32(os.path.join(step_dir, name))] for name in _files(step_dir)})


def damage(step_dir: str) -> str | None:
  """What is damaged in a step, by its manifest ('a/b is missing', ...), None if nothing is;
  raises FileNotFoundError if it has no manifest, and an OSError met while reading."""
  with open(os.path.join(step_dir, MANIFEST), encoding="utf-8") as f:
    recorded = json.load(f)
  for name, (size, crc) in sorted(recorded.items()):
    path = os.path.join(step_dir, name)
    if not os.path.isfile(path):
      return f"{name} is missing"
    actual = os.path.getsize(path)
    if actual != size:
      return f"{name} has {actual} bytes, {size} when written"
    if _crc32(path) != crc:
      return f"{name} is not the file written (CRC32 differs)"
  return None


def is_memory_error(error: BaseException) -> bool:
  text = str(error)
  return isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text or \
      "out of memory" in text.lower()


def _shapes(tree) -> dict[str, tuple]:
  def name(key) -> str:
    for attribute in ("key", "name", "idx"):
      if hasattr(key, attribute):
        return str(getattr(key, attribute))
    return str(key)
  return {"/".join(name(k) for k in path): tuple(getattr(leaf, "shape", ()))
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def shape_mismatches(step_dir: str, target) -> list[str]:
  """The tensors whose saved shape differs from `target`'s (or that only one has), as
  'name: saved (a, b), config (c, d)'; raises if the checkpoint's metadata cannot be read."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  saved = _shapes(ocp.StandardCheckpointer().metadata(
      os.path.join(step_dir, "state")).item_metadata)
  wanted = _shapes(target)
  params = [k for k in sorted(set(saved) | set(wanted)) if k.startswith("params/")]
  return [f"{k[len('params/'):]}: saved {saved.get(k, 'absent')}, config "
          f"{wanted.get(k, 'absent')}" for k in params if saved.get(k) != wanted.get(k)]


def diagnose(step_dir: str, target, error: BaseException) -> tuple[bool, str]:
  """Why a step did not restore -> (damaged, reason): damaged steps are moved aside; for the
  others `reason` says what to do."""
  first = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
  if is_memory_error(error):
    return False, (f"out of memory while restoring it ({first}): free memory on the device "
                   f"(another process?) or restore on a machine with more")
  try:
    damaged = damage(step_dir)
  except FileNotFoundError:
    damaged = "unverified"                 # no manifest: judged by the error below
  except OSError as read_error:
    return False, f"its files cannot be read now ({read_error}): check the filesystem"
  if damaged not in (None, "unverified"):
    return True, damaged
  try:
    mismatched = shape_mismatches(step_dir, target) if target is not None else []
  except Exception:  # pylint: disable=broad-except  # unreadable metadata
    mismatched = None
  if mismatched:
    shown = "; ".join(mismatched[:8]) + (f"; and {len(mismatched) - 8} more"
                                         if len(mismatched) > 8 else "")
    return False, (f"its tensors do not fit the model this config builds ({shown}): the "
                   f"config's model settings differ from the run's (its config.json)")
  if damaged is None:
    return False, (f"its files are intact (as written), but restoring failed: {first}")
  if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS:
    return False, f"reading it failed ({first}): check the filesystem, then rerun"
  return True, first
