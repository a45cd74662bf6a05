"""Multi-task training end to end: a one-to-many corpus (en -> de, fr) with target-language
tags, head selection per target language in encoder and decoder, the KL term, per-task
evaluation, the results table and the selection analysis."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from data_prep import corpora, prepare, vocab
from multiformer_jax import ablate, analyze, decode, evaluate
from multiformer_jax import input_pipeline as ip
from multiformer_jax import train
from multiformer_jax.analysis import selection as selection_lib
from tests.conftest import _good_segments, write_split
from tests.test_train import tiny_config

PAIRS = ("en-de", "en-fr")


@pytest.fixture(scope="module")
def one_to_many(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("corpus_multi"))
  for pair in PAIRS:
    for split, talks in (("train", 4), ("dev", 2)):
      write_split(root, split, {f"{pair}_{split}{i}": ("wav", *_good_segments(5)[::-1])
                                for i in range(talks)}, pair)
  out = str(tmp_path_factory.mktemp("prepared_multi"))
  prepare.prepare("mustc", root, list(PAIRS), out, ["train", "dev"], asr_vocab=40,
                  st_vocab=48, workers=1, progress=False)
  return out


def multitask_config(prepared_dir):
  config = tiny_config(prepared_dir, max_updates=4, eval_every=4)
  m = config.model
  m.encoder_heads, m.encoder_candidates, m.decoder_candidates = 2, 4, 4
  m.task_tag = "target_lang"
  config.data.pairs = ",".join(PAIRS)
  config.data.target_lang_tag = True
  config.train.kl_weight = 0.5
  config.train.selection_temperature_decay = 0.1
  return config


def test_target_language_tags_prefix_the_targets_and_stay_out_of_the_loss(one_to_many):
  config = multitask_config(one_to_many)
  data = ip.SplitData(train.pipeline_config(config, "st"), "train")
  tags = {lang: data.vocab.symbol_id(vocab.lang_tag(lang)) for lang in ("de", "fr")}
  assert None not in tags.values() and len(set(tags.values())) == 2
  batcher = ip.Batcher(data, True)
  batch = batcher.assemble(0, np.arange(4), 0)
  for row in range(4):
    lang = batcher.tags["target_lang"][batch["target_lang"][row]]
    assert batch["prev_tokens"][row, 1] == tags[lang]         # EOS, tag, tokens ...
    assert batch["targets"][row, 0] == vocab.PAD_ID            # the tag is not predicted
  # ASR targets (transcripts) get no tag.
  asr = ip.SplitData(train.pipeline_config(config, "asr"), "train")
  assert asr.prefix is None


def test_a_single_target_corpus_has_no_tags_and_says_so(prepared):
  config = multitask_config(prepared[1])
  with pytest.raises(ValueError, match=r"no <lang:de> symbol"):
    ip.SplitData(train.pipeline_config(config, "st"), "train")


def test_forced_prefix_in_beam_search():
  vocab_size, beam = 7, 2

  def step_fn(tokens, i, cache):                 # prefers token 5, then EOS
    logits = jnp.where(i == 0, jnp.array([0, 0, -9, 0, 0, 3.0, 0]), jnp.array(
        [0, 0, 3.0, 0, 0, 0, 0]))
    return jnp.tile(logits, (tokens.shape[0], 1)), cache
  tokens, _ = decode.beam_search(step_fn, jnp.zeros(4), 2, beam, 4, jnp.array([3, 3]),
                                 vocab_size, prefix_tokens=jnp.array([4, 6]))
  assert np.asarray(tokens)[:, 0].tolist() == [4, 6]
  free, _ = decode.beam_search(step_fn, jnp.zeros(4), 2, beam, 4, jnp.array([3, 3]),
                               vocab_size)
  assert np.asarray(free)[:, 0].tolist() == [5, 5]


def test_head_selection_run_end_to_end(one_to_many, tmp_path):
  config = multitask_config(one_to_many)
  config.eval.after_training = True
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  st = results["st"]["eval"]
  assert set(st["by_tag"]["target_lang"]) == {"de", "fr"}
  assert set(st["by_tag"]["pair"]) == set(PAIRS)
  assert sum(r["utterances"] for r in st["by_tag"]["target_lang"].values()) == st["utterances"]
  with open(os.path.join(workdir, "st", "eval_dev", "hyp.txt"), encoding="utf-8") as f:
    assert "<lang:" not in f.read()                         # the forced tag is stripped
  row = ablate.collect_row(workdir, "multi")
  assert row["st_bleu_by_task"].startswith("de ") and " · fr " in row["st_bleu_by_task"]
  with open(os.path.join(workdir, "st", "log.jsonl"), encoding="utf-8") as f:
    logged = [r for r in map(json.loads, f) if "loss" in r]
  assert logged and all(np.isfinite([r["loss"], r["selection_kl"]]).all() for r in logged)
  # What was learned, per target language: plots and tables.
  out = str(tmp_path / "analysis")
  analyze.main(["selection", "--workdir", workdir, "--stage", "st", "--out", out])
  for name in ("encoder_selected.png", "encoder_shared.png", "encoder_load.png",
               "decoder_load.png", "encoder_kinds.md", "encoder_selection.csv", "drift.md"):
    assert os.path.exists(os.path.join(out, f"st_{name}")), name
  with pytest.raises(SystemExit, match="analyze selection"):
    analyze.main(["heads", "--workdir", workdir, "--stage", "st", "--out", out])


def test_selection_statistics():
  masks = np.zeros((3, 2, 4), bool)            # [tasks, layers, H'], 2 of 4 per layer
  masks[0, :, :2] = masks[1, :, :2] = True     # tasks 0 and 1 share everything
  masks[2, :, 2:] = True                       # task 2 shares nothing
  np.testing.assert_allclose(selection_lib.shared_heads(masks),
                             [[1, 1, 0], [1, 1, 0], [0, 0, 1]])
  np.testing.assert_array_equal(selection_lib.head_load(masks), [[2, 2, 1, 1], [2, 2, 1, 1]])
  labels = [["full", "local(3)", "conv(3,2)", "kernel(8)"]] * 2
  rows = selection_lib.kinds_per_task(masks, labels, ["a", "b", "c"])
  assert rows[0] == {"task": "a", "conv": 0, "full": 2, "kernel": 0, "local": 2}
  assert rows[2] == {"task": "c", "conv": 2, "full": 0, "kernel": 2, "local": 0}
  np.testing.assert_array_equal(
      selection_lib.selection_masks(np.array([[[0.1, 0.9, 0.5, 0.2]]]), 2, "subset"),
      [[[False, True, True, False]]])


def _write_europarl(root, pair, split, talks):
  """Europarl-ST layout: {root}/{src}/{tgt}/{split}/segments.{lst,src,tgt} and
  {root}/{src}/audios/{speech}.wav."""
  import soundfile  # pylint: disable=import-outside-toplevel
  from tests.conftest import _audio  # pylint: disable=import-outside-toplevel
  src, tgt = pair.split("-")
  split_dir = os.path.join(root, src, tgt, split)
  audio_dir = os.path.join(root, src, "audios")
  os.makedirs(split_dir, exist_ok=True)
  os.makedirs(audio_dir, exist_ok=True)
  lines = {"lst": [], src: [], tgt: []}
  for name, (seconds, segments) in talks.items():
    soundfile.write(os.path.join(audio_dir, f"{name}.wav"), _audio(seconds), 16000)
    for offset, duration, source, target in segments:
      lines["lst"].append(f"{name} {offset} {offset + duration:.2f}\n")
      lines[src].append(source + "\n")
      lines[tgt].append(target + "\n")
  for ext, content in lines.items():
    with open(os.path.join(split_dir, f"segments.{ext}"), "w", encoding="utf-8") as f:
      f.writelines(content)


def test_two_corpora_prepare_as_one_multi_domain_dataset(tmp_path):
  """mTEDx (flac, splits train/valid) and Europarl-ST layouts prepared together: one split
  name serves both (dev = mTEDx's valid) and each utterance's domain is its corpus."""
  import soundfile  # pylint: disable=import-outside-toplevel
  mtedx, europarl = str(tmp_path / "mtedx"), str(tmp_path / "europarl")
  for split, talks in (("train", 3), ("valid", 1)):
    write_split(mtedx, split, {f"t{i}": ("wav", *_good_segments(4)[::-1])
                               for i in range(talks)}, "es-en")
    wav_dir = os.path.join(mtedx, "es-en", "data", split, "wav")
    for name in os.listdir(wav_dir):               # mTEDx ships flac
      audio, rate = soundfile.read(os.path.join(wav_dir, name))
      soundfile.write(os.path.join(wav_dir, name.replace(".wav", ".flac")), audio, rate)
      os.remove(os.path.join(wav_dir, name))
    yaml_path = os.path.join(mtedx, "es-en", "data", split, "txt", f"{split}.yaml")
    with open(yaml_path, encoding="utf-8") as f:
      text = f.read().replace(".wav}", ".flac}")
    with open(yaml_path, "w", encoding="utf-8") as f:
      f.write(text)
  for split, talks in (("train", 3), ("dev", 1)):
    _write_europarl(europarl, "es-en", split, {
        f"t{i}": (lambda segs, end: (end, segs))(*_good_segments(4)) for i in range(talks)})
  out = str(tmp_path / "prepared")
  summary = prepare.prepare("mtedx,europarl_st", f"{mtedx},{europarl}", ["es-en"], out,
                            ["train", "dev"], asr_vocab=40, st_vocab=40, workers=1,
                            progress=False)
  assert summary["splits"] == {"train": 24, "dev": 8}
  config = tiny_config(out)
  config.model.task_tag = "domain"
  data = ip.SplitData(train.pipeline_config(config, "st"), "dev")
  assert sorted(set(data.tag_values["domain"])) == ["europarl", "mtedx"]
  assert len(set(data.ids)) == len(data.ids)                   # ids stay unique
  with pytest.raises(ValueError, match="one root per corpus"):
    prepare.prepare("mtedx,europarl_st", mtedx, ["es-en"], str(tmp_path / "x"), ["train"])


def _write_covost(root, src, tgt, clips):
  """CoVoST 2 layout: {root}/{src}/validated.tsv + clips/*.mp3 (Common Voice) and
  {root}/{src}/covost_v2.{src}_{tgt}.tsv. clips: [(name, kind, split, sentence, translation)];
  kind 'mp3' | 'corrupt' | 'absent' (in the CoVoST tsv only)."""
  import soundfile  # pylint: disable=import-outside-toplevel
  from tests.conftest import _audio  # pylint: disable=import-outside-toplevel
  base = os.path.join(root, src)
  os.makedirs(os.path.join(base, "clips"), exist_ok=True)
  validated = ["client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccent"]
  covost = ["path\tsentence\ttranslation\tclient_id\tsplit"]
  for k, (name, kind, split, sentence, translation) in enumerate(clips):
    path = f"{name}.mp3"
    if kind == "mp3":
      soundfile.write(os.path.join(base, "clips", path), _audio(1.0 + 0.1 * k), 16000,
                      format="MP3")
    elif kind == "corrupt":
      with open(os.path.join(base, "clips", path), "wb") as f:
        f.write(b"ID3 not an mp3" * 10)
    if kind != "absent":
      validated.append(f"client{k % 2}\t{path}\t{sentence}\t2\t0\t\t\t")
    covost.append(f"{path}\t{sentence}\t{translation}\tclient{k % 2}\t{split}")
  for name, lines in (("validated.tsv", validated), (f"covost_v2.{src}_{tgt}.tsv", covost)):
    with open(os.path.join(base, name), "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")


def test_covost2_reads_and_prepares_like_fairsegs_recipe(tmp_path):
  """Clips joined on path (a CoVoST row without its Common Voice clip is dropped), train =
  train + train_covost; a corrupt clip and an empty translation are skipped with reasons."""
  root = str(tmp_path / "cv")
  words = "le chat dort sur la table pendant que le chien mange".split()
  clips = [(f"c{k}", "mp3", "train" if k % 2 else "train_covost",
            " ".join(words[k % 4:k % 4 + 5]), f"the cat {k} sleeps on the table") for k in range(8)]
  clips += [("bad", "corrupt", "train", "le chat", "the cat"),
            ("empty", "mp3", "train", "le chien", ""),
            ("gone", "absent", "train", "la table", "the table"),
            ("d0", "mp3", "dev", "le chat dort", "the cat sleeps"),
            ("d1", "mp3", "dev", "le chien mange", "the dog eats"),
            ("t0", "mp3", "test", "la table", "the table")]
  _write_covost(root, "fr", "en", clips)
  train_records = corpora.read_covost2(root, "fr-en", "train")
  assert sorted(r.id for r in train_records) == sorted(
      [f"c{k}" for k in range(8)] + ["bad", "empty"])
  first = next(r for r in train_records if r.id == "c0")
  assert (first.source_text, first.speaker, first.whole_file) == ("le chat dort sur la",
                                                                  "client0", True)
  assert [r.id for r in corpora.read_corpus("covost2", root, "fr-en", "valid")] == ["d0", "d1"]
  out = str(tmp_path / "prepared")
  summary = prepare.prepare("covost2", root, ["fr-en"], out, ["train", "dev"], asr_vocab=30,
                            st_vocab=30, workers=1, progress=False)
  assert summary["splits"] == {"train": 8, "dev": 2}
  with open(os.path.join(out, "prep_report.json"), encoding="utf-8") as f:
    report = json.load(f)["train"]
  assert report["skipped"] == {"unreadable audio": 1, "empty text": 1}
  with pytest.raises(corpora.CorpusLayoutError, match=r"missing .*covost_v2.fr_de.tsv"):
    corpora.read_covost2(root, "fr-de", "train")
  with pytest.raises(ValueError, match="unknown covost2 split 'tst-HE'"):
    corpora.read_covost2(root, "fr-en", "tst-HE")
