"""The embedded corpus: real translated text from PyPI wheels, espeak-ng speech, MuST-C layout,
deterministic for a seed, unseen speakers and sentences in dev/test."""

import filecmp
import os
import re

import pytest

import espeakng_loader
import numpy as np

from data_prep import corpora, embedded_corpus, espeak, po_text


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  spec = embedded_corpus.CorpusSpec(max_sentences=40, train_speakers_per_sentence=1,
                                    segments_per_talk=6, heldout_fraction=0.15)
  a = str(tmp_path_factory.mktemp("a"))
  b = str(tmp_path_factory.mktemp("b"))
  embedded_corpus.build(a, spec, workers=1, progress=False)
  embedded_corpus.build(b, spec, workers=1, progress=False)
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
  assert po_text.parse_po(po) == [("Please enter a valid email address.",
                                   "Bitte eine gültige E-Mail-Adresse eingeben.")]
  assert po_text.clean("Delete %(name)s now") is None
  assert po_text.clean("Two words") is None
  assert po_text.clean("  Save   and continue editing ") == "Save and continue editing"


def test_build_is_deterministic_and_in_mustc_layout(built):
  a, b = built
  for split in embedded_corpus.SPLITS:
    txt = os.path.join("en-de", "data", split, "txt")
    for name in (f"{split}.yaml", f"{split}.en", f"{split}.de"):
      assert filecmp.cmp(os.path.join(a, txt, name), os.path.join(b, txt, name), shallow=False)
    wavs = sorted(os.listdir(os.path.join(a, "en-de", "data", split, "wav")))
    assert wavs
    for wav in wavs:
      assert filecmp.cmp(os.path.join(a, "en-de", "data", split, "wav", wav),
                         os.path.join(b, "en-de", "data", split, "wav", wav), shallow=False)
  records = corpora.read_mustc(a, "en-de", "train")
  assert records and all(r.domain in po_text.PACKAGES for r in records)


def test_dev_and_test_have_unseen_speakers_and_sentences(built):
  a, _ = built
  splits = {s: corpora.read_mustc(a, "en-de", s) for s in embedded_corpus.SPLITS}
  train_speakers = {r.speaker for r in splits["train"]}
  train_sentences = {r.source_text for r in splits["train"]}
  for split in ("dev", "tst-COMMON"):
    assert splits[split]
    assert not {r.speaker for r in splits[split]} & train_speakers
    assert not {r.source_text for r in splits[split]} & train_sentences


def test_held_out_splits_have_one_unheard_voice_of_each_sex(built):
  chosen = embedded_corpus.split_variants(seed=0)
  sex = {v: s for s, variants in embedded_corpus.VARIANTS_BY_SEX.items() for v in variants}
  assert sorted(v for vs in chosen.values() for v in vs) == sorted(sex)
  for split in ("dev", "tst-COMMON"):
    assert sorted(sex[v] for v in chosen[split]) == ["female", "male"]
    assert not set(chosen[split]) & set(chosen["train"])
  assert embedded_corpus.split_variants(seed=1) != chosen
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
  variants = [v for vs in embedded_corpus.VARIANTS_BY_SEX.values() for v in vs]
  variants += list(embedded_corpus.EXTRA_TRAINING_VARIANTS)
  first = {v: synth.synthesize(text, espeak.Voice("en-us", v, 160, 40)) for v in variants}
  for v in reversed(variants):
    voice = espeak.Voice("en-us", v, 160, 40)
    for before in (espeak.Voice("en-us", v, 140, 60), voice):
      synth.synthesize(other, before)
      again = synth.synthesize(text, voice)
      assert len(again) > 8000 and np.array_equal(again, first[v]), (v, before)
  # The plain (unsteady) form of a female variant is the counter-example.
  plain = espeak.Voice("en-us", "f2", 160, 40)
  takes = [synth.synthesize(text, plain)]
  synth.synthesize(other, espeak.Voice("en-us", "m3", 150, 50))
  takes.append(synth.synthesize(text, plain))
  assert len(takes[0]) != len(takes[1]) or not np.array_equal(*takes)
  with pytest.raises(ValueError, match="no voice variant 'nosuch'.*valid: .*f2"):
    synth.synthesize(text, espeak.Voice("en-us", "nosuch-steady", 160, 40))


def test_a_build_leaves_no_synthesizer_files_in_the_temporary_directory(tmp_path, monkeypatch):
  """Each worker's espeak-ng data overlay is a temporary directory: the workers must exit on
  their own (not be terminated) for it to be removed."""
  temp = tmp_path / "tmp"
  temp.mkdir()
  monkeypatch.setenv("TMPDIR", str(temp))        # read by the spawned workers
  spec = embedded_corpus.CorpusSpec(max_sentences=12, train_speakers_per_sentence=1,
                                    segments_per_talk=6, heldout_fraction=0.3)
  embedded_corpus.build(str(tmp_path / "corpus"), spec, workers=2, progress=False)
  assert os.listdir(tmp_path / "corpus")
  assert os.listdir(temp) == []


def test_rebuilding_reuses_a_complete_build(built, monkeypatch):
  a, _ = built
  monkeypatch.setattr(embedded_corpus, "_synthesize_talk", lambda job: pytest.fail("redone"))
  spec = embedded_corpus.CorpusSpec(max_sentences=40, train_speakers_per_sentence=1,
                                    segments_per_talk=6, heldout_fraction=0.15)
  assert embedded_corpus.build(a, spec, workers=1, progress=False) == [
      os.path.join(a, "en-de")]
  with pytest.raises(FileExistsError, match="different spec"):
    embedded_corpus.build(a, embedded_corpus.CorpusSpec(seed=1), progress=False)


def _segments(plan, split):
  """The segments of one split of a plan_direction plan, talk after talk."""
  return [s for talk in plan[split] for s in talk]


def test_more_training_speakers_per_variant_leave_the_rest_of_the_plan_alone(built):
  """train_speakers_per_variant: each training voice variant speaks with several (rate, pitch)
  speakers; the held-out splits, every sentence's variant and a build of the default spec
  stay as they were."""
  wheels = po_text.download_wheels(po_text.default_wheel_cache())
  kwargs = dict(max_sentences=40, train_speakers_per_sentence=1, segments_per_talk=6,
                heldout_fraction=0.15)
  one = embedded_corpus.plan_direction(embedded_corpus.CorpusSpec(**kwargs), "en", "de", wheels)
  four = embedded_corpus.plan_direction(
      embedded_corpus.CorpusSpec(**kwargs, train_speakers_per_variant=4), "en", "de", wheels)
  for split in ("dev", "tst-COMMON"):
    assert _segments(one, split) == _segments(four, split)
  by_variant = lambda plan: sorted((s.voice.variant, s.source) for s in _segments(plan, "train"))
  assert by_variant(one) == by_variant(four)
  speakers = {s.voice for s in _segments(four, "train")}
  variants = {v.variant for v in speakers}
  assert len(speakers) > len(variants) == len({s.voice for s in _segments(one, "train")})
  assert all(sum(v.variant == variant for v in speakers) <= 4 for variant in variants)
  assert len({v.speaker_id for v in speakers}) == len(speakers)
  # The default's marker is unchanged; another number of speakers is another build.
  a, _ = built
  assert embedded_corpus.is_built(os.path.join(a, "en-de"), embedded_corpus.CorpusSpec(**kwargs))
  with pytest.raises(FileExistsError, match="different spec"):
    embedded_corpus.is_built(os.path.join(a, "en-de"), embedded_corpus.CorpusSpec(
        **kwargs, train_speakers_per_variant=4))
  with pytest.raises(ValueError, match="speakers per voice variant 0; valid: 1 or more"):
    embedded_corpus.CorpusSpec(train_speakers_per_variant=0)


def _formants(variant: str) -> tuple:
  """F1-F3 frequency factors (percent; 100 when not set) of an espeak-ng variant file."""
  name = variant.removesuffix(espeak.STEADY_SUFFIX)
  path = os.path.join(espeakng_loader.get_data_path(), "voices", "!v", name)
  found = {}
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      match = re.match(r"\s*formant\s+([1-3])\s+(-?\d+)", line.split("//")[0])
      if match:
        found[int(match.group(1))] = int(match.group(2))
  return tuple(found.get(i, 100) for i in (1, 2, 3))


def test_extra_training_variants_have_no_relative_among_the_held_out_candidates():
  """Any variant of VARIANTS_BY_SEX may be held out (the seed draws them): an extra training
  variant shares neither its name (digits and case aside) nor its vowel formants with one."""
  def stem(variant):
    return re.sub(r"[^a-z]", "", variant.removesuffix(espeak.STEADY_SUFFIX).lower())
  candidates = [v for vs in embedded_corpus.VARIANTS_BY_SEX.values() for v in vs]
  extras = embedded_corpus.EXTRA_TRAINING_VARIANTS
  assert len(set(extras)) == len(extras) and not set(extras) & set(candidates)
  assert not {stem(v) for v in extras} & {stem(v) for v in candidates}
  candidate_formants = {_formants(v): v for v in candidates}
  for variant in extras:
    assert _formants(variant) not in candidate_formants, (variant, candidate_formants.get(
        _formants(variant)))
  assert _formants("steph2") == _formants("steph-steady")   # what the check catches


def test_extra_training_variants_join_training_only():
  wheels = po_text.download_wheels(po_text.default_wheel_cache())
  kwargs = dict(max_sentences=60, train_speakers_per_sentence=2, segments_per_talk=6,
                heldout_fraction=0.15)
  plain = embedded_corpus.plan_direction(embedded_corpus.CorpusSpec(**kwargs), "en", "de",
                                         wheels)
  extra = embedded_corpus.plan_direction(
      embedded_corpus.CorpusSpec(**kwargs, extra_training_variants=True), "en", "de", wheels)
  for split in ("dev", "tst-COMMON"):
    assert _segments(plain, split) == _segments(extra, split)
  train = _segments(extra, "train")
  assert sorted(s.source for s in train) == sorted(s.source for s in _segments(plain, "train"))
  assert len({(s.voice, s.source) for s in train}) == len(train)   # two voices per sentence
  variants = {s.voice.variant for s in train}
  assert variants & set(embedded_corpus.EXTRA_TRAINING_VARIANTS)
  assert variants <= set(embedded_corpus.split_variants(0)["train"]) | set(
      embedded_corpus.EXTRA_TRAINING_VARIANTS)
  # The extra variants are mostly male; the share of female speech stays what it was.
  female = set(embedded_corpus.VARIANTS_BY_SEX["female"]) | set(
      embedded_corpus.EXTRA_TRAINING_VARIANTS_BY_SEX["female"])
  share = lambda segments: np.mean([s.voice.variant in female for s in segments])
  assert abs(share(train) - share(_segments(plain, "train"))) < 0.15
  assert share(_segments(plain, "train")) > 0.3
