"""The embedded corpus's Bible text (English-Spanish verses) and its other synthesizers (flite,
festival, MBROLA, RHVoice): markup cleaned, verses filtered and deduplicated, held-out sentences
never trained on; the synthesizers driven through stand-in programs (RHVoice through a stand-in
of its library); what cannot be had is named and left out; the unseen-synthesizer split speaks
tst-COMMON's sentences in a family no training or dev utterance uses; `data_prep.speak` records
a text's lines with any of them."""

import ctypes
import json
import os
import stat
import sys
import wave

import numpy as np
import pytest

from multiformer_common import packages
from data_prep.embedded import build, plan, speak, text, voices
from data_prep.embedded import spec as spec_lib
from data_prep.embedded.text import bible
from data_prep.embedded.voices import Voice, common, festival, flite, mbrola, rhvoice


def _plan(spec, source, target, wheels, extra_pairs=()):
  """plan_direction over the direction's pairs: the catalogs of `wheels`, then extra_pairs."""
  return plan.plan_direction(spec, source, target,
                             text.direction_pairs(spec, source, target, wheels, extra_pairs))

WEB_JOHN_3_16 = (
    '<q marker="" who="Jesus"><w lemma="strong:G1063">For</w> <w lemma="strong:G2316">God</w> '
    'so loved the world, that he gave his only born</q><note placement="foot"><reference '
    'type="annotateRef">3:16 </reference>The phrase “only born” is from the Greek.</note><q '
    'marker="" who="Jesus"><w lemma="strong:G5207">Son</w>, that whoever believes in him '
    'should not perish, but have eternal life. </q>')


def test_markup_is_removed_and_a_footnote_leaves_a_space():
  assert bible.clean(WEB_JOHN_3_16) == (
      "For God so loved the world, that he gave his only born Son, that whoever believes in "
      "him should not perish, but have eternal life.")
  assert bible.clean(" ¶ Y dijo Dios: Sea la luz: y fué la luz. ") == \
      "Y dijo Dios: Sea la luz: y fué la luz."
  assert bible.clean("que ha dado á su Hijo, y ó dos") == "que ha dado a su Hijo, y o dos"


def test_verses_are_filtered_and_each_english_text_kept_once():
  verses = [
      ("Gen 1:1", "In the beginning, God created the heavens and the earth.",
       "En el principio crió Dios los cielos y la tierra."),
      ("Gen 1:3", "God said, \"Let there be light,\" and there was light.",
       "Y dijo Dios: Sea la luz: y fué la luz."),
      ("Exo 6:10", "Yahweh spoke to Moses, saying,", "Y habló Jehová á Moisés, diciendo:"),
      ("Lev 4:1", "Yahweh spoke to Moses, saying.", "Y habló Jehová á Moisés, diciendo:"),
      ("Num 1:1", "Yahweh spoke to Moses, saying.", "Habló Jehová á Moisés."),   # repeated
      ("Num 7:12", "He who offered his offering the first day was Nahshon.",
       "Y el que ofreció su ofrenda el primer día fué Naasón hijo de Aminadab, de la tribu "
       "de Judá. Y su ofrenda fué 12 siclos."),                               # a digit
      ("Psa 23:1", " ".join(["word"] * 30).capitalize() + ".", "Largo."),        # too long
      ("Mat 22:20", "He asked them, \"Whose is this image?\"", "¿Cúya es esta figura?"),
      ("2Co 13:13", "All the saints greet you.",                      # a verse joined in RV1909
       "La gracia del Señor Jesucristo, y el amor de Dios, y la participación del Espíritu "
       "Santo sea con vosotros todos. Amén."),
  ]
  pairs = bible.filtered_pairs(verses, max_words=20)
  assert [en for en, _ in pairs] == [
      "In the beginning, God created the heavens and the earth.",
      "God said, \"Let there be light,\" and there was light.",
      "Yahweh spoke to Moses, saying.",
      "He asked them, \"Whose is this image?\""]
  assert pairs[2][1] == "Y habló Jehová á Moisés, diciendo:"      # the first of the repeats
  assert len(bible.filtered_pairs(verses, max_words=8)) == 2


def test_words_printed_in_capitals_take_the_form_the_rest_of_the_text_gives_them():
  verses = [
      ("Gen 1:1", "In the beginning, God created the heavens and the earth.",
       "EN el principio crió Dios los cielos y la tierra."),        # a chapter's opening
      ("Gen 22:1", "After these things, God tested Abraham.",
       "Y ACONTECIÓ después de estas cosas, que tentó Dios a Abraham."),
      ("Gen 39:2", "Yahweh was with Joseph, and he was a prosperous man.",
       "Mas JEHOVÁ fué con José, y fué varón prosperado."),
      ("Psa 119:1", "ALEPH Blessed are those whose ways are blameless.",  # an acrostic heading
       "Bienaventurados los perfectos de camino; y aconteció en el principio."),
      ("Exo 6:2", "God spoke to Moses, and said to him, \"I am Yahweh.\"",
       "Habló todavía Dios a Moisés, y díjole: Yo soy JEHOVÁ; Jehová es."),
      ("Dan 5:25", "This is the writing that was inscribed: MENE, MENE, TEKEL, UPHARSIN.",
       "Y la escritura que esculpió es: MENE, MENE, TEKEL, UPHARSIN."),
  ]
  pairs = bible.filtered_pairs(verses, max_words=20)
  assert [es for _, es in pairs] == [
      "En el principio crió Dios los cielos y la tierra.",
      "Y aconteció después de estas cosas, que tentó Dios a Abraham.",
      "Mas Jehová fué con José, y fué varón prosperado.",
      "Bienaventurados los perfectos de camino; y aconteció en el principio.",
      "Habló todavía Dios a Moisés, y díjole: Yo soy Jehová; Jehová es.",
      "Y la escritura que esculpió es: Mene, Mene, Tekel, Upharsin."]
  assert pairs[3][0] == "Blessed are those whose ways are blameless."
  assert pairs[5][0] == "This is the writing that was inscribed: Mene, Mene, Tekel, Upharsin."
  assert bible.truecase("NO te jactes", {"NO": "no"}) == "No te jactes"   # opens the verse


def test_the_corpus_reads_the_cached_verses_and_holds_out_unseen_sentences(monkeypatch, tmp_path):
  verses = [(f"Gen 1:{i}", f"The verse number {'x' * (i % 9 + 1)} says {'y' * (i // 9 + 1)}.",
             f"El versículo {'x' * (i % 9 + 1)} dice {'y' * (i // 9 + 1)}.") for i in range(240)]
  verses += verses[:10]                                              # repeated verses
  cache = tmp_path / "cache"
  cache.mkdir()
  (cache / "bible-web-sparv-verses.json").write_text(json.dumps(verses), encoding="utf-8")
  monkeypatch.setattr(text.catalogs, "sentence_pairs", lambda wheel, language: [])
  spec = spec_lib.CorpusSpec(target="es", text=("bible",), max_heldout=8,
                       cache_root=str(cache))
  pairs = text.bible_pairs(spec, "en", "es")
  assert len(pairs) == 240 and {d for _, _, d in pairs} == {"bible"}
  plan = _plan(spec, "en", "es", {"x": "wheel"}, pairs)
  texts = {split: {s.source for talk in talks for s in talk} for split, talks in plan.items()}
  assert len(texts["dev"]) == len(texts["tst-COMMON"]) == 8
  assert not (texts["dev"] | texts["tst-COMMON"]) & texts["train"]
  assert text.bible_pairs(spec_lib.CorpusSpec(target="es"), "en", "es") == []    # not asked for
  assert text.bible_pairs(spec, "en", "de") == []                           # not English-Spanish


def test_without_apt_the_bible_is_left_out_with_a_warning(monkeypatch, tmp_path):
  monkeypatch.setattr(packages.shutil, "which", lambda tool: None)
  with pytest.raises(bible.BibleUnavailable, match=r"apt-get and dpkg-deb not found.*"
                                                   r"sword-text-web"):
    bible.fetch_modules("web", str(tmp_path))
  said = []
  spec = spec_lib.CorpusSpec(target="es", text=("catalogs", "bible"),
                       cache_root=str(tmp_path))
  assert text.bible_pairs(spec, "en", "es", said.append) == []
  assert "without the Bible verses (apt-get and dpkg-deb not found" in said[0]
  with pytest.raises(ValueError, match="bible_english 'nrsv'; valid: kjv, web"):
    spec_lib.CorpusSpec(bible_english="nrsv")


def _stand_in(root, name, body):
  """An executable `name` under root/usr/bin running `body` (Python) with sys.argv."""
  path = root / "usr" / "bin" / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f"#!{sys.executable}\nimport sys, wave, re\n{body}", encoding="utf-8")
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


WRITE_WAV = '''
def write(out, seconds, rate=16000):
  with wave.open(out, "wb") as f:
    f.setnchannels(1); f.setsampwidth(2); f.setframerate(rate)
    f.writeframes(b"\\x10\\x00" * int(rate * seconds))
open(sys.argv[0] + ".calls", "a").write(repr(sys.argv[1:]) + "\\n")
'''


@pytest.fixture
def stand_in_synthesizers(tmp_path, monkeypatch):
  """flite, festival and espeak-ng (MBROLA's front end) as stand-in programs that record their
  arguments and write 16 kHz audio whose length is the duration stretch (flite), 1 s
  (festival) or 175 / rate s (espeak-ng, which also records its input and `mbrola`'s place)."""
  roots = {package: tmp_path / package for package in
           flite.PACKAGES + festival.PACKAGES +
           mbrola.PACKAGES}
  _stand_in(roots["flite"], "flite", WRITE_WAV + '''
args = sys.argv[1:]
stretch = float([a for a in args if a.startswith("duration_stretch=")][0].split("=")[1])
write(args[args.index("-o") + 1], stretch)
''')
  _stand_in(roots["festival"], "festival", WRITE_WAV + '''
script = open(sys.argv[-1]).read()
write(re.search(r'utt.save.wave utt "([^"]+)"', script).group(1), 1.0)
''')
  _stand_in(roots["espeak-ng"], "espeak-ng", WRITE_WAV + '''
import os, shutil
args = sys.argv[1:]
open(sys.argv[0] + ".input", "a").write(repr((sys.stdin.read(), shutil.which("mbrola"))) + "\\n")
write(args[args.index("-w") + 1], 175 / int(args[args.index("-s") + 1]),
      22050 if "de6" in args[args.index("-v") + 1] else 16000)
''')
  _stand_in(roots["mbrola"], "mbrola", "")
  (roots["espeak-ng-data"] / common.LIB_DIR / "espeak-ng-data" / "voices").mkdir(
      parents=True)
  for name in {mbrola.database(v) for v in sum(mbrola.VOICES.values(),
                                                             ())}:
    voice = roots[f"mbrola-{name}"] / "usr" / "share" / "mbrola" / name / name
    voice.parent.mkdir(parents=True)
    voice.write_bytes(b"diphones")
  (roots["festival"] / festival.FESTIVAL_DIR).mkdir(parents=True)
  monkeypatch.setattr(packages, "fetch_all",
                      lambda packages, cache: {p: str(roots[p]) for p in packages})
  return roots


def _calls(root, name):
  path = root / "usr" / "bin" / f"{name}.calls"
  return [eval(line) for line in path.read_text().splitlines()]  # pylint: disable=eval-used


def test_flite_and_festival_are_driven_as_programs(stand_in_synthesizers, tmp_path):
  flite_engine = flite.Flite(str(tmp_path / "cache"))
  audio = flite_engine.synthesize("It was no picnic.", Voice("en-us", "slt", 140, 60, "flite"))
  assert audio.dtype == np.int16 and len(audio) == int(16000 * 175 / 140)
  (args,) = _calls(stand_in_synthesizers["flite"], "flite")
  assert args[:2] == ["-voice", "slt"] and "It was no picnic." in args
  assert f"int_f0_target_mean={180 * 2 ** 0.1:.1f}" in args
  with pytest.raises(ValueError, match="flite voice 'm3'; valid: .*'slt'"):
    flite_engine.synthesize("x.", Voice("en-us", "m3", 140, 60, "flite"))
  festival_engine = festival.Festival(str(tmp_path / "cache"))
  audio = festival_engine.synthesize('He said "no".', Voice("en-us", "kal_diphone", 175, 50,
                                                     "festival"))
  assert len(audio) == 16000
  (args,) = _calls(stand_in_synthesizers["festival"], "festival")
  assert args[0] == "--libdir" and args[-2] == "-b"


def test_mbrola_voices_speak_through_debians_espeak_ng(stand_in_synthesizers, tmp_path):
  """espeak-ng reads the text from stdin (a text starting with '-' is no option), finds
  `mbrola` on its PATH and each voice file at espeak-ng-data/mbrola/{name}."""
  mbrola_engine = mbrola.Mbrola(str(tmp_path / "cache"))
  audio = mbrola_engine.synthesize("-5 degrees.", Voice("en-us", "us1", 140, 60, "mbrola"))
  assert audio.dtype == np.int16 and len(audio) == int(16000 * 175 / 140)
  root = stand_in_synthesizers["espeak-ng"]
  (args,) = _calls(root, "espeak-ng")
  data_parent = args[0].split("=", 1)[1]
  assert args[0].startswith("--path=") and args[1:7] == ["-v", "mb-us1", "-s", "140", "-p", "60"]
  inputs = (root / "usr" / "bin" / "espeak-ng.input").read_text().splitlines()
  (said,) = [eval(line) for line in inputs]  # pylint: disable=eval-used
  assert said == ("-5 degrees.", str(stand_in_synthesizers["mbrola"] / "usr" / "bin" / "mbrola"))
  for name in ("us1", "us2", "us3", "en1", "de6"):
    with open(os.path.join(data_parent, "espeak-ng-data", "mbrola", name), "rb") as f:
      assert f.read() == b"diphones"
  # de6 is a 22.05 kHz database: its audio comes back at 16 kHz, as long.
  accented = mbrola_engine.synthesize("Yes.", Voice("en-us", "de6-en", 175, 50, "mbrola"))
  assert abs(len(accented) - 16000) <= 1 and np.all(accented[100:-100] == 16)
  assert _calls(root, "espeak-ng")[-1][1:3] == ["-v", "mb-de6-en"]
  with pytest.raises(ValueError, match="MBROLA voice 'slt'; valid: .*'us1'"):
    mbrola_engine.synthesize("x.", Voice("en-us", "slt", 140, 60, "mbrola"))


# pylint: disable=invalid-name
class FakeRhvoiceLibrary:
  """RHVoice's C API as the engine calls it: keeps what it is given and speaks 175 / rate
  seconds of the value 40 at 24 kHz, in two chunks, through the engine's callbacks."""

  def __init__(self, lib_dir, speaks=True):
    self.lib_dir, self.speaks, self.messages, self.deleted = lib_dir, speaks, [], []

  def RHVoice_new_tts_engine(self, params):
    self.init = params._obj  # pylint: disable=protected-access
    return 1

  def RHVoice_new_message(self, engine, text, length, kind, synth, user):
    p = synth._obj  # pylint: disable=protected-access
    self.messages.append((engine, text, length, kind, p.voice_profile, p.relative_rate,
                          p.relative_pitch))
    return len(self.messages)

  def RHVoice_speak(self, message):
    if not self.speaks:
      return 0
    callbacks = self.init.callbacks
    callbacks.set_sample_rate(24000, None)
    total = int(24000 * 175 / (self.messages[message - 1][5] * 175))
    for count in (total // 2, total - total // 2):
      chunk = (ctypes.c_short * count)(*([40] * count))
      callbacks.play_speech(chunk, count, None)
    return 1

  def RHVoice_delete_message(self, message):
    self.deleted.append(message)
# pylint: enable=invalid-name


def test_rhvoice_is_called_through_its_library(tmp_path, monkeypatch):
  """The engine hands RHVoice the unpacked data folder and its own config folder, each message
  the voice, rate / 175 and +-1/2 octave of pitch, the text's UTF-8 bytes; what the callbacks
  receive comes back at 16 kHz; every message is deleted; a silent voice is an error."""
  roots = {p: tmp_path / p for p in rhvoice.PACKAGES}
  for package in rhvoice.LIBRARY_PACKAGES:
    (roots[package] / common.LIB_DIR).mkdir(parents=True)
    (roots[package] / common.LIB_DIR / f"{package}.so").write_bytes(b"")
  monkeypatch.setattr(packages, "fetch_all",
                      lambda packages, cache: {p: str(roots[p]) for p in packages})
  libraries = []
  monkeypatch.setattr(rhvoice.Rhvoice, "load_library", staticmethod(
      lambda lib_dir: libraries.append(FakeRhvoiceLibrary(lib_dir)) or libraries[-1]))
  rhvoice_engine = rhvoice.Rhvoice(str(tmp_path / "cache"))
  (lib,) = libraries
  assert sorted(os.listdir(lib.lib_dir)) == sorted(
      f"{p}.so" for p in rhvoice.LIBRARY_PACKAGES)
  assert lib.init.data_path.decode() == str(roots["rhvoice-english"] / "usr" / "share" /
                                            "RHVoice")
  assert os.path.isdir(lib.init.config_path.decode())
  audio = rhvoice_engine.synthesize("Señor, yes.", Voice("en-us", "bdl", 140, 60, "rhvoice"))
  assert audio.dtype == np.int16 and abs(len(audio) - int(16000 * 175 / 140)) <= 1
  assert np.all(audio[100:-100] == 40)
  (_, text, length, kind, profile, rate, pitch), = lib.messages
  assert (text, length, kind, profile) == ("Señor, yes.".encode(), 12, 0, b"bdl")
  assert rate == pytest.approx(140 / 175) and pitch == pytest.approx(2 ** 0.1)
  assert lib.deleted == [1]
  with pytest.raises(ValueError, match="RHVoice voice 'm3'; valid: .*'bdl'"):
    rhvoice_engine.synthesize("x.", Voice("en-us", "m3", 140, 60, "rhvoice"))
  lib.speaks = False
  with pytest.raises(voices.SynthesizerUnavailable, match="clb said nothing"):
    rhvoice_engine.synthesize("x.", Voice("en-us", "clb", 175, 50, "rhvoice"))
  assert lib.deleted == [1, 2]

  def unloadable(lib_dir):
    raise OSError(f"{lib_dir}/libRHVoice.so.5: wrong ELF class")
  monkeypatch.setattr(rhvoice.Rhvoice, "load_library", staticmethod(unloadable))
  with pytest.raises(voices.SynthesizerUnavailable,
                     match="RHVoice's library could not be loaded .*wrong ELF class"):
    rhvoice.Rhvoice(str(tmp_path / "cache"))


def test_the_unseen_split_leaves_out_rhvoices_twins_of_flite_voices():
  """RHVoice's slt and alan are flite's slt and awb: with flite in training they do not speak
  tst-unseen-synth; with espeak-ng alone every RHVoice voice does."""
  mixed = spec_lib.CorpusSpec(synthesizers=("espeak", "flite"), unseen_synthesizer="rhvoice")
  assert set(plan.unseen_voices(mixed)) == {"bdl", "evgeniy-eng", "clb", "lyubov"}
  alone = spec_lib.CorpusSpec(unseen_synthesizer="rhvoice")
  assert set(plan.unseen_voices(alone)) == set(voices.voice_names(
      rhvoice.VOICES))


def test_an_assembled_folder_is_made_once_per_package_list(tmp_path):
  """festival's library and MBROLA's espeak-ng data are assembled once; a cache assembled from
  fewer packages (voices) is not taken for the current list's."""
  made = []

  def assemble(staging):
    os.makedirs(staging)
    made.append(staging)

  assembled = common.assembled_dir
  first = assembled(str(tmp_path), "lib", ("a", "b"), assemble)
  assert assembled(str(tmp_path), "lib", ("a", "b"), assemble) == first
  more = assembled(str(tmp_path), "lib", ("a", "b", "c"), assemble)
  assert more != first and os.path.isdir(first) and os.path.isdir(more) and len(made) == 2
  assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (first, more))


def test_speak_records_each_line_in_a_numbered_file_voices_in_turn(stand_in_synthesizers,
                                                                   tmp_path, monkeypatch):
  """Line n becomes NNNN.wav spoken by voices[n % len(voices)] at a rate drawn per spoken line;
  a blank line is skipped and counted, and keeps its number unused."""
  monkeypatch.setattr(voices, "_ENGINES", {})
  out = tmp_path / "recordings"
  counts = speak.speak_lines(["In the beginning.", "", "Amen.", "Selah."], str(out), "mbrola",
                             ["us1", "us2"], rate=(140, 200), seed=5,
                             cache_dir=str(tmp_path / "cache"), log=lambda *_: None)
  assert counts == {"written": 3, "blank": 1}
  assert sorted(os.listdir(out)) == ["0000.wav", "0002.wav", "0003.wav"]
  calls = _calls(stand_in_synthesizers["espeak-ng"], "espeak-ng")
  rng = np.random.default_rng(5)
  rates = [int(rng.integers(140, 201)) for _ in range(3)]
  assert [(args[2], int(args[4])) for args in calls] == list(zip(["mb-us1", "mb-us1", "mb-us2"],
                                                                 rates))
  for name, rate in zip(["0000.wav", "0002.wav", "0003.wav"], rates):
    with wave.open(str(out / name)) as f:      # the stand-in speaks 175 / rate seconds
      assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (16000, 1, 2)
      assert abs(f.getnframes() - int(16000 * 175 / rate)) <= 1


def test_speak_names_the_valid_engines_voices_and_rates():
  with pytest.raises(ValueError, match="--engine 'sapi'; valid: espeak, flite, festival, mbrola"):
    speak.check_voices("sapi", ["x"])
  with pytest.raises(ValueError, match="flite voice 'ked_diphone'; valid: kal16, awb, rms, slt"):
    speak.check_voices("flite", ["slt", "ked_diphone"])
  with pytest.raises(ValueError, match="--voices is empty"):
    speak.check_voices("festival", [""])
  assert speak.parse_rate("170") == (170, 170) and speak.parse_rate("140-200") == (140, 200)
  for bad in ("fast", "200-140", "30"):
    with pytest.raises(ValueError, match=f"--rate '{bad}'; valid: "):
      speak.parse_rate(bad)


@pytest.fixture
def fresh_engine_answers():
  """Each synthesizer's availability is asked afresh (it is remembered per process)."""
  build._engine_problem.cache_clear()  # pylint: disable=protected-access
  yield
  build._engine_problem.cache_clear()  # pylint: disable=protected-access


def test_a_missing_synthesizer_is_left_out_with_a_warning(monkeypatch, fresh_engine_answers):
  def unavailable(name, cache):
    raise voices.SynthesizerUnavailable(f"{name}: apt-get not found")
  monkeypatch.setattr(voices, "engine", unavailable)
  said = []
  spec = spec_lib.CorpusSpec(synthesizers=("espeak", "flite"), unseen_synthesizer="festival",
                       other_synthesizer_share=0.5)
  effective = build.effective_spec(spec, said.append)
  assert effective.synthesizers == ("espeak",) and effective.unseen_synthesizer == ""
  assert effective.other_synthesizer_share == 0.0   # no other synthesizer left to share
  assert effective.splits() == spec_lib.SPLITS
  assert "without flite" in said[0] and "training hears espeak-ng alone" in said[0]
  assert "without festival" in said[1] and "no tst-unseen-synth split" in said[1]
  monkeypatch.setattr(voices, "engine", lambda name, cache: pytest.fail("asked again"))
  assert build.effective_spec(spec, said.append) == effective      # once per process
  with pytest.raises(ValueError, match="unseen synthesizer 'flite'; valid: one of flite, "
                                       "festival, mbrola, rhvoice that training does not use"):
    spec_lib.CorpusSpec(synthesizers=("espeak", "flite"), unseen_synthesizer="flite")


def test_other_synthesizers_join_training_and_the_unseen_one_speaks_tst_common():
  wheels = text.catalogs.download_wheels(text.catalogs.wheel_cache())
  kwargs = dict(max_sentences=400, max_heldout=20)
  plain = _plan(spec_lib.CorpusSpec(**kwargs), "en", "de", wheels)
  mixed = _plan(spec_lib.CorpusSpec(**kwargs, synthesizers=("espeak", "flite"),
                                          unseen_synthesizer="festival"), "en", "de", wheels)
  segments = lambda plan, split: [s for talk in plan[split] for s in talk]
  for split in ("dev", "tst-COMMON"):                   # the held-out splits are unchanged
    assert segments(plain, split) == segments(mixed, split)
  engines = lambda split: {s.voice.engine for s in segments(mixed, split)}
  assert engines("train") == {"espeak", "flite"} and engines("dev") == {"espeak"}
  assert engines("tst-unseen-synth") == {"festival"}
  # festival's kal_diphone is the speaker of flite's kal16: with flite in training only
  # ked_diphone speaks the unseen split, both where training hears espeak-ng alone.
  unseen_variants = lambda plan: {s.voice.variant for s in segments(plan, "tst-unseen-synth")}
  assert unseen_variants(mixed) == {"ked_diphone"}
  alone = _plan(spec_lib.CorpusSpec(**kwargs, unseen_synthesizer="festival"), "en", "de",
                            wheels)
  assert unseen_variants(alone) == {"kal_diphone", "ked_diphone"}
  voices_of = lambda plan, split: {(s.voice.engine, s.voice.variant)
                                   for s in segments(plan, split)}
  unseen = voices_of(mixed, "tst-unseen-synth")
  twins = {voices.SAME_SPEAKER.get(voice, voice) for voice in unseen}
  assert ("flite", "kal16") in voices_of(mixed, "train")
  assert not (unseen | twins) & voices_of(mixed, "train")
  flite_share = np.mean([s.voice.engine == "flite" for s in segments(mixed, "train")])
  assert 0.05 < flite_share < 0.35                      # 4 of 24 training voices
  assert sorted(s.source for s in segments(mixed, "tst-unseen-synth")) == \
      sorted(s.source for s in segments(mixed, "tst-COMMON"))
  assert sorted(s.source for s in segments(plain, "train")) == \
      sorted(s.source for s in segments(mixed, "train"))
  # A share set by hand: half the training utterances are flite's, nothing else moves.
  half = _plan(spec_lib.CorpusSpec(**kwargs, synthesizers=("espeak", "flite"),
                                         unseen_synthesizer="festival",
                                         other_synthesizer_share=0.5), "en", "de", wheels)
  assert 0.42 < np.mean([s.voice.engine == "flite" for s in segments(half, "train")]) < 0.58
  for split in ("dev", "tst-COMMON", "tst-unseen-synth"):
    assert segments(half, split) == segments(mixed, split)
  assert sorted(s.source for s in segments(half, "train")) == \
      sorted(s.source for s in segments(mixed, "train"))
  for bad, synths in ((1.0, ("espeak", "flite")), (-0.1, ("espeak", "flite")),
                      (0.5, ("espeak",))):
    with pytest.raises(ValueError, match=f"other_synthesizer_share {bad}; valid: 0"):
      spec_lib.CorpusSpec(synthesizers=synths, other_synthesizer_share=bad)


def test_a_corpus_without_catalogs_in_its_text_has_no_catalog_sentences(monkeypatch, tmp_path):
  """--text bible: the message catalogs are neither downloaded nor planned."""
  def no_wheels(*_):
    raise AssertionError("the catalogs were downloaded for a corpus without them")

  class Planned(Exception):
    pass

  def capture(spec, source, target, pairs):
    raise Planned(pairs)

  monkeypatch.setattr(text.catalogs, "download_wheels", no_wheels)
  monkeypatch.setattr(text, "bible_pairs", lambda *_: [("In the beginning.", "En el principio.",
                                                        "bible")])
  monkeypatch.setattr(build, "plan_direction", capture)
  spec = spec_lib.CorpusSpec(sources=("en",), target="es", text=("bible",),
                       cache_root=str(tmp_path))
  with pytest.raises(Planned) as planned:
    build.build(str(tmp_path / "corpus"), spec, progress=False)
  pairs, = planned.value.args
  assert [p[2] for p in pairs] == ["bible"]


APT_GET = '''
args = sys.argv[1:]
open(sys.argv[0] + ".calls", "a").write(repr(args) + "\\n")
if "update" in args:
  sys.exit(0)
package = args[-1]
if package.startswith("mbrola-") and "-o" not in args:
  sys.exit("E: Can't select candidate version from package " + package)
open(package + "_1.0_all.deb", "w").write(package)
'''


def test_a_package_outside_the_machines_sections_comes_from_a_private_apt_state(
    monkeypatch, tmp_path):
  """The machine's sources list main only: MBROLA's voices (non-free) are looked up again in
  the same archives with every section, from a private apt state updated once."""
  tools = tmp_path / "tools"
  _stand_in(tools, "apt-get", APT_GET)
  _stand_in(tools, "dpkg-deb", "import os\nos.makedirs(sys.argv[3])\n"
                               "open(os.path.join(sys.argv[3], 'from'), 'w').write(sys.argv[2])")
  monkeypatch.setenv("PATH", f"{tools / 'usr' / 'bin'}{os.pathsep}{os.environ['PATH']}")
  etc = tmp_path / "etc"
  (etc / "sources.list.d").mkdir(parents=True)
  (etc / "sources.list").write_text("# a comment\ndeb-src http://x.org/debian bookworm main\n"
                                    "deb [arch=amd64] http://mirror.example/debian bookworm "
                                    "main\n")
  (etc / "sources.list.d" / "debian.sources").write_text(
      "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n"
      "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
      "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n")
  monkeypatch.setattr(packages, "SOURCES", (str(etc / "sources.list"),
                                                   str(etc / "sources.list.d")))
  monkeypatch.setattr(packages, "_WIDER", {})
  cache = tmp_path / "cache"
  assert packages.fetch("flite", str(cache)) == str(cache / "flite")
  calls = lambda: _calls(tools, "apt-get")
  assert calls() == [["download", "flite"]]                 # the machine's apt had it
  for package in ("mbrola-us1", "mbrola-us2"):
    root = packages.fetch(package, str(cache))
    assert os.path.basename((cache / package / "from").read_text()) == f"{package}_1.0_all.deb"
    assert root == str(cache / package)
  updates = [args for args in calls() if "update" in args]
  assert len(updates) == 1                                  # once per process
  sources = (cache / "apt-sections" / "sources.list").read_text().splitlines()
  sections = "main contrib non-free universe multiverse"
  assert sources == [
      f"deb [arch=amd64] http://mirror.example/debian bookworm {sections}",
      f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
      f"http://deb.debian.org/debian bookworm {sections}",
      f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
      f"http://deb.debian.org/debian bookworm-updates {sections}"]
  assert f"Dir::State::Lists={cache / 'apt-sections' / 'lists'}" in updates[0]
  with pytest.raises(packages.PackageUnavailable,
                     match="apt-get download mbrola-xx failed .*Can't select candidate"):
    monkeypatch.setattr(packages, "_WIDER", {str(cache): []})   # no wider archive
    packages.fetch("mbrola-xx", str(cache))
