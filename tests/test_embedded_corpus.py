"""The embedded corpus: real translated text from PyPI wheels, espeak-ng speech, MuST-C layout,
deterministic for a seed, unseen speakers and sentences in dev/test."""

import filecmp
import os

import pytest

from data_prep import corpora, embedded_corpus, po_text


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


def test_rebuilding_reuses_a_complete_build(built, monkeypatch):
  a, _ = built
  monkeypatch.setattr(embedded_corpus, "_synthesize_talk", lambda job: pytest.fail("redone"))
  spec = embedded_corpus.CorpusSpec(max_sentences=40, train_speakers_per_sentence=1,
                                    segments_per_talk=6, heldout_fraction=0.15)
  assert embedded_corpus.build(a, spec, workers=1, progress=False) == [
      os.path.join(a, "en-de")]
  with pytest.raises(FileExistsError, match="different spec"):
    embedded_corpus.build(a, embedded_corpus.CorpusSpec(seed=1), progress=False)
