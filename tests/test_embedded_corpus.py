"""The embedded corpus: real translated text from PyPI wheels, espeak-ng speech, MuST-C layout,
deterministic for a seed, unseen speakers and sentences in dev/test."""

import filecmp
import os

import pytest

import numpy as np

from data_prep import corpora
from data_prep.embedded import build, plan, spec as spec_lib
from data_prep.embedded.text import catalogs
from data_prep.embedded.voices import Voice, espeak


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  spec = spec_lib.CorpusSpec(max_sentences=40, train_speakers_per_sentence=1,
                             segments_per_talk=6, heldout_fraction=0.15, seed=0)
  a = str(tmp_path_factory.mktemp("a"))
  b = str(tmp_path_factory.mktemp("b"))
  build.build(a, spec, workers=1, progress=False)
  build.build(b, spec, workers=1, progress=False)
  return a, b


def test_po_parser_keeps_translated_sentences_only():
  po = '''
msgid ""
msgstr "Content-Type: text/plain; charset=UTF-8\\n"

#: a.py:1
msgid "Please enter a valid "
"email address."
msgstr "Bitte eine gültige "
"E-Mail-Adresse eingeben."

#, fuzzy
msgid "This one is fuzzy"
msgstr "Das ist unsicher"

msgid "Not translated here"
msgstr ""

msgid "One item"
msgid_plural "Many items"
msgstr[0] "Ein Element"
'''
  assert catalogs.parse_po(po) == [("Please enter a valid email address.",
                                   "Bitte eine gültige E-Mail-Adresse eingeben.")]
  assert catalogs.clean("Delete %(name)s now") is None
  assert catalogs.clean("Two words") is None
  assert catalogs.clean("  Save   and continue editing ") == "Save and continue editing"


def test_build_is_deterministic_and_in_mustc_layout(built):
  a, b = built
  for split in spec_lib.SPLITS:
    txt = os.path.join("en-de", "data", split, "txt")
    for name in (f"{split}.yaml", f"{split}.en", f"{split}.de"):
      assert filecmp.cmp(os.path.join(a, txt, name), os.path.join(b, txt, name), shallow=False)
    wavs = sorted(os.listdir(os.path.join(a, "en-de", "data", split, "wav")))
    assert wavs
    for wav in wavs:
      assert filecmp.cmp(os.path.join(a, "en-de", "data", split, "wav", wav),
                         os.path.join(b, "en-de", "data", split, "wav", wav), shallow=False)
  records = corpora.read_mustc(a, "en-de", "train")
  assert records and all(r.domain in catalogs.PACKAGES for r in records)


def test_dev_and_test_have_unseen_speakers_and_sentences(built):
  a, _ = built
  splits = {s: corpora.read_mustc(a, "en-de", s) for s in spec_lib.SPLITS}
  train_speakers = {r.speaker for r in splits["train"]}
  train_sentences = {r.source_text for r in splits["train"]}
  for split in ("dev", "tst-COMMON"):
    assert splits[split]
    assert not {r.speaker for r in splits[split]} & train_speakers
    assert not {r.source_text for r in splits[split]} & train_sentences


def test_held_out_splits_have_one_unheard_voice_of_each_sex(built):
  chosen = plan.split_variants(seed=0)
  sex = {v: s for s, variants in plan.VARIANTS_BY_SEX.items() for v in variants}
  assert sorted(v for vs in chosen.values() for v in vs) == sorted(sex)
  for split in ("dev", "tst-COMMON"):
    assert sorted(sex[v] for v in chosen[split]) == ["female", "male"]
    assert not set(chosen[split]) & set(chosen["train"])
  assert plan.split_variants(seed=1) != chosen
  a, _ = built
  for split in ("dev", "tst-COMMON"):
    variants = {r.speaker.split("_")[1] for r in corpora.read_mustc(a, "en-de", split)}
    assert variants <= set(chosen[split])


def test_every_voice_gives_the_same_audio_whatever_was_synthesised_before():
  """espeak-ng's flutter and roughness carry state across utterances, and so does the echo of
  variants that have one (f5, Storm): the corpus' voices (the steady copies among them) must
  not, after another voice or after the same one."""
  synth = espeak.Synthesizer()
  text, other = "She listened in silence.", "Pardon me for interrupting you, it is late."
  variants = [v for vs in plan.VARIANTS_BY_SEX.values() for v in vs]
  first = {v: synth.synthesize(text, Voice("en-us", v, 160, 40)) for v in variants}
  for v in reversed(variants):
    voice = Voice("en-us", v, 160, 40)
    for before in (Voice("en-us", v, 140, 60), voice):
      synth.synthesize(other, before)
      again = synth.synthesize(text, voice)
      assert len(again) > 8000 and np.array_equal(again, first[v]), (v, before)
  # The plain (unsteady) form of a female variant is the counter-example.
  plain = Voice("en-us", "f2", 160, 40)
  takes = [synth.synthesize(text, plain)]
  synth.synthesize(other, Voice("en-us", "m3", 150, 50))
  takes.append(synth.synthesize(text, plain))
  assert len(takes[0]) != len(takes[1]) or not np.array_equal(*takes)
  with pytest.raises(ValueError, match="no voice variant 'nosuch'.*valid: .*f2"):
    synth.synthesize(text, Voice("en-us", "nosuch-steady", 160, 40))


def test_a_build_leaves_no_synthesizer_files_in_the_temporary_directory(tmp_path, monkeypatch):
  """Each worker's espeak-ng data overlay is a temporary directory: the workers must exit on
  their own (not be terminated) for it to be removed."""
  temp = tmp_path / "tmp"
  temp.mkdir()
  monkeypatch.setenv("TMPDIR", str(temp))        # read by the spawned workers
  spec = spec_lib.CorpusSpec(max_sentences=12, train_speakers_per_sentence=1,
                             segments_per_talk=6, heldout_fraction=0.3)
  build.build(str(tmp_path / "corpus"), spec, workers=2, progress=False)
  assert os.listdir(tmp_path / "corpus")
  assert os.listdir(temp) == []


def test_rebuilding_reuses_a_complete_build(built, monkeypatch):
  a, _ = built
  monkeypatch.setattr(build, "_synthesize_talk", lambda job: pytest.fail("redone"))
  spec = spec_lib.CorpusSpec(max_sentences=40, train_speakers_per_sentence=1,
                             segments_per_talk=6, heldout_fraction=0.15, seed=0)
  assert build.build(a, spec, workers=1, progress=False) == [
      os.path.join(a, "en-de")]
  with pytest.raises(FileExistsError, match="different spec"):
    build.build(a, spec_lib.CorpusSpec(seed=1), progress=False)


def test_every_setting_is_one_field_read_the_same_from_a_config_and_from_flags():
  """CorpusSpec defines the settings once: the config keys and the flags are its fields, with
  its defaults, and both read back into the same specs."""
  import argparse
  from multiformer_jax import schema
  defaults = spec_lib.config_defaults()
  assert dict(schema.base_config().data.embedded) == defaults
  assert set(defaults) <= set(spec_lib.FIELDS)
  parser = argparse.ArgumentParser()
  spec_lib.add_arguments(parser)
  args = parser.parse_args(["--target", "de,es", "--text", "catalogs,bible",
                            "--train-speakers-per-sentence", "1", "--max-sentences", "9"])
  from_flags = spec_lib.specs_from_arguments(args)
  from_config = spec_lib.specs_from_settings(
      {**defaults, "target": "de,es", "text": "catalogs,bible",
       "train_speakers_per_sentence": 1, "max_sentences": 9})
  assert from_flags == from_config
  assert [s.target for s in from_flags] == ["de", "es"]
  assert from_flags[0] == spec_lib.CorpusSpec(text=("catalogs", "bible"),
                                              train_speakers_per_sentence=1, max_sentences=9)
  with pytest.raises(ValueError, match="settings \\['speakers'\\] do not exist; valid: sources"):
    spec_lib.specs_from_settings({"speakers": 2})
  with pytest.raises(ValueError, match="language\\(s\\) \\['xx'\\]; valid"):
    spec_lib.CorpusSpec(target="xx")
