"""fairseq-prepared data read in place: a root written here in fairseq's layout (fbank80.zip of
.npy files, manifests with byte offsets, SentencePiece models with .txt dictionaries, yamls)
gives back the rows and features it was written from, and trains the same model as the same
features prepared by data_prep.prepare."""

import json
import os
import shutil
import zipfile

import jax
import numpy as np
import pytest

from data_prep import fairseq_data, index_io, prepare, vocab
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.training import train
from tests.test_train import tiny_config

YAML = """bpe_tokenizer:
  bpe: sentencepiece
  sentencepiece_model: {model}
input_channels: 1
input_feat_per_channel: 80
specaugment:
  freq_mask_F: 27
  freq_mask_N: 1
  time_mask_N: 1
  time_mask_T: 100
  time_mask_p: 1.0
  time_wrap_W: 0
transforms:
  '*':
  - utterance_cmvn
  _train:
  - utterance_cmvn
  - specaugment
vocab_filename: {dictionary}
"""


def fairseq_dictionary(model_path: str, out: str, order=None):
  """fairseq's gen_vocab: the SentencePiece pieces but the four specials, "piece 1" a line."""
  sp = vocab.Vocabulary(model_path).sp
  pieces = [sp.id_to_piece(i) for i in range(4, sp.get_piece_size())]
  if order is not None:
    pieces = [pieces[i] for i in order]
  with open(out, "w", encoding="utf-8") as f:
    f.writelines(f"{p} 1\n" for p in pieces)
  return pieces


def write_fairseq_root(prepared_dir: str, root: str, splits=("train", "dev")):
  """The prepared corpus's features and texts in the layout fairseq's prep_mustc_data.py
  writes: offsets as its get_zip_manifest computes them (header offset + 30 + name length)."""
  os.makedirs(root, exist_ok=True)
  rows = {}
  with zipfile.ZipFile(os.path.join(root, "fbank80.zip"), "w", zipfile.ZIP_STORED) as z:
    for split in splits:
      data = ip.SplitData(ip.PipelineConfig(prepared_dir, stage="st"), split)
      index = index_io.load(os.path.join(prepared_dir, "index", f"{split}.npz"))
      rows[split] = []
      for i in range(len(data)):
        row_id = str(data.ids[i])
        path = os.path.join(root, f"{row_id}.npy")
        np.save(path, data.fbank(i))
        z.write(path, arcname=f"{row_id}.npy")
        os.remove(path)
        rows[split].append((row_id, int(data.n_frames[i]),
                            str(index["source_text"][data.rows[i]]),
                            str(index["target_text"][data.rows[i]]),
                            str(index["speaker"][data.rows[i]])))
  with zipfile.ZipFile(os.path.join(root, "fbank80.zip")) as z:
    offsets = {os.path.splitext(i.filename)[0]: (i.header_offset + 30 + len(i.filename),
                                                 i.file_size) for i in z.infolist()}
  for split, split_rows in rows.items():
    for task in ("asr", "st"):
      with open(os.path.join(root, f"{split}_{task}.tsv"), "w", encoding="utf-8") as f:
        f.write("id\taudio\tn_frames\ttgt_text\tspeaker\n")
        for row_id, n, source, target, speaker in split_rows:
          offset, length = offsets[row_id]
          text = source if task == "asr" else target
          f.write(f"{row_id}\tfbank80.zip:{offset}:{length}\t{n}\t{text}\t{speaker}\n")
  for task in ("asr", "st"):
    shutil.copy(os.path.join(prepared_dir, f"spm_{task}.model"),
                os.path.join(root, f"spm_unigram40_{task}.model"))
    fairseq_dictionary(os.path.join(root, f"spm_unigram40_{task}.model"),
                       os.path.join(root, f"spm_unigram40_{task}.txt"))
    with open(os.path.join(root, f"config_{task}.yaml"), "w", encoding="utf-8") as f:
      # fairseq writes the model's absolute path, the dictionary's name
      f.write(YAML.format(model=os.path.join(root, f"spm_unigram40_{task}.model"),
                          dictionary=f"spm_unigram40_{task}.txt"))
  return rows


@pytest.fixture(scope="module")
def fairseq_root(prepared, tmp_path_factory):
  _, prepared_dir = prepared
  root = str(tmp_path_factory.mktemp("fairseq") / "en-de")
  rows = write_fairseq_root(prepared_dir, root)
  index_dir = str(tmp_path_factory.mktemp("fairseq_index"))
  summary = prepare.prepare("fairseq", root, [""], index_dir)
  return root, index_dir, summary, rows


def test_rows_and_features_read_back_exactly(prepared, fairseq_root):
  _, prepared_dir = prepared
  root, index_dir, summary, rows = fairseq_root
  assert summary["corpus"] == "fairseq" and summary["pairs"] == ["en-de"]
  assert summary["splits"] == {s: len(r) for s, r in rows.items()}
  assert summary["transforms"]["st"] == {
      "cmvn": "utterance",
      "specaugment": "lb,freq_mask_n=1,freq_mask_f=27,time_mask_n=1,time_mask_t=100,"
                     "time_mask_p=1.0", "prepend_tgt_lang_tag": False}
  assert not os.path.exists(os.path.join(index_dir, "tfds"))      # nothing copied
  for task in ("asr", "st"):
    ours = ip.SplitData(ip.PipelineConfig(prepared_dir, stage=task, specaugment=False), "dev")
    theirs = ip.SplitData(ip.PipelineConfig(index_dir, stage=task, specaugment=False), "dev")
    assert isinstance(theirs.vocab, vocab.DictionaryVocabulary)
    assert list(theirs.ids) == list(ours.ids)
    np.testing.assert_array_equal(theirs.n_frames, ours.n_frames)
    assert theirs.references == ours.references
    for mine, fairseqs in zip(ours.tokens, theirs.tokens):
      np.testing.assert_array_equal(mine, fairseqs)
    for i in range(len(ours)):
      np.testing.assert_array_equal(theirs.fbank(i), ours.fbank(i))
  assert theirs.tag_values["speaker"].tolist() == ours.tag_values["speaker"].tolist()


def test_the_index_built_a_few_rows_at_a_time_equals_the_one_built_at_once(fairseq_root,
                                                                           tmp_path,
                                                                           monkeypatch):
  """At MuST-C's size the reader turns its columns into arrays every FLUSH_ROWS rows; forced
  to 3 here, the index files are the same as with one flush."""
  from data_prep import fairseq_data, index_io
  root, index_dir, summary, _ = fairseq_root
  monkeypatch.setattr(fairseq_data, "FLUSH_ROWS", 3)
  small = fairseq_data.write_index(root, str(tmp_path / "small"))
  assert small == summary
  for split in summary["splits"]:
    ours = index_io.load(os.path.join(str(tmp_path / "small"), "index", f"{split}.npz"))
    once = index_io.load(os.path.join(index_dir, "index", f"{split}.npz"))
    assert list(ours) == list(once) and len(once["id"]) > 3
    for name in once:
      assert ours[name].dtype == once[name].dtype and list(ours[name]) == list(once[name]), name


def test_a_model_trained_from_the_fairseq_root_equals_one_from_prepare(prepared, fairseq_root,
                                                                         tmp_path):
  _, prepared_dir = prepared
  _, index_dir, _, _ = fairseq_root
  params = {}
  for name, directory in (("prepare", prepared_dir), ("fairseq", index_dir)):
    config = tiny_config(directory, max_updates=3, eval_every=3)
    config.train.stages = ("asr",)
    config.data.specaugment_policy = ("lb,freq_mask_n=1,freq_mask_f=27,time_mask_n=1,"
                                      "time_mask_t=100,time_mask_p=1.0")
    train.train_and_evaluate(config, str(tmp_path / name))
    checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / name / "asr" / "checkpoints"))
    params[name] = checkpoints.params(checkpoints.latest())
  jax.tree_util.tree_map(np.testing.assert_array_equal, params["prepare"], params["fairseq"])


def test_the_dictionary_numbers_the_pieces_not_the_sentencepiece_model(prepared, tmp_path):
  _, prepared_dir = prepared
  model = os.path.join(prepared_dir, "spm_st.model")
  sp_size = vocab.Vocabulary(model).size
  order = list(range(sp_size - 4))[::-1]
  pieces = fairseq_dictionary(model, str(tmp_path / "dict.txt"), order)
  with open(tmp_path / "dict.txt", "a", encoding="utf-8") as f:
    f.write("<lang:de> 1\n")
  dictionary = vocab.DictionaryVocabulary(model, str(tmp_path / "dict.txt"))
  assert dictionary.size == sp_size + 1
  text = "zwei Kanaele"                       # a target sentence of the tiny corpus
  plain = vocab.Vocabulary(model)
  assert vocab.UNK_ID not in plain.encode(text)
  expected = [4 + pieces.index(plain.sp.id_to_piece(i)) for i in plain.encode(text)]
  assert expected != plain.encode(text)
  assert dictionary.encode(text) == expected
  assert dictionary.decode(expected + [dictionary.symbol_id("<lang:de>"), 2]) == \
      plain.decode(plain.encode(text))
  assert dictionary.symbol_id("<lang:de>") == sp_size


def test_bad_roots_and_rows_are_refused_or_counted(fairseq_root, tmp_path):
  root, _, _, rows = fairseq_root
  bad = str(tmp_path / "en-de")
  shutil.copytree(root, bad)
  # Rows: an offset past the zip's end, a malformed audio entry, no frames, empty text.
  with open(os.path.join(bad, "dev_st.tsv"), encoding="utf-8") as f:
    lines = f.read().split("\n")
  fields = [line.split("\t") for line in lines[1:4]]
  fields[0][1] = "fbank80.zip:999999999:10"
  fields[1][1] = "fbank80.zip"
  fields[2][2] = "0"
  lines[1:4] = ["\t".join(f) for f in fields]
  empty = lines[4].split("\t")
  empty[3] = " "
  lines[4] = "\t".join(empty)
  with open(os.path.join(bad, "dev_st.tsv"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  summary = fairseq_data.write_index(bad, str(tmp_path / "index"))
  with open(tmp_path / "index" / "prep_report.json", encoding="utf-8") as f:
    report = json.load(f)["dev"]
  assert report["skipped"] == {"offset past the end of the zip": 1,
                               "audio is not ZIP:OFFSET:LENGTH": 1,
                               "n_frames is not a positive integer": 1, "empty text": 1}
  assert summary["splits"]["dev"] == len(rows["dev"]) - 4
  # The root: a manifest without a column, a missing zip, a dictionary the model outgrows.
  with open(os.path.join(bad, "train_st.tsv"), encoding="utf-8") as f:
    text = f.read()
  with open(os.path.join(bad, "train_st.tsv"), "w", encoding="utf-8") as f:
    f.write(text.replace("n_frames\t", "frames\t", 1))
  with pytest.raises(fairseq_data.FairseqDataError, match=r"train_st.tsv: no column n_frames"):
    fairseq_data.write_index(bad, str(tmp_path / "index2"))
  assert not os.path.exists(tmp_path / "index2" / "prepared.json")
  with open(os.path.join(bad, "train_st.tsv"), "w", encoding="utf-8") as f:
    f.write(text)
  os.rename(os.path.join(bad, "fbank80.zip"), os.path.join(bad, "moved.zip"))
  with pytest.raises(fairseq_data.FairseqDataError, match=r"names fbank80.zip, which is not"):
    fairseq_data.write_index(bad, str(tmp_path / "index3"))
  os.rename(os.path.join(bad, "moved.zip"), os.path.join(bad, "fbank80.zip"))
  with open(os.path.join(bad, "config_st.yaml"), encoding="utf-8") as f:
    yaml_text = f.read()
  with open(os.path.join(bad, "config_st.yaml"), "w", encoding="utf-8") as f:
    f.write(yaml_text.replace("- specaugment", "- delta_deltas"))
  with pytest.raises(fairseq_data.FairseqDataError, match=r"transforms \['delta_deltas'\] are "
                                                          r"not supported"):
    fairseq_data.write_index(bad, str(tmp_path / "index4"))


def test_a_config_that_disagrees_with_the_yaml_is_refused(fairseq_root):
  _, index_dir, _, _ = fairseq_root
  with pytest.raises(ValueError, match="set --config.data.cmvn=utterance"):
    ip.SplitData(ip.PipelineConfig(index_dir, stage="st", cmvn="global"), "train")
  with pytest.raises(ValueError, match="set --config.data.specaugment_policy=lb,freq_mask_n=1"):
    ip.SplitData(ip.PipelineConfig(index_dir, stage="st", specaugment_policy="sm"), "train")
