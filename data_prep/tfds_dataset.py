"""The prepared corpus as a TFDS dataset (array_record; no TensorFlow needed to write or read).

TFDS writes into an `incomplete.*` directory and renames it when every split is written, so a
half-written dataset is never visible as complete.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Iterator

import numpy as np

VERSION = "1.0.0"
NAME = "speech_translation"
TEXT_FIELDS = ("id", "talk", "speaker", "source_text", "target_text", "source_lang",
               "target_lang", "domain")


def split_name(split: str) -> str:
  """TFDS split names are identifiers: tst-COMMON -> tst_COMMON."""
  return split.replace("-", "_")


@functools.lru_cache(maxsize=None)
def _builder_class():
  """The builder class, defined once per process (TFDS registers dataset names globally, so
  preparing a second corpus in the same process must reuse it)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  class SpeechTranslation(tfds.core.GeneratorBasedBuilder):
    """Segments with Kaldi fbank features and their source/target text."""
    VERSION = tfds.core.Version(VERSION)

    def __init__(self, *, generators: dict[str, Callable[[], Iterator]] | None = None, **kw):
      self._generators = generators or {}
      super().__init__(**kw)

    def _info(self):
      features = {name: tfds.features.Text() for name in TEXT_FIELDS}
      features["fbank"] = tfds.features.Tensor(shape=(None, 80), dtype=np.float32)
      features["n_frames"] = tfds.features.Scalar(dtype=np.int32)
      return tfds.core.DatasetInfo(builder=self,
                                   features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
      return {split_name(s): gen() for s, gen in self._generators.items()}

    def _generate_examples(self):  # unused: _split_generators returns generators directly
      raise NotImplementedError

  SpeechTranslation.name = NAME
  return SpeechTranslation


def write_dataset(data_dir: str, generators: dict[str, Callable[[], Iterator]]):
  """generators: {split: () -> iterator of (key, example)}. No-op if already complete."""
  builder = _builder_class()(generators=generators, data_dir=data_dir,
                             file_format="array_record")
  builder.download_and_prepare()
  return builder


def dataset_dir(data_dir: str) -> str:
  return os.path.join(data_dir, NAME, VERSION)


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
