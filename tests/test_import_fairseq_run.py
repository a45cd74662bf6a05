"""A fairseq checkpoint becomes a run: the fixtures saved by fairseq itself
(tests/fixtures/fairseq_s2t_tiny.npz) and by the thesis's code (thesis_multiformer_tiny.pt, an
s2t_multiformer with every head kind), imported with a fairseq-format data root written here,
are evaluated and analysed through their workdir exactly as the imported parameters decode."""

import json
import os
import zipfile

import numpy as np
import pytest

from data_prep import fairseq_data, vocab
from multiformer_jax.import_fairseq import run as import_fairseq
from multiformer_jax.analysis import analyze
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import evaluate, inference
from multiformer_jax.model import S2TModel
from multiformer_jax.runtime import checkpoints as ckpt_lib

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "fairseq_s2t_tiny.npz")
THESIS_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "thesis_multiformer_tiny.pt")
FEATURES, SYMBOLS = 12, 29        # the fixture model's input size and output layer
TEXT = ["the cat sat on the mat", "a dog ran in the park", "we read books at night",
        "she sings a song", "he paints the red door", "they walk to school"]


def write_root(root: str, rows_per_split=None):
  """A fairseq data root of random 12-dim features; the dictionary numbers 29 symbols."""
  rng = np.random.default_rng(0)
  os.makedirs(root)
  model = vocab.train_sentencepiece(TEXT * 20, os.path.join(root, "spm_unigram_st"), 60)
  sp = vocab.Vocabulary(model).sp
  with open(os.path.join(root, "spm_unigram_st.txt"), "w", encoding="utf-8") as f:
    f.writelines(f"{sp.id_to_piece(i)} 1\n" for i in range(4, SYMBOLS))
  with open(os.path.join(root, "config_st.yaml"), "w", encoding="utf-8") as f:
    f.write("bpe_tokenizer:\n  bpe: sentencepiece\n  sentencepiece_model: spm_unigram_st.model\n"
            "transforms:\n  '*':\n  - utterance_cmvn\nvocab_filename: spm_unigram_st.txt\n")
  rows_per_split = rows_per_split or {"train": 4, "dev": 4}
  manifest = {}
  with zipfile.ZipFile(os.path.join(root, "fbank80.zip"), "w", zipfile.ZIP_STORED) as z:
    for split, n in rows_per_split.items():
      manifest[split] = []
      for i in range(n):
        row_id = f"ted_{split}_{i}"
        frames = int(rng.integers(30, 70))
        path = os.path.join(root, row_id + ".npy")
        np.save(path, rng.normal(size=(frames, FEATURES)).astype(np.float32))
        z.write(path, arcname=row_id + ".npy")
        os.remove(path)
        manifest[split].append((row_id, frames, TEXT[i % len(TEXT)]))
  with zipfile.ZipFile(os.path.join(root, "fbank80.zip")) as z:
    offsets = {i.filename[:-4]: (i.header_offset + 30 + len(i.filename), i.file_size)
               for i in z.infolist()}
  for split, rows in manifest.items():
    with open(os.path.join(root, f"{split}_st.tsv"), "w", encoding="utf-8") as f:
      f.write("id\taudio\tn_frames\ttgt_text\tspeaker\tsrc_text\n")
      for row_id, frames, text in rows:
        offset, length = offsets[row_id]
        f.write(f"{row_id}\tfbank80.zip:{offset}:{length}\t{frames}\t{text}\tspk\t{text}\n")


@pytest.mark.parametrize("checkpoint", [FIXTURE, THESIS_FIXTURE], ids=["fairseq", "thesis"])
def test_an_imported_checkpoint_evaluates_and_analyses_as_its_parameters_decode(tmp_path,
                                                                                checkpoint):
  root, out = str(tmp_path / "en-de"), str(tmp_path / "run")
  write_root(root)
  result = import_fairseq.import_run(checkpoint, root, "st", out)
  config = ckpt_lib.load_config(out)
  assert config.data.corpus == "fairseq" and config.data.cmvn == "utterance"
  assert not config.data.specaugment and config.eval.beam == import_fairseq.FAIRSEQ_BEAM
  assert result["vocab_size"] == SYMBOLS

  # Through the workdir: evaluate reads the saved config, the orbax checkpoint, the index
  # (small batches and short hypotheses keep the test fast; the search is the same).
  config.eval.batch_frames, config.eval.max_len_b = 300, 12
  scores = evaluate.evaluate_stage(config, out, "st", "dev", progress=False)
  with open(os.path.join(scores["directory"], "hyp.txt"), encoding="utf-8") as f:
    through_run = f.read().split("\n")[:-1]
  # Directly: the fixture's parameters converted in memory, the same search.
  model_config, params, _ = import_fairseq.load_checkpoint(checkpoint)
  data = ip.SplitData(ip.PipelineConfig(result["prepared_dir"], stage="st", specaugment=False,
                                        max_frames=150), "dev")
  translate = inference.make_translate_for(S2TModel(model_config), config.eval)
  direct = inference.decode_split(params, ip.Batcher(data, False), translate, progress=False)
  assert through_run == direct and len(direct) == 4 and scores["utterances"] == 4

  # The analyses read it like any run.
  analyze.main(["heads", "--workdir", out, "--stage", "st", "--out", str(tmp_path / "heads"),
                "--num_utterances", "3", "--batch_size", "2", "--checkpoint", "latest",
                "--no_progress"])
  assert os.listdir(tmp_path / "heads")
  analyze.main(["contributions", "--workdir", out, "--stages", "st", "--out",
                str(tmp_path / "contributions"), "--num_utterances", "3", "--batch_size", "2",
                "--checkpoint", "latest", "--no_progress"])
  assert os.listdir(tmp_path / "contributions")

  # run.py fine-tunes from it: its parameters start the ST stage of a new run.
  from multiformer_jax.training import train
  config.st.init_from, config.st.max_updates, config.st.update_freq = out, 1, 1
  config.st.warmup_updates, config.st.eval_every = 1, 1
  config.data.max_frames = 300
  config.eval.after_training = False
  finetuned = str(tmp_path / "finetuned")
  train.train_and_evaluate(config, finetuned)
  first = ckpt_lib.StageCheckpoints(os.path.join(finetuned, "st", "checkpoints"))
  start = first.params(first.latest())                 # update 1 has learning rate 0
  np.testing.assert_array_equal(start["decoder"]["embed_tokens"]["embedding"],
                                params["decoder"]["embed_tokens"]["embedding"])


def test_an_import_that_does_not_fit_writes_nothing(tmp_path):
  root = str(tmp_path / "en-de")
  write_root(root)
  with open(os.path.join(root, "spm_unigram_st.txt"), "a", encoding="utf-8") as f:
    f.write("extra 1\n")
  out = str(tmp_path / "run")
  with pytest.raises(import_fairseq.FairseqImportError,
                     match=r"numbers 30 symbols .* output layer has 29"):
    import_fairseq.import_run(FIXTURE, root, "st", out)
  assert not os.path.exists(os.path.join(out, "prepared")) and \
      not os.path.exists(os.path.join(out, "st"))
  with pytest.raises(fairseq_data.FairseqDataError, match=r"not found \(the st yaml"):
    import_fairseq.import_run(FIXTURE, root, "st", out, config_yaml="config_other.yaml")
  with pytest.raises(FileNotFoundError, match="fairseq checkpoint .*missing.pt not found"):
    import_fairseq.import_run(str(tmp_path / "missing.pt"), root, "st", out)
  assert json.dumps(sorted(os.listdir(tmp_path))) == json.dumps(["en-de"])
