"""A corpus prepared in the earlier format -> its features as flat files, in place.

    python -m data_prep.convert_features --prepared data/prepared/embedded_en_de [--delete-tfds]

Earlier preparations kept each utterance's features inside a TFDS ArrayRecord record
(brotli-compressed and decoded record by record on every read). This reads every split's
records once, in data-source order, and writes them shard by shard into the flat float32
files that the input pipeline maps (data_prep.feature_store), with each row's file and
offset added to the split's index; prepared.json is rewritten last. The features are copied
bit for bit, so the batches are those of the old corpus. A split already converted is not
redone: a killed conversion continues where it stopped. `--delete-tfds` removes the records
afterwards (they are no longer read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np

from multiformer_common.errors import InvalidValue, MissingInput
from data_prep import feature_store, index_io, tfds_dataset
from multiformer_common import atomic, cli_errors
from multiformer_common.progress import progress_bar


def _write_json(path: str, value):
  atomic.write_json(path, value, indent=1, ensure_ascii=False)


def _convert_split(prepared: str, tfds_dir: str, split: str, progress: bool) -> list[str]:
  """One split's records -> its shard files and index columns; -> the files (relative)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  index_path = os.path.join(prepared, "index", f"{split}.npz")
  index = index_io.load(index_path)
  builder = tfds.builder_from_directory(tfds_dataset.dataset_dir(tfds_dir))
  shard_lengths = list(builder.info.splits[tfds_dataset.split_name(split)].shard_lengths) or [0]
  files = feature_store.relative_files(prepared, split, len(shard_lengths))
  if "feature_offset" in index and all(os.path.exists(os.path.join(prepared, f))
                                       for f in files):
    return files
  source = tfds_dataset.open_split(tfds_dir, split)
  if len(source) != len(index["n_frames"]):
    raise InvalidValue(f"{split}: {len(source)} records but the index has "
                     f"{len(index['n_frames'])} rows; the corpus is damaged: prepare it again")
  file_ids, offsets, row = [], [], 0
  bar = progress_bar(total=len(source), desc=f"{split}: records -> frames", unit="utt",
                     disable=not progress)
  for shard, count in enumerate(shard_lengths):
    with feature_store.ShardWriter(os.path.join(prepared, files[shard]),
                                   int(builder.info.features["fbank"].shape[1])) as writer:
      for _ in range(count):
        fbank = np.asarray(source[row]["fbank"], np.float32)
        if len(fbank) != int(index["n_frames"][row]):
          raise InvalidValue(f"{split} row {row}: {len(fbank)} frames in its record, "
                           f"{int(index['n_frames'][row])} in the index; prepare it again")
        offsets.append(writer.write(fbank))
        file_ids.append(shard)
        row += 1
        bar.update(1)
  bar.close()
  index_io.save(index_path, {**index, "feature_file": np.asarray(file_ids, np.int32),
                             "feature_offset": np.asarray(offsets, np.int64)})
  return files


def convert(prepared: str, delete_tfds: bool = False, progress: bool = True) -> dict:
  """Converts `prepared` in place (a no-op for a corpus already in the current format);
  -> its new prepared.json."""
  marker = os.path.join(prepared, "prepared.json")
  if not os.path.exists(marker):
    raise MissingInput(f"{prepared} is not a prepared corpus (no prepared.json)")
  with open(marker, encoding="utf-8") as f:
    summary = json.load(f)
  kind = summary.get("features")
  if kind in (feature_store.FORMAT, "fairseq_zip"):
    return summary
  tfds_dir = os.path.join(prepared, summary.get("tfds_dir", "tfds"))
  if not tfds_dataset.is_complete(tfds_dir):
    raise MissingInput(f"{prepared} has neither flat features nor a TFDS dataset in "
                            f"{tfds_dir}: prepare it again with python -m data_prep.prepare")
  files = {split: _convert_split(prepared, tfds_dir, split, progress)
           for split in summary["splits"]}
  summary = {key: value for key, value in summary.items() if key != "tfds_dir"}
  summary.update(features=feature_store.FORMAT, feature_dim=80, feature_files=files)
  _write_json(marker, summary)
  if delete_tfds:
    shutil.rmtree(tfds_dir)
  return summary


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--prepared", required=True, help="the prepared corpus's directory")
  parser.add_argument("--delete-tfds", action="store_true",
                      help="remove the TFDS records once converted")
  args = parser.parse_args(argv)
  summary = convert(args.prepared, args.delete_tfds)
  print(f"{args.prepared}: features in {feature_store.DIRECTORY}/ "
        f"({', '.join(f'{s}: {len(f)} files' for s, f in summary['feature_files'].items())})")


cli = cli_errors.command_line_entry(main)


if __name__ == "__main__":
  cli()
