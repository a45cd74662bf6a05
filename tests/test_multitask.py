"""Multi-task training end to end: a one-to-many corpus (en -> de, fr) with target-language
tags, head selection per target language in encoder and decoder, the KL term, per-task
evaluation, the results table and the selection analysis."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from data_prep import corpora, prepare, vocab
from multiformer_jax import experiment
from multiformer_jax import analyze
from multiformer_jax.analysis import internals
from multiformer_jax.evaluation import decode, scoring
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.training import results_table, train
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
  data = ip.SplitData(experiment.pipeline_config(config, "st"), "train")
  tags = {lang: data.vocab.symbol_id(vocab.lang_tag(lang)) for lang in ("de", "fr")}
  assert None not in tags.values() and len(set(tags.values())) == 2
  batcher = ip.Batcher(data, True)
  batch = batcher.assemble(0, np.arange(4), 0)
  for row in range(4):
    lang = str(data.tag_values["target_lang"][batch["index"][row]])
    assert batch["prev_tokens"][row, 1] == tags[lang]         # EOS, tag, tokens ...
    assert batch["targets"][row, 0] == vocab.PAD_ID            # the tag is not predicted
  # ASR targets (transcripts) get no tag.
  asr = ip.SplitData(experiment.pipeline_config(config, "asr"), "train")
  assert asr.prefix is None


def test_a_single_target_corpus_has_no_tags_and_says_so(prepared):
  config = multitask_config(prepared[1])
  with pytest.raises(ValueError, match=r"no <lang:de> symbol"):
    ip.SplitData(experiment.pipeline_config(config, "st"), "train")


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


# An mTEDx-like dataset: two translation directions with training data, the ASR data of three
# languages (X-X pairs) and one zero-shot direction (dev only) whose source language only the
# ASR data has and whose target language another direction has.
TRANSLATION_PAIRS, ASR_PAIRS, ZERO_SHOT_PAIRS = ("en-de", "fr-en"), ("en-en", "fr-fr", "es-es"), \
    ("es-de",)


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("corpus_mtedx_like"))
  for pair in TRANSLATION_PAIRS + ASR_PAIRS + ZERO_SHOT_PAIRS:
    splits = (("dev", 2),) if pair in ZERO_SHOT_PAIRS else (("train", 3), ("dev", 1))
    for split, talks in splits:
      write_split(root, split, {f"{pair}_{split}{i}": ("wav", *_good_segments(4)[::-1])
                                for i in range(talks)}, pair)
  out = str(tmp_path_factory.mktemp("prepared_mtedx_like"))
  prepare.prepare("mustc", root, list(TRANSLATION_PAIRS + ASR_PAIRS), out, ["train", "dev"],
                  asr_vocab=40, st_vocab=48, workers=1, progress=False,
                  eval_only_pairs=list(ZERO_SHOT_PAIRS))
  return out


def per_stack_config(prepared_dir):
  config = multitask_config(prepared_dir)
  m = config.model
  m.task_tag, m.encoder_task_tag, m.decoder_task_tag = "", "source_lang", "target_lang"
  config.data.pairs = ",".join(TRANSLATION_PAIRS + ASR_PAIRS)
  config.data.eval_only_pairs = ",".join(ZERO_SHOT_PAIRS)
  config.asr.pairs = ",".join(ASR_PAIRS)
  return config


def pairs_of(data):
  return sorted(set(map(str, data.tag_values["pair"])))


def test_each_stage_reads_its_pairs_of_one_prepared_dataset(multilingual):
  config = per_stack_config(multilingual)
  split = lambda stage, name: ip.SplitData(experiment.pipeline_config(config, stage), name)
  # Multilingual ASR on the X-X pairs; ST on the translation directions, the zero-shot one in
  # dev only (eval_only_pairs are not prepared for the training split).
  assert pairs_of(split("asr", "train")) == sorted(ASR_PAIRS)
  assert pairs_of(split("st", "train")) == sorted(TRANSLATION_PAIRS)
  assert pairs_of(split("st", "dev")) == sorted(TRANSLATION_PAIRS + ZERO_SHOT_PAIRS)
  # Rows map to their own features: a row's fbank is its utterance's (frame counts agree).
  data = split("st", "dev")
  assert all(len(data.fbank(i)) == data.n_frames[i] for i in range(len(data)))
  # The target tags are those of the translation directions; X-X text trains only the ASR
  # vocabulary.
  for lang, present in (("de", True), ("en", True), ("es", False), ("fr", False)):
    assert (data.vocab.symbol_id(vocab.lang_tag(lang)) is not None) == present, lang
  config.asr.pairs = "xx-xx"
  with pytest.raises(ValueError, match=r"none of the pairs \['xx-xx'\].*en-en"):
    split("asr", "train")


def test_task_names_are_per_stack_and_the_same_in_both_stages(multilingual):
  config = per_stack_config(multilingual)
  asr, st = experiment.task_keys(config, "asr"), experiment.task_keys(config, "st")
  # The encoder's tasks are the source languages of every training pair, in both stages (the
  # ST encoder starts from the ASR one); the ASR decoder writes the source language.
  assert asr["encoder"] == st["encoder"] == ip.TaskKey("source_lang", ("en", "es", "fr"))
  assert asr["decoder"] == ip.TaskKey("source_lang", ("en", "es", "fr"))
  assert st["decoder"] == ip.TaskKey("target_lang", ("de", "en", "es", "fr"))
  model = experiment.model_config_for(config, 48, st, "st")
  assert (model.stack_num_tasks("encoder"), model.stack_num_tasks("decoder")) == (3, 4)
  # A model keyed by pair has no task for the zero-shot direction: its rows are counted and
  # left out, not decoded with another task's parameters.
  dev = ip.SplitData(experiment.pipeline_config(config, "st"), "dev")
  by_pair = {"encoder": ip.TaskKey("pair", tuple(sorted(TRANSLATION_PAIRS + ASR_PAIRS)))}
  known, left_out = experiment.known_task_rows(dev, by_pair)
  assert pairs_of(known) == sorted(TRANSLATION_PAIRS)
  assert left_out == {"pair es-de": int(np.sum(dev.tag_values["pair"] == "es-de"))}
  assert len(known) + sum(left_out.values()) == len(dev)
  assert known.references == [r for r, p in zip(dev.references, dev.tag_values["pair"])
                              if p != "es-de"]


def test_paper_averages_over_directions_and_languages():
  by_tag = {"pair": {"a-b": {"bleu": 10.0}, "c-b": {"bleu": 20.0}, "d-b": {"bleu": 6.0}},
            "source_lang": {"a": {"wer": 30.0}, "c": {"wer": 50.0}}}
  averages = scoring.paper_averages("st", by_tag, ["a-b", "c-b", "d-b"], ["a-b", "c-b"], [])
  assert averages == {"AVG-A": 12.0, "AVG-T": 15.0, "AVG-Z": 6.0, "zero_shot_pairs": ["d-b"]}
  # A direction the model could not translate leaves AVG-A and AVG-Z undefined, not biased.
  partial = scoring.paper_averages("st", {"pair": {p: by_tag["pair"][p] for p in ("a-b", "c-b")}},
                                    ["a-b", "c-b", "d-b"], ["a-b", "c-b"], ["d-b"])
  assert (partial["AVG-A"], partial["AVG-T"], partial["AVG-Z"]) == (None, 15.0, None)
  assert scoring.paper_averages("asr", by_tag, [], [], []) == {"AVG": 40.0}
  assert results_table.averages({"averages": partial}) == "AVG-A — · AVG-T 15.0 · AVG-Z —"


def test_head_selection_per_stack_with_a_zero_shot_direction_end_to_end(multilingual, tmp_path):
  config = per_stack_config(multilingual)
  config.eval.after_training = True
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  asr, st = results["asr"]["eval"], results["st"]["eval"]
  # Multilingual ASR, scored per language and on average over the languages (Table 2).
  assert set(asr["by_tag"]["source_lang"]) == {"en", "es", "fr"}
  assert asr["averages"]["AVG"] == pytest.approx(
      np.mean([r["wer"] for r in asr["by_tag"]["source_lang"].values()]), abs=0.01)
  # ST on every dev direction, the zero-shot one included: AVG-A / AVG-T / AVG-Z (Table 4).
  bleu = {p: r["bleu"] for p, r in st["by_tag"]["pair"].items()}
  assert set(bleu) == set(TRANSLATION_PAIRS + ZERO_SHOT_PAIRS) and st["left_out"] == {}
  assert st["averages"]["zero_shot_pairs"] == list(ZERO_SHOT_PAIRS)
  assert st["averages"]["AVG-Z"] == pytest.approx(bleu["es-de"], abs=0.01)
  assert st["averages"]["AVG-T"] == pytest.approx(
      np.mean([bleu[p] for p in TRANSLATION_PAIRS]), abs=0.01)
  assert st["averages"]["AVG-A"] == pytest.approx(np.mean(list(bleu.values())), abs=0.01)
  with open(os.path.join(st["directory"], "hyp.txt"), encoding="utf-8") as f:
    assert "<lang:" not in f.read()                         # the forced tag is stripped
  row = results_table.collect_row(workdir, "multi")
  assert row["st_bleu_by_task"].startswith("en-de ") and " · es-de " in row["st_bleu_by_task"]
  assert row["st_bleu_avg"].startswith("AVG-A ") and row["asr_wer_avg"].startswith("AVG ")
  with open(os.path.join(workdir, "st", "log.jsonl"), encoding="utf-8") as f:
    logged = [r for r in map(json.loads, f) if "loss" in r]
  assert logged and all(np.isfinite([r["loss"], r["selection_kl"]]).all() for r in logged)
  # What was learned, per source language (encoder) and target language (decoder).
  out = str(tmp_path / "analysis")
  result = selection_lib.analyze_selection(internals.load_run(workdir, "st"), out)
  assert result["tasks"] == {"encoder": ["en", "es", "fr"], "decoder": ["de", "en", "es", "fr"]}
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
  for split, talks in (("train", 3), ("dev", 1)):     # the splits share audios/: unique names
    _write_europarl(europarl, "es-en", split, {
        f"{split}{i}": (lambda segs, end: (end, segs))(*_good_segments(4))
        for i in range(talks)})
  out = str(tmp_path / "prepared")
  summary = prepare.prepare("mtedx,europarl_st", f"{mtedx},{europarl}", ["es-en"], out,
                            ["train", "dev"], asr_vocab=40, st_vocab=40, workers=1,
                            progress=False)
  assert summary["splits"] == {"train": 24, "dev": 8}
  config = tiny_config(out)
  config.model.task_tag = "domain"
  data = ip.SplitData(experiment.pipeline_config(config, "st"), "dev")
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
