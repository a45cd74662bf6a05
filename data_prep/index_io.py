"""A split's index on disk (`index/{split}.npz`): one array per column, text as UTF-8.

numpy stores strings at the width of the longest one, four bytes a character: a MuST-C split
of 229k segments whose longest transcript has a few thousand characters would need gigabytes
per text column. Here a text column is its UTF-8 bytes joined (`NAME@utf8`, uint8) and where
each row starts (`NAME@offsets`, int64, rows + 1); `load` gives it back as an object array of
Python strings (the text's own size). Indexes written before this (fixed-width string
columns) load as they are.
"""

from __future__ import annotations

import os

import numpy as np

UTF8, OFFSETS = "@utf8", "@offsets"


def _is_text(values) -> bool:
  array = values if isinstance(values, np.ndarray) else None
  if array is not None:
    return array.dtype.kind in "UO" and (array.dtype.kind == "U" or
                                         all(isinstance(v, str) for v in array[:1]))
  return len(values) > 0 and isinstance(values[0], str)


def encode_text(values) -> tuple[np.ndarray, np.ndarray]:
  """Strings -> (their UTF-8 bytes joined [total] uint8, row starts [rows + 1] int64)."""
  encoded = [str(v).encode("utf-8") for v in values]
  offsets = np.zeros(len(encoded) + 1, np.int64)
  np.cumsum([len(e) for e in encoded], out=offsets[1:])
  return np.frombuffer(b"".join(encoded), np.uint8), offsets


def decode_text(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  """The inverse of encode_text: an object array of str."""
  raw = data.tobytes()
  out = np.empty(len(offsets) - 1, object)
  for i in range(len(out)):
    out[i] = raw[offsets[i]:offsets[i + 1]].decode("utf-8")
  return out


def save(path: str, columns: dict):
  """Writes the columns (lists or arrays; text columns as UTF-8) atomically."""
  builder = ColumnsBuilder()
  builder.add(columns)
  builder.save(path)


def load(path: str) -> dict[str, np.ndarray]:
  """{column: array}, text columns as object arrays of str, in the order they were saved."""
  stored = np.load(path)
  columns = {}
  for key in stored.files:
    if key.endswith(OFFSETS):
      continue
    if key.endswith(UTF8):
      name = key[:-len(UTF8)]
      columns[name] = decode_text(stored[key], stored[name + OFFSETS])
    else:
      columns[key] = stored[key]
  return columns


class ColumnsBuilder:
  """A split's index assembled part by part (e.g. one shard's columns at a time), each part
  kept as arrays (text as UTF-8 bytes and lengths), never as one Python object per row."""

  def __init__(self):
    self.parts: dict[str, list] = {}

  def add(self, columns: dict):
    for name, values in columns.items():
      if _is_text(values):
        data, offsets = encode_text(values)
        part = (data, np.diff(offsets))
      else:
        part = np.asarray(values)
      self.parts.setdefault(name, []).append(part)

  def save(self, path: str):
    """Writes the columns (text as `NAME@utf8` + `NAME@offsets`) atomically."""
    arrays = {}
    for name, parts in self.parts.items():
      if isinstance(parts[0], tuple):
        lengths = np.concatenate([p[1] for p in parts])
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        arrays[name + UTF8] = np.concatenate([p[0] for p in parts])
        arrays[name + OFFSETS] = offsets
      else:
        arrays[name] = np.concatenate(parts)
    np.savez(path + ".tmp.npz", **arrays)
    os.replace(path + ".tmp.npz", path)
