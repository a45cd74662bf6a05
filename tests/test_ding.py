"""The Ding dictionary text source: parsing, filtering, normalisation, fetching, fallback."""

import os
import shutil
import stat
import subprocess

import pytest

from data_prep.embedded.text import ding

LINES = [
    "# Version :: 1.9\n",
    "kein Zuckerlecken sein {v} | Es war kein Vergnügen. | Das Leben ist kein Zuckerschlecken. "
    ":: to be no picnic | It was no picnic. | Life’s not a bowl of cherries.\n",
    # variants: the first of each side; a slot with a slash or brackets is left out
    "Leistung {f} | Das ist eine beachtliche Leistung.; Das ist keine leichte Aufgabe. | Es war "
    "kein leichtes/einfaches Unterfangen. :: feat | This is no mean feat. | It was no "
    "mean/small feat.\n",
    # slot counts differ: pairing unknown, nothing kept
    "Haus {n} | Das Haus ist alt. :: house | The house is old. | The home is old.\n",
    # digits, too short, no final punctuation, lower-case start
    "Zahl | Ich habe 3 Katzen. | Ja. | Das ist gut | er kommt. :: number | I have 3 cats. | "
    "Yes. | That is good | he is coming.\n",
    "Zitat | Sie sagte „Nein“. | „Nein“, sagte sie. :: quote | She said “no” – again. | "
    "“No,” she said.\n",
]


def test_parse_keeps_whole_sentences_slot_by_slot_and_normalises():
  pairs = [p for line in LINES for p in ding.parse_line(line)]
  assert pairs == [("It was no picnic.", "Es war kein Vergnügen."),
                   ("Life's not a bowl of cherries.", "Das Leben ist kein Zuckerschlecken."),
                   ("This is no mean feat.", "Das ist eine beachtliche Leistung."),
                   ('She said "no" - again.', 'Sie sagte "Nein".')]     # not: a quote first


def test_sentence_pairs_keep_an_english_sentence_once(tmp_path):
  path = tmp_path / "de-en"
  path.write_text("".join(LINES) + LINES[1].replace("Vergnügen", "Spaß"), encoding="utf-8")
  pairs = ding.sentence_pairs(str(path))
  assert [e for e, _ in pairs].count("It was no picnic.") == 1
  assert dict(pairs)["It was no picnic."] == "Es war kein Vergnügen."     # the first kept


def test_without_apt_the_error_says_how_to_get_the_package(tmp_path, monkeypatch):
  monkeypatch.setattr(shutil, "which", lambda tool: None)
  with pytest.raises(ding.DingUnavailable, match=r"apt-get and dpkg-deb not found.*apt-get "
                                                 r"download trans-de-en"):
    ding.fetch(str(tmp_path))


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_fetch_downloads_and_unpacks_once_without_root(tmp_path, monkeypatch):
  """A stand-in apt-get (on PATH) hands over a real .deb built here; fetch unpacks it."""
  package = tmp_path / "pkg"
  (package / "DEBIAN").mkdir(parents=True)
  (package / "DEBIAN" / "control").write_text(
      "Package: trans-de-en\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n"
      "Description: test\n", encoding="utf-8")
  target = package / ding.DICTIONARY
  target.parent.mkdir(parents=True)
  target.write_text(LINES[1], encoding="utf-8")
  deb = tmp_path / "trans-de-en_1.0_all.deb"
  subprocess.run(["dpkg-deb", "--build", str(package), str(deb)], check=True,
                 capture_output=True)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "apt-get"
  fake.write_text(f"#!/bin/sh\necho $@ >> {tmp_path / 'calls'}\ncp {deb} .\n", encoding="utf-8")
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  cache = str(tmp_path / "cache")
  path = ding.fetch(cache)
  assert ding.sentence_pairs(path)[0] == ("It was no picnic.", "Es war kein Vergnügen.")
  assert ding.fetch(cache) == path                                 # cached: no second call
  assert (tmp_path / "calls").read_text().split("\n")[:-1] == ["download trans-de-en"]


def test_the_embedded_corpus_falls_back_to_the_catalogs_with_a_warning(monkeypatch):
  from data_prep.embedded import text
  from data_prep.embedded import spec as spec_lib

  def unavailable(cache):
    raise ding.DingUnavailable("apt-get and dpkg-deb not found: ...")
  monkeypatch.setattr(ding, "fetch", unavailable)
  said = []
  spec = spec_lib.CorpusSpec(text=("catalogs", "ding"))
  assert text.ding_pairs(spec, "en", "de", said.append) == []
  assert "without the Ding sentences (apt-get and dpkg-deb not found" in said[0]
  assert text.ding_pairs(spec_lib.CorpusSpec(), "en", "de", said.append) == []     # not asked for
  assert text.ding_pairs(spec, "es", "en", said.append) == []                # not German-English
  assert len(said) == 1


def test_ding_sentences_join_the_plan_with_unseen_heldout_sentences(monkeypatch, tmp_path):
  from data_prep.embedded import plan, text
  from data_prep.embedded import spec as spec_lib
  path = tmp_path / "de-en"
  lines = [f"Wort {i} | Der Satz Nummer {'x' * (i % 7 + 1)} ist {'gut' if i % 2 else 'schlecht'}"
           f" und lang. :: word | The sentence number {'x' * (i % 7 + 1)} is "
           f"{'good' if i % 2 else 'bad'} and {'y' * (i // 14 + 1)}.\n" for i in range(200)]
  path.write_text("".join(lines).replace("Wort 1", "Wort"), encoding="utf-8")
  monkeypatch.setattr(ding, "fetch", lambda cache: str(path))
  monkeypatch.setattr(text.catalogs, "sentence_pairs", lambda wheel, language: [])
  spec = spec_lib.CorpusSpec(text=("ding",), max_heldout=5)
  extra = text.ding_pairs(spec, "en", "de")
  assert len(extra) > 20 and all(domain == "ding" for _, _, domain in extra)
  planned = plan.plan_direction(spec, "en", "de",
                                text.direction_pairs(spec, "en", "de", {"x": "wheel"}, extra))
  texts = {split: {s.source for talk in talks for s in talk} for split, talks in planned.items()}
  assert len(texts["dev"]) == len(texts["tst-COMMON"]) == 5
  assert not (texts["dev"] | texts["tst-COMMON"]) & texts["train"]


def test_a_bad_text_source_names_the_valid_ones():
  from data_prep.embedded import build
  from data_prep.embedded import spec as spec_lib
  with pytest.raises(ValueError, match="'catalogs,wiki'; valid: comma-separated catalogs, ding"):
    spec_lib.CorpusSpec(text=("catalogs", "wiki"))
  with pytest.raises(SystemExit):
    build.main(["--out", "unused", "--text", "wiki"])


def test_the_quickstart_builds_the_ding_corpus(monkeypatch, tmp_path):
  """run.py builds the embedded corpus the quickstart names: Ding + catalogs, one voice per
  training sentence, 300 held-out sentences per split."""
  import logging
  from configs import quickstart
  from data_prep import prepare
  from data_prep.embedded import build
  from multiformer_jax.training import data_setup
  built, prepared = [], []
  monkeypatch.setattr(build, "build", lambda root, spec: built.append((root, spec)))
  monkeypatch.setattr(prepare, "prepare", lambda *args, **kwargs: prepared.append(args))
  config = quickstart.get_config("ding")
  config.data.prepared_dir = str(tmp_path / "prepared")
  data_setup.ensure_prepared(config, logging.getLogger("test"))
  (root, spec), = built
  assert (spec.text, spec.train_speakers_per_sentence, spec.max_heldout) == (
      ("catalogs", "ding"), 1, 300)
  assert root == config.data.root and prepared[0][1] == config.data.root


def test_a_prepared_quickstart_refuses_an_embedded_corpus_of_another_spec(tmp_path):
  """A corpus built with another spec or speaker set under data.root is not silently trained
  on because data.prepared_dir exists: run.py names it and says what to remove."""
  import json
  import logging
  from configs import quickstart
  from data_prep.embedded import build
  from data_prep.embedded import spec as spec_lib
  from multiformer_jax.training import data_setup
  config = quickstart.get_config("ding")
  config.data.root, config.data.prepared_dir = str(tmp_path / "corpus"), str(tmp_path / "prep")
  e = config.data.embedded
  e.recorded_train, e.spoken_dialogue, e.real_test = "", "", ""   # no game fetched here
  (tmp_path / "prep").mkdir()
  (tmp_path / "prep" / "prepared.json").write_text("{}")
  spec = spec_lib.CorpusSpec(text=("catalogs", "ding"), seed=e.seed,
                             train_speakers_per_sentence=1, max_heldout=300,
                             narrowband_share=e.narrowband_share)
  marker = tmp_path / "corpus" / "en-de" / build.COMPLETE
  marker.parent.mkdir(parents=True)
  marker.write_text(json.dumps({"spec": build._spec_json(spec)}))
  data_setup.ensure_prepared(config, logging.getLogger("test"))        # the same spec: used
  older = json.loads(build._spec_json(spec))
  older["voices"]["tst-COMMON"] = ["mike2", "shelby"]
  marker.write_text(json.dumps({"spec": json.dumps(older, sort_keys=True)}))
  with pytest.raises(FileExistsError, match="en-de was built with a different spec or speaker "
                                            "set; remove it .*data.root"):
    data_setup.ensure_prepared(config, logging.getLogger("test"))
