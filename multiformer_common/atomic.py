"""Files that appear only complete: written beside their path and renamed into it when done,
so that a killed run never leaves a half-written file for a rerun to trust."""

from __future__ import annotations

import contextlib
import json
import os


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w"):
  """open(path, mode) for writing ('w' text in UTF-8, or 'wb'), renamed into `path` when the
  block ends without an error; on an error the partial file is removed and `path` untouched."""
  partial = path + ".tmp"
  try:
    with open(partial, mode, encoding=None if "b" in mode else "utf-8") as f:
      yield f
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(partial)
    raise
  os.replace(partial, path)


def write_text(path: str, text: str):
  with atomic_open(path) as f:
    f.write(text)


def write_json(path: str, value, **dump_options):
  """json.dump(value, **dump_options) into `path`, atomically."""
  with atomic_open(path) as f:
    json.dump(value, f, **dump_options)
