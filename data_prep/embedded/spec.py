"""The embedded corpus's settings, defined once: `CorpusSpec`.

Each field is one setting with its default and its help. The rest is derived from it: the config
keys `data.embedded.<field>` (`config_defaults`, read back by `specs_from_settings`; a few
build-only fields are flags alone) and the command line's `--<field>` flags (`add_arguments`,
read back the same way). A tuple field is
written comma-separated in both; `target` may name several languages there, one build each.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping

from multiformer_common.errors import InvalidValue
from multiformer_common import packages
from multiformer_common.settings import setting
from data_prep.embedded import recorded, voices
from data_prep.embedded.text import TEXT_SOURCES, bible

SPLITS = ("train", "dev", "tst-COMMON")
# tst-COMMON's sentences spoken by a synthesizer family that no training or dev utterance uses.
UNSEEN_SYNTH_SPLIT = "tst-unseen-synth"
# A real speech-translation test: recorded lines of a game whose cast no training audio has,
# against the game's own subtitles (spec.real_test); tst-COMMON band-limited as the games' audio.
REAL_SPLITS = ("dev-real", "tst-real")
NARROWBAND_SPLIT = "tst-COMMON-5k"
RECORDED_GAMES = {"queen": "Flight of the Amazon Queen", "uqm": "The Ur-Quan Masters",
                  "sky": "Beneath a Steel Sky"}
# The games whose recorded dialogue can train (the readers'), and those whose text the voices
# can read.
RECORDED_TRAIN_GAMES = recorded.TRAINING_GAMES
SPOKEN_DIALOGUE_GAMES = ("queen", "sky")
# The languages of sky's subtitles that a real split can translate into.
REAL_TEST_LANGUAGES = ("es", "de")
# espeak-ng's voice for each language the corpus speaks.
ESPEAK_VOICE = {"en": "en-us", "de": "de", "es": "es", "fr": "fr", "it": "it", "pt": "pt"}


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """What one build of the embedded corpus is: every field a setting (see the module)."""
  sources: tuple[str, ...] = setting(
      ("en",), f"source language(s): any of {', '.join(ESPEAK_VOICE)}")
  target: str = setting("de", "target language (the config key and --target take several, "
                               "comma-separated: one build each)")
  seed: int = setting(1, "the plan's seed: sentences, splits, speakers")
  heldout_fraction: float = setting(0.08, "share of the sentences for dev, and again for test",
                                     config_key=False)
  train_speakers_per_sentence: int = setting(2, "times each training sentence is spoken")
  segments_per_talk: int = setting(20, "segments per talk (one wav file)", config_key=False)
  max_sentences: int = setting(0, "sentences per direction; 0 = all", config_key=False)
  max_heldout: int = setting(0, "cap on dev and on test sentences; 0 = heldout_fraction's")
  text: tuple[str, ...] = setting(
      ("catalogs",), f"text sources: any of {', '.join(TEXT_SOURCES)} (catalogs: message "
                     f"catalogs of PyPI wheels, every language; ding: ~15k German-English "
                     f"example sentences; bible: English-Spanish verses)")
  bible_english: str = setting("web", "text bible's English: web (World English Bible) | kjv")
  bible_max_words: int = setting(20, "text bible: the longest English verse kept, in words")
  synthesizers: tuple[str, ...] = setting(
      ("espeak",), f"the training voices' synthesizers: espeak plus any of "
                   f"{', '.join(voices.ENGINES[1:])}")
  unseen_synthesizer: str = setting(
      "", f"build {UNSEEN_SYNTH_SPLIT}: tst-COMMON's sentences spoken by this synthesizer, one "
          f"of {', '.join(voices.ENGINES[1:])} that training does not use ('' = no such split)")
  other_synthesizer_share: float = setting(
      0.0, "share of the training utterances spoken by the synthesizers besides espeak (0: "
           "as their share of the training voices)")
  recorded_train: tuple[str, ...] = setting(
      (), "games whose recorded dialogue joins the ASR training as transcribed speech (an X-X "
          "pair): queen (Flight of the Amazon Queen, ~4,000 clips, ~2.7 h), uqm (The Ur-Quan "
          "Masters' 3DO voices, Debian non-free, ~4,200 utterances, ~10.9 h)")
  uqm_share: float = setting(
      1.0, "share of The Ur-Quan Masters' utterances that recorded_train=uqm trains on, drawn "
           "with the spec's seed")
  spoken_dialogue: tuple[str, ...] = setting(
      (), "games whose dialogue text the training voices read into the ASR training (an X-X "
          "pair, transcripts only; the speech is synthetic): queen (its linked lines), sky "
          "(its lines that no real split holds)")
  real_test: str = setting(
      "", f"build {' and '.join(REAL_SPLITS)} (and {NARROWBAND_SPLIT}): recorded lines of sky "
          f"(Beneath a Steel Sky) against its {'/'.join(REAL_TEST_LANGUAGES)} subtitles ('' = "
          f"none)")
  real_heldout: int = setting(300, f"lines in each of {' and '.join(REAL_SPLITS)}")
  narrowband_share: float = setting(
      0.0, "share of the synthetic training talks band-limited to the games' 5.5 kHz (their "
           "11,025 Hz sampling), so that bandwidth tells the model nothing")
  cache_root: str = setting(
      "", "where fetched packages are kept ('' = multiformer_common.packages.cache_root())",
      config_key=False)

  def __post_init__(self):
    if not self.text or set(self.text) - set(TEXT_SOURCES):
      raise InvalidValue(f"embedded corpus text sources {','.join(self.text)!r}; valid: "
                       f"comma-separated {', '.join(TEXT_SOURCES)}")
    unknown = [l for l in self.sources + (self.target,) if l not in ESPEAK_VOICE]
    if unknown:
      raise InvalidValue(f"embedded corpus language(s) {unknown}; valid: {sorted(ESPEAK_VOICE)}")
    if self.train_speakers_per_sentence < 1:
      raise InvalidValue(f"speakers per training sentence {self.train_speakers_per_sentence}; "
                       f"valid: 1 or more")
    if "espeak" not in self.synthesizers or set(self.synthesizers) - set(voices.ENGINES):
      raise InvalidValue(f"embedded corpus synthesizers {','.join(self.synthesizers)!r}; valid: "
                       f"espeak plus any of {', '.join(voices.ENGINES[1:])}, comma-separated")
    if self.unseen_synthesizer and (self.unseen_synthesizer not in voices.ENGINES[1:] or
                                    self.unseen_synthesizer in self.synthesizers):
      raise InvalidValue(f"embedded corpus unseen synthesizer {self.unseen_synthesizer!r}; valid: "
                       f"one of {', '.join(voices.ENGINES[1:])} that training does not use "
                       f"({', '.join(self.synthesizers)})")
    if not 0.0 <= self.other_synthesizer_share < 1.0 or (
        self.other_synthesizer_share and self.synthesizers == ("espeak",)):
      raise InvalidValue(f"embedded corpus other_synthesizer_share {self.other_synthesizer_share}"
                       f"; valid: 0 (proportional to the voices) or a share in (0, 1) with a "
                       f"synthesizer besides espeak among the synthesizers "
                       f"({', '.join(self.synthesizers)})")
    if set(self.recorded_train) - set(RECORDED_TRAIN_GAMES):
      raise InvalidValue(f"embedded corpus recorded_train {','.join(self.recorded_train)!r}; "
                       f"valid: any of {', '.join(RECORDED_TRAIN_GAMES)}, comma-separated (or "
                       f"nothing)")
    if not 0.0 < self.uqm_share <= 1.0:
      raise InvalidValue(f"embedded corpus uqm_share {self.uqm_share}; valid: a share in (0, 1]")
    if set(self.spoken_dialogue) - set(SPOKEN_DIALOGUE_GAMES):
      raise InvalidValue(f"embedded corpus spoken_dialogue {','.join(self.spoken_dialogue)!r}; "
                       f"valid: any of {', '.join(SPOKEN_DIALOGUE_GAMES)}, comma-separated (or "
                       f"nothing)")
    if self.real_test not in ("", "sky"):
      raise InvalidValue(f"embedded corpus real_test {self.real_test!r}; valid: sky or ''")
    if self.real_test and ("en" not in self.sources or
                           self.target not in REAL_TEST_LANGUAGES):
      raise InvalidValue(f"embedded corpus real_test={self.real_test!r} needs English among the "
                       f"sources and a target in {', '.join(REAL_TEST_LANGUAGES)} (the game's "
                       f"subtitles); got sources {','.join(self.sources)}, target "
                       f"{self.target}")
    if self.real_test and self.real_heldout < 1:
      raise InvalidValue(f"embedded corpus real_heldout {self.real_heldout}; valid: 1 or more")
    if not 0.0 <= self.narrowband_share <= 1.0:
      raise InvalidValue(f"embedded corpus narrowband_share {self.narrowband_share}; valid: a "
                       f"share in [0, 1]")
    if self.bible_english not in bible.ENGLISH:
      raise InvalidValue(f"embedded corpus bible_english {self.bible_english!r}; valid: "
                       f"{', '.join(sorted(bible.ENGLISH))}")

  def package_cache(self) -> str:
    """The cache root of the packages this build fetches."""
    return self.cache_root or packages.cache_root()

  def splits(self) -> tuple[str, ...]:
    """The splits of the spec's translation directions."""
    return (SPLITS + ((UNSEEN_SYNTH_SPLIT,) if self.unseen_synthesizer else ()) +
            (REAL_SPLITS + (NARROWBAND_SPLIT,) if self.real_test else ()))

  def directions(self):
    return [(s, self.target) for s in self.sources if s != self.target]

  def transcription_pairs(self) -> list[str]:
    """The X-X pairs of transcribed speech without translations, training split only ("en-en"
    with queen's recordings or a game's dialogue spoken: the games are English)."""
    return ["en-en"] if (self.recorded_train or self.spoken_dialogue) and "en" in self.sources \
        else []


FIELDS = {field.name: field for field in dataclasses.fields(CorpusSpec)}


def _written(value):
  """A field's value as a config key or flag holds it: tuples comma-separated."""
  return ",".join(value) if isinstance(value, tuple) else value


def config_defaults() -> dict[str, Any]:
  """{field: default} for the config keys data.embedded.<field> (multiformer_jax.schema)."""
  return {name: _written(field.default) for name, field in FIELDS.items()
          if field.metadata["config_key"]}


def specs_from_settings(settings: Mapping[str, Any]) -> list[CorpusSpec]:
  """The builds that config keys or parsed flags ({field: value as written}) ask for: one per
  target language. An unknown key is named with the valid ones."""
  unknown = sorted(set(settings) - set(FIELDS))
  if unknown:
    raise InvalidValue(f"embedded corpus settings {unknown} do not exist; valid: "
                     f"{', '.join(FIELDS)}")
  values = {}
  for name, value in settings.items():
    if isinstance(FIELDS[name].default, tuple):
      value = tuple(v.strip() for v in str(value).split(",") if v.strip())
    values[name] = value
  targets = [t.strip() for t in str(values.pop("target", FIELDS["target"].default)).split(",")]
  return [CorpusSpec(**values, target=target) for target in targets if target]


def add_arguments(parser: argparse.ArgumentParser):
  """A --<field> flag for every setting, with its default and help."""
  for name, field in FIELDS.items():
    default = _written(field.default)
    parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=type(default),
                        default=default, help=f"{field.metadata['help']} (default {default!r})")


def specs_from_arguments(args: argparse.Namespace) -> list[CorpusSpec]:
  """The builds that add_arguments' parsed flags ask for."""
  return specs_from_settings({name: getattr(args, name) for name in FIELDS})
