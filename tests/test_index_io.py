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


def test_a_mustc_yaml_is_read_in_chunks_as_the_whole_file_parses(tmp_path):
  """corpora.yaml_segments streams the segment list a few entries at a time: the same
  mappings as one yaml.load of the file, whatever the chunk, in flow and block style, with
  comments and a document marker; another top-level form is parsed whole."""
  import yaml
  from data_prep import corpora
  flow = "".join(f"- {{duration: {i / 3:.3f}, offset: {i}.5, speaker_id: spk.{i % 3}, "
                 f"wav: ted_{i // 4}.wav}}\n" for i in range(11))
  block = "# MuST-C\n---\n" + "".join(f"- duration: {i}\n  offset: 0.{i}\n  wav: 'a, b {i}.wav'\n"
                                      for i in range(7))
  listed = "[{duration: 1, wav: x.wav}, {duration: 2, wav: y.wav}]\n"
  for name, text in (("flow", flow), ("block", block), ("listed", listed)):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    expected = yaml.safe_load(text)
    for chunk in (1, 2, 5, 1000):
      assert list(corpora.yaml_segments(str(path), chunk)) == expected, (name, chunk)


def test_a_yaml_and_text_files_of_different_lengths_are_refused_with_the_counts(tmp_path):
  import pytest
  from data_prep import corpora
  txt = tmp_path / "en-de" / "data" / "dev" / "txt"
  txt.mkdir(parents=True)
  (tmp_path / "en-de" / "data" / "dev" / "wav").mkdir()
  for entries, lines in ((3, 2), (2, 3)):
    (txt / "dev.yaml").write_text("".join(f"- {{duration: 1.0, offset: {i}.0, wav: t.wav}}\n"
                                          for i in range(entries)))
    for ext in ("en", "de"):
      (txt / f"dev.{ext}").write_text("".join(f"line {i}\n" for i in range(lines)))
    with pytest.raises(corpora.CorpusLayoutError,
                       match=f"{entries} yaml segments but {lines} lines in dev.en and {lines} "
                             f"in dev.de; they must match"):
      corpora.read_mustc(str(tmp_path), "en-de", "dev")
  (txt / "dev.yaml").write_text("- {duration: 1.0, offset: 0.0, wav: t.wav}\n" * 3)
  assert [r.id for r in corpora.read_mustc(str(tmp_path), "en-de", "dev")] == ["t_0", "t_1", "t_2"]


def test_ragged_rows_from_a_generator_and_a_subset_of_them():
  from multiformer_jax.data.input_pipeline import Ragged
  rows = [[5, 6, 7], [], [8], [9, 10, 11, 12], [300000]]
  ragged = Ragged(iter(rows))
  assert len(ragged) == 5 and [list(r) for r in ragged] == rows
  assert ragged.values.dtype == np.int32 and list(ragged.lengths) == [3, 0, 1, 4, 1]
  keep = np.array([True, True, False, True, False])
  assert [list(r) for r in ragged.take(keep)] == [[5, 6, 7], [], [9, 10, 11, 12]]
  assert len(Ragged(iter([]))) == 0 and len(ragged.take(np.zeros(5, bool))) == 0
