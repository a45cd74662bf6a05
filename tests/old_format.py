"""A prepared corpus as the earlier preparation wrote it (the features inside TFDS ArrayRecord
records, brotli-compressed, no flat files), made from one in the current format: the fixture
of the conversion tests. Written as that preparation did: TFDS's feature connectors, one
record per chunk, the metadata by tfds.folder_dataset.write_metadata."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from data_prep import index_io, tfds_dataset

TEXT_FIELDS = ("id", "talk", "speaker", "source_text", "target_text", "source_lang",
               "target_lang", "domain")


def _features_dict():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  features = {name: tfds.features.Text() for name in TEXT_FIELDS}
  features["fbank"] = tfds.features.Tensor(shape=(None, 80), dtype=np.float32,
                                           encoding=tfds.features.Encoding.BYTES)
  features["n_frames"] = tfds.features.Scalar(dtype=np.int32)
  return tfds.features.FeaturesDict(features)


def write_old_format(prepared: str, out: str, records_per_shard: int = 7) -> str:
  """Copies `prepared` (current format) to `out` in the earlier format; -> out."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel
  from data_prep import feature_store  # pylint: disable=import-outside-toplevel
  shutil.copytree(prepared, out, ignore=shutil.ignore_patterns(feature_store.DIRECTORY))
  with open(os.path.join(out, "prepared.json"), encoding="utf-8") as f:
    summary = json.load(f)
  features = _features_dict()
  data_dir = tfds_dataset.dataset_dir(os.path.join(out, "tfds"))
  os.makedirs(data_dir)
  split_infos = []
  for split, files in summary["feature_files"].items():
    index = index_io.load(os.path.join(out, "index", f"{split}.npz"))
    store = feature_store.FeatureStore([os.path.join(prepared, f) for f in files],
                                       index["feature_file"], index["feature_offset"],
                                       index["n_frames"], 80)
    rows = len(index["n_frames"])
    lengths = [min(records_per_shard, rows - s) for s in range(0, rows, records_per_shard)]
    for k, start in enumerate(range(0, rows, records_per_shard)):
      name = (f"{tfds_dataset.NAME}-{tfds_dataset.split_name(split)}.array_record-"
              f"{k:05d}-of-{len(lengths):05d}")
      writer = array_record_module.ArrayRecordWriter(os.path.join(data_dir, name),
                                                     "group_size:1")
      for i in range(start, start + lengths[k]):
        example = {field: str(index[field][i]) for field in TEXT_FIELDS}
        example.update(fbank=np.array(store.view(i)), n_frames=int(index["n_frames"][i]))
        writer.write(features.serialize_example(example))
      writer.close()
    split_infos.append(tfds.core.SplitInfo(name=tfds_dataset.split_name(split),
                                           shard_lengths=lengths, num_bytes=0,
                                           filename_template=None))
    index_io.save(os.path.join(out, "index", f"{split}.npz"),
                  {k: v for k, v in index.items() if k not in ("feature_file", "feature_offset")})
  tfds.folder_dataset.write_metadata(data_dir=data_dir, features=features,
                                     split_infos=split_infos, check_data=False)
  for key in ("features", "feature_dim", "feature_files"):
    summary.pop(key)
  summary["tfds_dir"] = "tfds"
  with open(os.path.join(out, "prepared.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f)
  return out
