"""Corpora prepared in the earlier format: the features inside a TFDS dataset of ArrayRecord
records (one record per utterance, serialised with TFDS's feature connectors). Only read, by
data_prep.convert_features, which moves the features into flat files
(data_prep.feature_store); `tfds.builder_from_directory(...).as_data_source(split)` reads it.
"""

from __future__ import annotations

import os

from multiformer_common.errors import InvalidValue, MissingInput

VERSION = "1.0.0"
NAME = "speech_translation"


def split_name(split: str) -> str:
  """TFDS split names are identifiers: tst-COMMON -> tst_COMMON."""
  return split.replace("-", "_")


def dataset_dir(data_dir: str) -> str:
  return os.path.join(data_dir, NAME, VERSION)


def is_complete(data_dir: str) -> bool:
  return os.path.isfile(os.path.join(dataset_dir(data_dir), "dataset_info.json"))


def open_split(data_dir: str, split: str):
  """Random-access data source of one split: `source[i]` -> dict of numpy/bytes."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  if not is_complete(data_dir):
    raise MissingInput(f"no prepared TFDS dataset in {data_dir}; run python -m "
                            f"data_prep.prepare first")
  builder = tfds.builder_from_directory(dataset_dir(data_dir))
  name = split_name(split)
  if name not in builder.info.splits:
    raise InvalidValue(f"split {split!r} not in {data_dir}; prepared splits: "
                     f"{sorted(builder.info.splits)}")
  return builder.as_data_source(split=name)
