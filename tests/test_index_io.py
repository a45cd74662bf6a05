"""The index's storage: text columns as UTF-8 with offsets give back the very strings, at the
text's size; indexes written before (fixed-width string columns) still load."""

import os

import numpy as np

from data_prep import index_io


def test_text_columns_round_trip_at_their_own_size(tmp_path):
  texts = ["Grüß Gott!", "", "¿Qué tal?", "x" * 5000, "日本語"]
  columns = {"id": [f"u{i}" for i in range(5)], "n_frames": np.arange(5, dtype=np.int64),
             "target_text": texts}
  path = str(tmp_path / "train.npz")
  index_io.save(path, columns)
  stored = np.load(path)
  assert "target_text" not in stored.files
  assert stored["target_text@utf8"].dtype == np.uint8
  # A fixed-width column would hold 5 x 5000 characters of 4 bytes; this holds the text.
  assert stored["target_text@utf8"].nbytes == sum(len(t.encode()) for t in texts)
  loaded = index_io.load(path)
  assert list(loaded) == ["id", "n_frames", "target_text"]
  assert loaded["target_text"].tolist() == texts and loaded["id"].tolist() == columns["id"]
  np.testing.assert_array_equal(loaded["n_frames"], columns["n_frames"])
  assert not os.path.exists(path + ".tmp.npz")


def test_an_index_of_fixed_width_strings_still_loads(tmp_path):
  path = str(tmp_path / "old.npz")
  np.savez(path, id=np.array(["a", "b"]), source_text=np.array(["one", "two"]))
  loaded = index_io.load(path)
  assert loaded["source_text"].tolist() == ["one", "two"]


def test_columns_built_part_by_part_equal_the_columns_saved_at_once(tmp_path):
  """prepare's main process builds a split's index one shard's sidecar at a time
  (ColumnsBuilder); the file loads as the same columns as `save` of the joined lists."""
  parts = [{"id": ["a_0", "a_1"], "n_frames": [120, 7], "source_text": ["Héllo wörld", ""],
            "target_text": ["¡Hola!", "x" * 300]},
           {"id": ["b_0"], "n_frames": [88], "source_text": ["日本語"], "target_text": ["y"]},
           {"id": ["c_0", "c_1", "c_2"], "n_frames": [1, 2, 3],
            "source_text": ["p", "q", "r"], "target_text": ["s", "t", "u"]}]
  builder = index_io.ColumnsBuilder()
  for part in parts:
    builder.add(part)
  builder.save(str(tmp_path / "built.npz"))
  joined = {name: sum((p[name] for p in parts), []) for name in parts[0]}
  index_io.save(str(tmp_path / "joined.npz"), joined)
  built, reference = (index_io.load(str(tmp_path / f"{n}.npz")) for n in ("built", "joined"))
  assert list(built) == list(reference)
  for name in reference:
    assert list(built[name]) == list(reference[name]), name
  assert built["n_frames"].dtype == reference["n_frames"].dtype
