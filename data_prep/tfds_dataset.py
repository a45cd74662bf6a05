"""The prepared corpus as a TFDS dataset: sharded ArrayRecord files written as a stream.

Records are serialised with TFDS's own feature connectors and written shard by shard with
ArrayRecord's writer, so memory does not grow with the corpus and no TensorFlow is needed
(TFDS's builder would shuffle the records in memory and spill through TensorFlow). The
metadata (`dataset_info.json`, `features.json`) is written last with
`tfds.folder_dataset.write_metadata`, into a staging directory that is then renamed: the
dataset is visible as complete only when everything is in place. `tfds.builder_from_directory
(...).as_data_source(split)` reads it.
"""

from __future__ import annotations

import functools
import os
import shutil

import numpy as np

VERSION = "1.0.0"
NAME = "speech_translation"
TEXT_FIELDS = ("id", "talk", "speaker", "source_text", "target_text", "source_lang",
               "target_lang", "domain")
STAGING_SUFFIX = ".incomplete"
# One record per chunk: random access reads one record, not a group of them.
WRITER_OPTIONS = "group_size:1"


def split_name(split: str) -> str:
  """TFDS split names are identifiers: tst-COMMON -> tst_COMMON."""
  return split.replace("-", "_")


@functools.lru_cache(maxsize=None)
def features_dict():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  features = {name: tfds.features.Text() for name in TEXT_FIELDS}
  # Bytes: the [frames, 80] array serialised as one buffer (TFDS's default float list costs
  # more to build than computing the features; docs/benchmarks.md, "Data at scale").
  features["fbank"] = tfds.features.Tensor(shape=(None, 80), dtype=np.float32,
                                           encoding=tfds.features.Encoding.BYTES)
  features["n_frames"] = tfds.features.Scalar(dtype=np.int32)
  return tfds.features.FeaturesDict(features)


def dataset_dir(data_dir: str) -> str:
  return os.path.join(data_dir, NAME, VERSION)


def staging_dir(data_dir: str) -> str:
  return dataset_dir(data_dir) + STAGING_SUFFIX


def shard_filename(split: str, shard: int, num_shards: int) -> str:
  """TFDS's default template: {DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}."""
  return f"{NAME}-{split_name(split)}.array_record-{shard:05d}-of-{num_shards:05d}"


class ShardWriter:
  """Writes one shard to `path + '.tmp'` and renames it to `path` on `close()`: a shard file
  exists only complete. Use as a context manager; an exception removes the partial file."""

  def __init__(self, path: str):
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel
    self.path, self.partial = path, path + ".tmp"
    self.writer = array_record_module.ArrayRecordWriter(self.partial, WRITER_OPTIONS)
    self.count = self.num_bytes = 0

  def write(self, example: dict):
    record = features_dict().serialize_example(example)
    self.writer.write(record)
    self.count += 1
    self.num_bytes += len(record)

  def close(self):
    self.writer.close()
    os.replace(self.partial, self.path)

  def __enter__(self):
    return self

  def __exit__(self, kind, value, traceback):
    if kind is None:
      self.close()
    else:
      self.writer.close()
      if os.path.exists(self.partial):
        os.remove(self.partial)


def finalize(data_dir: str, shard_lengths: dict[str, list[int]], num_bytes: dict[str, int]):
  """Writes the metadata of the staged shards and makes the dataset visible (a rename)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  staged = staging_dir(data_dir)
  split_infos = [tfds.core.SplitInfo(name=split_name(s), shard_lengths=lengths,
                                     num_bytes=num_bytes[s], filename_template=None)
                 for s, lengths in shard_lengths.items()]
  tfds.folder_dataset.write_metadata(data_dir=staged, features=features_dict(),
                                     split_infos=split_infos, check_data=False)
  final = dataset_dir(data_dir)
  if os.path.exists(final):                 # a complete dataset is never replaced
    shutil.rmtree(staged)
    return
  os.replace(staged, final)


def is_complete(data_dir: str) -> bool:
  return os.path.isfile(os.path.join(dataset_dir(data_dir), "dataset_info.json"))


def open_split(data_dir: str, split: str):
  """Random-access data source of one split: `source[i]` -> dict of numpy/bytes."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  if not is_complete(data_dir):
    raise FileNotFoundError(f"no prepared TFDS dataset in {data_dir}; run python -m "
                            f"data_prep.prepare first")
  builder = tfds.builder_from_directory(dataset_dir(data_dir))
  name = split_name(split)
  if name not in builder.info.splits:
    raise ValueError(f"split {split!r} not in {data_dir}; prepared splits: "
                     f"{sorted(builder.info.splits)}")
  return builder.as_data_source(split=name)
