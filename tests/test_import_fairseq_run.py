"""A fairseq checkpoint becomes a run: the fixtures saved by fairseq itself
(tests/fixtures/fairseq_s2t_tiny.npz), by the thesis's code (thesis_multiformer_tiny.pt, an
s2t_multiformer with every head kind) and by fairseq's examples/attention_head_selection
(head_selection_tiny.npz), imported with a fairseq-format data root written here, are evaluated
and analysed through their workdir exactly as the imported parameters decode."""

import json
import os
import zipfile

import numpy as np
import pytest

import soundfile

from data_prep import fairseq_data, vocab
from data_prep import features as features_lib
from multiformer_jax.fairseq_checkpoints import run_writer
from multiformer_jax import analyze
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import scoring, inference, audio_files
from multiformer_jax.model import S2TModel
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax import schema

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "fairseq_s2t_tiny.npz")
THESIS_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "thesis_multiformer_tiny.pt")
HEAD_SELECTION_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures",
                                      "head_selection_tiny.npz")
FEATURES, SYMBOLS = 12, 29        # the fixture model's input size and output layer
TEXT = ["the cat sat on the mat", "a dog ran in the park", "we read books at night",
        "she sings a song", "he paints the red door", "they walk to school"]


def write_root(root: str, rows_per_split=None, wavs=None):
  """A fairseq data root of random 12-dim features; the dictionary numbers 29 symbols.
  rows_per_split: {manifest name (without .tsv): rows}. wavs: a directory where each row's
  audio (a tone) is written as ROW_ID.wav, its features the 80-dim fbank of that audio."""
  rng = np.random.default_rng(0)
  os.makedirs(root)
  model = vocab.train_sentencepiece(TEXT * 20, os.path.join(root, "spm_unigram_st"), 60)
  sp = vocab.Vocabulary(model).sp
  with open(os.path.join(root, "spm_unigram_st.txt"), "w", encoding="utf-8") as f:
    f.writelines(f"{sp.id_to_piece(i)} 1\n" for i in range(4, SYMBOLS))
  with open(os.path.join(root, "config_st.yaml"), "w", encoding="utf-8") as f:
    f.write("bpe_tokenizer:\n  bpe: sentencepiece\n  sentencepiece_model: spm_unigram_st.model\n"
            "transforms:\n  '*':\n  - utterance_cmvn\nvocab_filename: spm_unigram_st.txt\n")
  rows_per_split = rows_per_split or {"train_st": 4, "dev_st": 4}
  manifest = {}
  with zipfile.ZipFile(os.path.join(root, "fbank80.zip"), "w", zipfile.ZIP_STORED) as z:
    for split, n in rows_per_split.items():
      manifest[split] = []
      for i in range(n):
        row_id = f"ted_{split}_{i}"
        frames = int(rng.integers(30, 70))
        features = rng.normal(size=(frames, FEATURES)).astype(np.float32)
        if wavs:
          samples = tone(frames / 100, rng)
          soundfile.write(os.path.join(wavs, row_id + ".wav"), samples, 16000, subtype="FLOAT")
          features = features_lib.fbank(samples)
          frames = len(features)
        path = os.path.join(root, row_id + ".npy")
        np.save(path, features)
        z.write(path, arcname=row_id + ".npy")
        os.remove(path)
        manifest[split].append((row_id, frames, TEXT[i % len(TEXT)]))
  with zipfile.ZipFile(os.path.join(root, "fbank80.zip")) as z:
    offsets = {i.filename[:-4]: (i.header_offset + 30 + len(i.filename), i.file_size)
               for i in z.infolist()}
  for split, rows in manifest.items():
    with open(os.path.join(root, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("id\taudio\tn_frames\ttgt_text\tspeaker\tsrc_text\n")
      for row_id, frames, text in rows:
        offset, length = offsets[row_id]
        f.write(f"{row_id}\tfbank80.zip:{offset}:{length}\t{frames}\t{text}\tspk\t{text}\n")


def tone(seconds, rng):
  """A tone in noise, 16 kHz."""
  t = np.arange(int(seconds * 16000)) / 16000
  return (0.2 * np.sin(2 * np.pi * rng.uniform(150, 400) * t)
          + 0.05 * rng.normal(size=t.size)).astype(np.float32)


@pytest.mark.parametrize("checkpoint", [FIXTURE, THESIS_FIXTURE], ids=["fairseq", "thesis"])
def test_an_imported_checkpoint_evaluates_and_analyses_as_its_parameters_decode(tmp_path,
                                                                                checkpoint):
  root, out = str(tmp_path / "en-de"), str(tmp_path / "run")
  write_root(root)
  result = run_writer.import_run(checkpoint, root, "st", out)
  config = schema.load_config(out)
  assert config.data.corpus == "fairseq" and config.data.cmvn == "utterance"
  assert not config.data.specaugment and config.eval.beam == run_writer.FAIRSEQ_BEAM
  assert result["vocab_size"] == SYMBOLS

  # Through the workdir: evaluate reads the saved config, the orbax checkpoint, the index
  # (small batches and short hypotheses keep the test fast; the search is the same).
  config.eval.batch_frames, config.eval.max_len_b = 300, 12
  scores = scoring.evaluate_stage(config, out, "st", "dev", progress=False)
  with open(os.path.join(scores["directory"], "hyp.txt"), encoding="utf-8") as f:
    through_run = f.read().split("\n")[:-1]
  # Directly: the fixture's parameters converted in memory, the same search.
  model_config, params, _ = run_writer.load_checkpoint(checkpoint)
  data = ip.SplitData(ip.PipelineConfig(result["prepared_dir"], stage="st", specaugment=False,
                                        max_frames=150), "dev")
  translate = inference.make_beam_search_for(S2TModel(model_config), config.eval)
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
  with pytest.raises(run_writer.FairseqImportError,
                     match=r"numbers 30 symbols .* output layer has 29"):
    run_writer.import_run(FIXTURE, root, "st", out)
  assert not os.path.exists(os.path.join(out, "prepared")) and \
      not os.path.exists(os.path.join(out, "st"))
  with pytest.raises(fairseq_data.FairseqDataError, match=r"not found \(the st yaml"):
    run_writer.import_run(FIXTURE, root, "st", out, config_yaml="config_other.yaml")
  with pytest.raises(FileNotFoundError, match="fairseq checkpoint .*missing.pt not found"):
    run_writer.import_run(str(tmp_path / "missing.pt"), root, "st", out)
  assert json.dumps(sorted(os.listdir(tmp_path))) == json.dumps(["en-de"])


def head_selection_checkpoint(path, **args):
  """The head-selection fixture with `args` added to its recorded arguments, reading 80-dim
  features (its first convolution's input widened with random weights) as audio files give."""
  data = np.load(HEAD_SELECTION_FIXTURE)
  arrays = {k: data[k] for k in data.files if k.startswith("sd/")}
  first = "sd/encoder.subsample.conv_layers.0.weight"
  out_channels, _, width = arrays[first].shape
  arrays[first] = np.random.default_rng(1).normal(
      0, 0.1, (out_channels, features_lib.NUM_MEL_BINS, width)).astype(np.float32)
  args = {**json.loads(str(data["args"])), "input_feat_per_channel": features_lib.NUM_MEL_BINS,
          **args}
  np.savez(path, args=json.dumps(args), **arrays)
  return str(path)


def test_a_head_selection_checkpoint_imports_with_the_task_ids_it_trained_with(tmp_path):
  """fairseq's speech_to_text_head_selection numbers the tasks by the sorted languages of the
  training subsets' names (train_SRC_TGT_DOMAIN.tsv): the imported run decodes each utterance
  with those ids, in evaluation and in translating its audio, and a root whose languages
  differ is refused."""
  root, out, wavs = str(tmp_path / "multi"), str(tmp_path / "run"), tmp_path / "wavs"
  subsets = ("de_en_tedx", "fr_es_tedx")
  wavs.mkdir()
  write_root(root, {f"{split}_{subset}": 2 for split in ("train", "dev") for subset in subsets},
             wavs=str(wavs))
  checkpoint = head_selection_checkpoint(
      tmp_path / "hs.npz", task_type="lang",
      train_subset=",".join(f"train_{subset}" for subset in subsets))
  result = run_writer.import_run(checkpoint, root, "st", out)
  config = schema.load_config(out)
  assert (config.model.encoder_task_tag, config.model.decoder_task_tag) == \
      ("source_lang", "target_lang")
  config.eval.batch_frames, config.eval.max_len_b = 300, 12
  ckpt_lib.save_config(out, config)                  # translate reads the run's settings
  scores = scoring.evaluate_stage(config, out, "st", "dev", progress=False)
  with open(os.path.join(scores["directory"], "hyp.txt"), encoding="utf-8") as f:
    through_run = f.read().split("\n")[:-1]

  # The same audio translated: each language's files with its --task / --target_lang.
  for subset, (source, target) in zip(subsets, (("de", "en"), ("fr", "es"))):
    paths = [str(wavs / f"ted_dev_{subset}_{i}.wav") for i in range(2)]
    texts = [r["st"] for r in audio_files.decode_files(out, paths, ("st",), task=source,
                                                         target_lang=target)]
    first = 0 if source == "de" else 2
    assert texts == through_run[first:first + 2], subset

  # Directly, with fairseq's numbering written out: de, fr -> encoder 0, 1; en, es -> decoder.
  model_config, params, _ = run_writer.load_checkpoint(checkpoint)
  data = ip.SplitData(ip.PipelineConfig(result["prepared_dir"], stage="st", specaugment=False,
                                        max_frames=150), "dev")
  assert list(data.tag_values["source_lang"]) == ["de", "de", "fr", "fr"]
  assert list(data.tag_values["domain"]) == ["tedx"] * 4
  search = inference.make_beam_search_for(S2TModel(model_config), config.eval)

  def decode(encoder_names, decoder_names):
    tasks = {"encoder": ip.TaskKey("source_lang", encoder_names),
             "decoder": ip.TaskKey("target_lang", decoder_names)}
    return inference.decode_split(params, ip.Batcher(data, False, tasks=tasks), search,
                                  progress=False)
  assert through_run == decode(("de", "fr"), ("en", "es")) and len(through_run) == 4
  assert through_run != decode(("fr", "de"), ("es", "en"))     # the ids decide the heads

  # The selection analysis reads it: the heads each task selects, from the imported logits.
  analyze.main(["selection", "--workdir", out, "--stage", "st", "--out",
                str(tmp_path / "selection"), "--checkpoint", "latest", "--no_progress"])
  with open(tmp_path / "selection" / "st_encoder_selection.md", encoding="utf-8") as f:
    table = f.read()
  assert "| de | 1 |" in table and "| fr | 1 |" in table

  # The checkpoint trained on other languages: its ids would mean other heads here.
  other = head_selection_checkpoint(tmp_path / "other.npz", task_type="lang",
                                    train_subset="train_de_en_tedx,train_it_es_tedx")
  with pytest.raises(run_writer.FairseqImportError,
                     match=r"encoder selects heads for \['de', 'it'\] .* source_lang \['de', "
                           r"'fr'\]"):
    run_writer.import_run(other, root, "st", str(tmp_path / "other"))
  assert not os.path.exists(tmp_path / "other")
