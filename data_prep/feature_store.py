"""A prepared split's features on disk: flat float32 shard files read in place by offset.

Each shard of a split is one file `frames/{split}/{k:05d}-of-{n:05d}.f32`: the [frames, dim]
float32 matrices of its utterances one after another, no header, no compression (fairseq's
fbank80.zip stores uncompressed .npy the same way, for the same reason). The index holds
each utterance's shard (`feature_file`) and first row (`feature_offset`); `n_frames` its
length. A reader maps the files (`np.memmap`) and hands out views: reading an utterance is a
slice of the page cache, and the only copy is the one into the batch. A shard file appears
complete or not at all (written to `.tmp`, renamed on close).

Corpora prepared before this format kept the features inside TFDS ArrayRecord records
(brotli-compressed, decoded record by record); `python -m data_prep.convert_features
--prepared DIR` rewrites them into this one.
"""

from __future__ import annotations

import os

import numpy as np

from multiformer_common.errors import InvalidValue

FORMAT = "frames"                  # prepared.json's "features" for this format
DIRECTORY = "frames"
DTYPE = np.float32
CONVERT_COMMAND = "python -m data_prep.convert_features --prepared {prepared}"
REPAIR_COMMAND = "python -m data_prep.prepare --repair --out {prepared}"


def shard_path(prepared_dir: str, split: str, shard: int, num_shards: int) -> str:
  return os.path.join(prepared_dir, DIRECTORY, split, f"{shard:05d}-of-{num_shards:05d}.f32")


def relative_files(prepared_dir: str, split: str, num_shards: int) -> list[str]:
  """The split's shard files relative to the prepared directory, in shard order."""
  return [os.path.relpath(shard_path(prepared_dir, split, k, num_shards), prepared_dir)
          for k in range(num_shards)]


class ShardWriter:
  """Appends feature matrices to `path + '.tmp'`; `write` returns the first row of the matrix
  written; `close` renames the file into place. As a context manager an exception removes the
  partial file."""

  def __init__(self, path: str, feature_dim: int):
    self.path, self.partial, self.feature_dim = path, path + ".tmp", feature_dim
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self.file = open(self.partial, "wb")  # pylint: disable=consider-using-with
    self.rows = 0

  def write(self, features: np.ndarray) -> int:
    features = np.ascontiguousarray(features, DTYPE)
    if features.ndim != 2 or features.shape[1] != self.feature_dim:
      raise InvalidValue(f"features of shape {features.shape}; this shard holds "
                       f"[frames, {self.feature_dim}]")
    offset = self.rows
    self.file.write(features.tobytes())
    self.rows += len(features)
    return offset

  def close(self):
    self.file.flush()
    os.fsync(self.file.fileno())
    self.file.close()
    os.replace(self.partial, self.path)

  def __enter__(self):
    return self

  def __exit__(self, kind, value, traceback):
    if kind is None:
      self.close()
    else:
      self.file.close()
      if os.path.exists(self.partial):
        os.remove(self.partial)


class FeatureStore:
  """Rows of a split -> [frames, dim] float32 views of its mapped shard files. Maps its files
  lazily, so it pickles to loader worker processes without them."""

  def __init__(self, paths, file_ids, offsets, lengths, feature_dim: int):
    self.paths = list(paths)
    self.file_ids = np.asarray(file_ids, np.int32)
    self.offsets = np.asarray(offsets, np.int64)
    self.lengths = np.asarray(lengths, np.int64)
    self.feature_dim = int(feature_dim)
    self._maps = {}

  def __getstate__(self):
    return {**self.__dict__, "_maps": {}}

  def take(self, keep: np.ndarray) -> "FeatureStore":
    """The rows where the boolean `keep` is true."""
    return FeatureStore(self.paths, self.file_ids[keep], self.offsets[keep], self.lengths[keep],
                        self.feature_dim)

  def _map(self, file_id: int) -> np.ndarray:
    mapped = self._maps.get(file_id)
    if mapped is None:
      path = self.paths[file_id]
      size = os.path.getsize(path)
      row_bytes = self.feature_dim * np.dtype(DTYPE).itemsize
      if size % row_bytes:
        raise InvalidValue(f"{path}: {size} bytes is not a whole number of [{self.feature_dim}] "
                         f"float32 rows; the file is damaged: prepare the corpus again")
      mapped = self._maps[file_id] = np.memmap(path, DTYPE, "r",
                                               shape=(size // row_bytes, self.feature_dim))
    return mapped

  def damaged_files(self) -> list[str]:
    """The files shorter than their rows need, or not whole rows ('path: N bytes, M
    needed'): a file cut short (a disk that filled, a copy that stopped) fails here when a run
    starts, not at its first read of the missing part, again after every resume."""
    row_bytes = self.feature_dim * np.dtype(DTYPE).itemsize
    needed = np.zeros(len(self.paths), np.int64)                          # [files] rows
    np.maximum.at(needed, self.file_ids, self.offsets + self.lengths)
    damaged = []
    for path, rows in zip(self.paths, needed):
      size = os.path.getsize(path) if os.path.exists(path) else -1
      if size < rows * row_bytes or size % row_bytes:
        damaged.append(f"{path}: {'missing' if size < 0 else f'{size} bytes'}, "
                       f"{rows * row_bytes} needed")
    return damaged

  def view(self, i: int) -> np.ndarray:
    """Row i's [frames, dim] features: a read-only view of the mapped file, not a copy."""
    start = int(self.offsets[i])
    mapped = self._map(int(self.file_ids[i]))
    end = start + int(self.lengths[i])
    if end > len(mapped):
      raise InvalidValue(f"row {i} reads frames {start}:{end} of {self.paths[self.file_ids[i]]}, "
                       f"which has {len(mapped)}: the index and the features disagree; "
                       f"prepare the corpus again")
    return mapped[start:end]

  def close(self):
    self._maps.clear()
