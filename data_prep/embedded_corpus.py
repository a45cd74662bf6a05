"""The embedded speech-translation corpus: real translated sentences, synthetic speakers.

Text: human-translated message catalogs from PyPI wheels (data_prep/po_text.py), one domain
per package, and for German-English optionally (`--text catalogs,ding`) the ~15k example
sentences of the Ding dictionary (data_prep/ding.py), domain "ding". Speech: espeak-ng voices
x variants x rates x pitches as speakers, male and female; dev and test each use one male and
one female voice variant never heard in training, and sentences never seen in training.
Training may give each variant several speakers (`train_speakers_per_variant`), each with its
own speaking rate and pitch, and may add 37 more voice variants (`extra_training_variants`):
more speakers to generalise from, the held-out splits unchanged.

Written in the exact MuST-C on-disk layout, so the MuST-C reader serves it unchanged:

    {out}/{src}-{tgt}/data/{split}/wav/{talk}.wav          16 kHz mono 16-bit
    {out}/{src}-{tgt}/data/{split}/txt/{split}.yaml        - {duration, offset, speaker_id,
                                                              wav, domain, lang}
    {out}/{src}-{tgt}/data/{split}/txt/{split}.{src|tgt}   one segment per line

Splits are MuST-C's: train, dev, tst-COMMON. English->German is the default; `--sources
de,es,fr,it,pt --target en` builds several languages -> English (mTEDx-style directions).
Deterministic for a seed; resumable (finished talks are kept) and atomic (a direction is
marked complete only when every file is in place).

    python -m data_prep.embedded_corpus --out data/embedded            # en-de, ~1 minute
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import os
import wave

import numpy as np

from data_prep import bible, cli_errors, ding, po_text, synthesizers
from data_prep.espeak import Synthesizer, Voice
from data_prep.progress import progress_bar

SAMPLE_RATE = 16000
ESPEAK_VOICE = {"en": "en-us", "de": "de", "es": "es", "fr": "fr", "it": "it", "pt": "pt"}
# The speaker population: espeak-ng voice variants of both sexes. espeak-ng's deterministic
# variants are all male but `shelby`; the other female ones are used in their steady form
# (data_prep/espeak.py), so that a seed gives the same audio. Each held-out split gets
# HELDOUT_PER_SEX variants of each sex, drawn with the corpus seed and never heard in training.
VARIANTS_BY_SEX = {
    "male": ("Denis", "Diogo", "Henrique", "Hugo", "Storm", "adam", "benjamin", "david",
             "edward2", "klatt6", "michel", "miguel", "mike2"),
    "female": ("shelby", "f1-steady", "f2-steady", "f3-steady", "f4-steady", "f5-steady",
               "Annie-steady", "Andrea-steady", "Alicia-steady", "steph-steady",
               "belinda-steady"),
}
HELDOUT_PER_SEX = 1
# More variants for training only (`extra_training_variants`), in their steady form: those of
# espeak-ng's en variants whose name and vowel formants (F1-F3 frequencies) differ from every
# variant above, so that no held-out voice has a relative in training; robotic, whispered,
# croaking and speed-changing variants left out. tests/test_embedded_corpus.py checks both.
# Most are male; `zac` has no gender line but a 240-390 Hz pitch and joins the female ones.
EXTRA_TRAINING_VARIANTS_BY_SEX = {
    "male": tuple(f"{name}-steady" for name in (
        "Alex", "Andy", "Gene", "Jacky", "Lee", "Marco", "Mario", "Michael", "Nguyen",
        "Tweaky", "announcer", "antonio", "boris", "gustave", "ian", "iven", "m1", "m2", "m3",
        "m4", "m5", "m8", "marcelo", "norbert", "pablo", "paul", "pedro", "quincy", "rob",
        "robert", "sandro", "travis", "victor", "kaukovalta")),
    "female": ("linda-steady", "grandma-steady", "zac-steady"),
}
EXTRA_TRAINING_VARIANTS = sum(EXTRA_TRAINING_VARIANTS_BY_SEX.values(), ())
SPLITS = ("train", "dev", "tst-COMMON")
# tst-COMMON's sentences spoken by a synthesizer family that no training or dev utterance uses.
UNSEEN_SYNTH_SPLIT = "tst-unseen-synth"
ENGINES = ("espeak", "flite", "festival", "mbrola", "rhvoice")
ENGINE_VOICES = {"flite": synthesizers.FLITE_VOICES, "festival": synthesizers.FESTIVAL_VOICES,
                 "mbrola": synthesizers.MBROLA_VOICES, "rhvoice": synthesizers.RHVOICE_VOICES}
COMPLETE = ".complete.json"


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  sources: tuple[str, ...] = ("en",)
  target: str = "de"
  seed: int = 0
  heldout_fraction: float = 0.08          # of the sentences, for dev and again for test
  train_speakers_per_sentence: int = 2    # each training sentence is spoken this many times
  train_speakers_per_variant: int = 1     # training speakers (rate, pitch) of each variant
  extra_training_variants: bool = False   # train on EXTRA_TRAINING_VARIANTS too
  segments_per_talk: int = 20
  max_sentences: int = 0                  # per direction; 0 = all
  max_heldout: int = 0                    # cap on dev and on test sentences; 0 = no cap
  # Text sources: "catalogs" (message catalogs of PyPI wheels, every language), "ding" (the
  # Ding dictionary's example sentences, German-English only) and "bible" (verse pairs of an
  # English Bible and Reina-Valera 1909, English-Spanish only); the last two are fetched with
  # apt-get download.
  text: tuple[str, ...] = ("catalogs",)
  wheel_cache: str = ""                   # default: ~/.cache/multiformer_jax/wheels
  bible_english: str = "web"              # web (World English Bible) | kjv (King James)
  bible_max_words: int = 20               # longest English verse kept, in words
  # Synthesizer families of the training speakers (espeak-ng always; flite adds its four
  # voices), and the family that speaks UNSEEN_SYNTH_SPLIT ("" = no such split).
  synthesizers: tuple[str, ...] = ("espeak",)
  unseen_synthesizer: str = ""
  # Share of the training utterances spoken by the synthesizers other than espeak-ng; 0 = as
  # often as their voices are among all training voices (4 flite voices of 23: 17 %).
  other_synthesizer_share: float = 0.0
  # Training speakers (rate, pitch) of each voice of the synthesizers other than espeak-ng; 0 =
  # train_speakers_per_variant. Their four voices speak many utterances each, and one rate per
  # voice leaves the rest of the range unheard.
  other_speakers_per_voice: int = 0

  def __post_init__(self):
    if not self.text or set(self.text) - set(TEXT_SOURCES):
      raise ValueError(f"embedded corpus text sources {','.join(self.text)!r}; valid: "
                       f"comma-separated {', '.join(TEXT_SOURCES)}")
    if self.train_speakers_per_sentence < 1:
      raise ValueError(f"speakers per training sentence {self.train_speakers_per_sentence}; "
                       f"valid: 1 or more")
    if self.train_speakers_per_variant < 1:
      raise ValueError(f"training speakers per voice variant {self.train_speakers_per_variant}"
                       f"; valid: 1 or more")
    if "espeak" not in self.synthesizers or set(self.synthesizers) - set(ENGINES):
      raise ValueError(f"embedded corpus synthesizers {','.join(self.synthesizers)!r}; valid: "
                       f"espeak plus any of {', '.join(ENGINES[1:])}, comma-separated")
    if self.unseen_synthesizer and (self.unseen_synthesizer not in ENGINES[1:] or
                                    self.unseen_synthesizer in self.synthesizers):
      raise ValueError(f"embedded corpus unseen synthesizer {self.unseen_synthesizer!r}; valid: "
                       f"one of {', '.join(ENGINES[1:])} that training does not use "
                       f"({', '.join(self.synthesizers)})")
    if not 0.0 <= self.other_synthesizer_share < 1.0 or (
        self.other_synthesizer_share and self.synthesizers == ("espeak",)):
      raise ValueError(f"embedded corpus other_synthesizer_share {self.other_synthesizer_share}"
                       f"; valid: 0 (proportional to the voices) or a share in (0, 1) with a "
                       f"synthesizer besides espeak among the synthesizers "
                       f"({', '.join(self.synthesizers)})")
    if self.other_speakers_per_voice and (
        self.other_speakers_per_voice < self.train_speakers_per_variant):
      raise ValueError(f"embedded corpus other_speakers_per_voice {self.other_speakers_per_voice}"
                       f"; valid: 0 (as train_speakers_per_variant) or at least "
                       f"train_speakers_per_variant ({self.train_speakers_per_variant})")
    if self.bible_english not in bible.ENGLISH:
      raise ValueError(f"embedded corpus bible_english {self.bible_english!r}; valid: "
                       f"{', '.join(sorted(bible.ENGLISH))}")

  def splits(self) -> tuple[str, ...]:
    return SPLITS + ((UNSEEN_SYNTH_SPLIT,) if self.unseen_synthesizer else ())

  def directions(self):
    return [(s, self.target) for s in self.sources if s != self.target]


@dataclasses.dataclass(frozen=True)
class Segment:
  source: str
  target: str
  domain: str
  voice: Voice


def split_variants(seed: int) -> dict[str, tuple[str, ...]]:
  """{split: voice variants}: HELDOUT_PER_SEX of each sex for dev and for tst-COMMON, drawn
  with `seed`; the rest for train."""
  rng = np.random.default_rng([seed, 7])
  chosen = {split: [] for split in SPLITS}
  for sex in sorted(VARIANTS_BY_SEX):
    variants = [VARIANTS_BY_SEX[sex][i] for i in rng.permutation(len(VARIANTS_BY_SEX[sex]))]
    chosen["dev"] += variants[:HELDOUT_PER_SEX]
    chosen["tst-COMMON"] += variants[HELDOUT_PER_SEX:2 * HELDOUT_PER_SEX]
    chosen["train"] += variants[2 * HELDOUT_PER_SEX:]
  return {split: tuple(sorted(variants)) for split, variants in chosen.items()}


def _speakers(rng, language: str, variants) -> list[Voice]:
  """One speaker per variant, each with its own speaking rate (words per minute) and pitch."""
  return [Voice(ESPEAK_VOICE[language], variant, int(rng.integers(125, 186)),
                int(rng.integers(25, 76))) for variant in variants]


TEXT_SOURCES = ("catalogs", "ding", "bible")


def ding_pairs(spec: CorpusSpec, source: str, target: str, log=print) -> list[tuple]:
  """(source text, target text, 'ding') for a German-English direction of a spec that asks
  for Ding; [] with a warning saying what is missing where the dictionary cannot be fetched."""
  if "ding" not in spec.text or {source, target} != {"en", "de"}:
    return []
  cache = os.path.dirname(spec.wheel_cache or po_text.default_wheel_cache())
  try:
    path = ding.fetch(cache)
  except ding.DingUnavailable as error:
    log(f"WARNING: the embedded corpus is built without the Ding sentences ({error}); it has "
        f"the message catalogs' sentences only, too few for the model to generalise")
    return []
  return [(en, de, ding.DOMAIN) if source == "en" else (de, en, ding.DOMAIN)
          for en, de in ding.sentence_pairs(path)]


def bible_pairs(spec: CorpusSpec, source: str, target: str, log=print) -> list[tuple]:
  """(source text, target text, 'bible') for an English-Spanish direction of a spec that asks
  for the Bible; [] with a warning saying what is missing where it cannot be fetched."""
  if "bible" not in spec.text or {source, target} != {"en", "es"}:
    return []
  cache = os.path.dirname(spec.wheel_cache or po_text.default_wheel_cache())
  try:
    pairs = bible.cached_sentence_pairs(cache, spec.bible_english, spec.bible_max_words)
  except bible.BibleUnavailable as error:
    log(f"WARNING: the embedded corpus is built without the Bible verses ({error}); it has "
        f"the message catalogs' sentences only, too few for the model to generalise")
    return []
  return [(en, es, bible.DOMAIN) if source == "en" else (es, en, bible.DOMAIN)
          for en, es in pairs]


def synthesizer_cache(spec: CorpusSpec) -> str:
  """Where flite, festival, MBROLA and RHVoice are unpacked: beside the wheel cache."""
  return os.path.join(os.path.dirname(spec.wheel_cache or po_text.default_wheel_cache()),
                      "synthesizers")


def effective_spec(spec: CorpusSpec, log=print) -> CorpusSpec:
  """`spec` without the synthesizers that cannot be had here (fetched and run once to know),
  each named in a warning: training then hears espeak-ng alone, and without the unseen
  synthesizer there is no UNSEEN_SYNTH_SPLIT."""
  engines = [e for e in spec.synthesizers if e != "espeak"]
  unseen = [spec.unseen_synthesizer] if spec.unseen_synthesizer else []
  missing = []
  for engine in engines + unseen:
    problem = _engine_problem(engine, synthesizer_cache(spec))
    if problem:
      log(f"WARNING: the embedded corpus is built without {engine} ({problem}); "
          + ("training hears espeak-ng alone" if engine in engines else
             f"there is no {UNSEEN_SYNTH_SPLIT} split"))
      missing.append(engine)
  if not missing:
    return spec
  synthesizers_left = tuple(e for e in spec.synthesizers if e not in missing)
  return dataclasses.replace(
      spec, synthesizers=synthesizers_left,
      other_synthesizer_share=spec.other_synthesizer_share if len(synthesizers_left) > 1 else 0.0,
      unseen_synthesizer="" if spec.unseen_synthesizer in missing else spec.unseen_synthesizer)


@functools.lru_cache(maxsize=None)
def _engine_problem(engine: str, cache_dir: str) -> str:
  """Why `engine` cannot synthesise here ("" if it can): fetched and run once per process, so
  building, checking a build and preparing ask it once."""
  try:
    _engine(engine, cache_dir).synthesize(
        "Hello.", Voice("en-us", ENGINE_VOICES[engine]["male"][0], 175, 50, engine))
  except synthesizers.SynthesizerUnavailable as error:
    return str(error)
  return ""


def _engine_speakers(rng, language: str, engine: str, per_voice: int,
                     sexes=("female", "male"), names=None) -> list[list[Voice]]:
  """[per voice of `engine` (of `names` only, if given): its speakers], each with its own rate
  and pitch."""
  groups = []
  for sex in sexes:
    for name in ENGINE_VOICES[engine].get(sex, ()):
      if names is not None and name not in names:
        continue
      groups.append([Voice(ESPEAK_VOICE[language], name, int(rng.integers(140, 201)),
                           int(rng.integers(30, 71)), engine) for _ in range(per_voice)])
  return groups


def plan_direction(spec: CorpusSpec, source: str, target: str, wheels: dict[str, str],
                   extra_pairs=()):
  """{split: [talk segments]}: the deterministic plan of one direction: the catalogs' pairs of
  `wheels` ({} where spec.text has no "catalogs"), then extra_pairs: more (source text, target
  text, domain) triples (e.g. `ding_pairs`)."""
  direction_key = sum(map(ord, source + target))
  stream = lambda n=None: np.random.default_rng(     # an independent stream of this direction
      [spec.seed, direction_key] + ([] if n is None else [n]))
  rng = stream()
  pairs = []  # (source text, target text, domain)
  for domain, wheel in sorted(wheels.items()):
    language = source if source != "en" else target
    for english, translated in po_text.sentence_pairs(wheel, language):
      pairs.append((english, translated, domain) if source == "en" else
                   (translated, english, domain))
  seen = {p[0] for p in pairs}
  pairs += [p for p in extra_pairs if p[0] not in seen]
  if not pairs:
    raise po_text.TextSourceError(f"no sentence pairs for {source}-{target}")
  order = rng.permutation(len(pairs))
  if spec.max_sentences:
    order = order[:spec.max_sentences]
  n_held = max(1, int(len(order) * spec.heldout_fraction))
  if spec.max_heldout:
    n_held = min(n_held, spec.max_heldout)
  split_pairs = {"dev": order[:n_held], "tst-COMMON": order[n_held:2 * n_held],
                 "train": order[2 * n_held:]}
  speakers = {split: _speakers(rng, source, variants)
              for split, variants in split_variants(spec.seed).items()}
  # Training speakers beyond each variant's first, and the extra variants, come from a stream
  # of their own, so that the held-out splits are the same for any train_speakers_per_variant
  # and extra_training_variants (and without extra variants, every sentence's variant too).
  extra_rng = stream(11)
  per_variant = spec.train_speakers_per_variant
  train_speakers = [[voice] + _speakers(extra_rng, source, [voice.variant] * (per_variant - 1))
                    for voice in speakers["train"]]
  if spec.extra_training_variants:
    train_speakers += [_speakers(extra_rng, source, [variant] * per_variant)
                       for variant in EXTRA_TRAINING_VARIANTS]
    # A sentence's speaker is of each sex as often as without the extra variants (most of
    # which are male), then any training speaker of that sex.
    sex_of = {variant: sex for table in (VARIANTS_BY_SEX, EXTRA_TRAINING_VARIANTS_BY_SEX)
              for sex, variants in table.items() for variant in variants}
    groups_by_sex = {sex: [i for i, group in enumerate(train_speakers)
                           if sex_of[group[0].variant] == sex] for sex in ("female", "male")}
    female_share = float(np.mean([sex_of[v.variant] == "female" for v in speakers["train"]]))
  # Other synthesizers' training speakers: a sentence's espeak-ng speaker is replaced by one of
  # theirs as often as they are among all training voices (their own stream again).
  engine_rng = stream(13)
  other_engines = [engine for engine in spec.synthesizers if engine != "espeak"]
  engine_groups = [group for engine in other_engines
                   for group in _engine_speakers(engine_rng, source, engine, per_variant)]
  # More speakers of each such voice (other_speakers_per_voice) from streams of their own: the
  # sentences each voice speaks stay the same, spoken at more rates and pitches.
  more = max(0, (spec.other_speakers_per_voice or per_variant) - per_variant)
  extra_engine_rng = stream(19)
  extra_groups = [group for engine in other_engines
                  for group in _engine_speakers(extra_engine_rng, source, engine, more)]
  engine_speakers = {group[0]: group + extra for group, extra in zip(engine_groups, extra_groups)}
  engine_pick_rng = stream(23)
  engine_share = spec.other_synthesizer_share or (
      len(engine_groups) / (len(engine_groups) + len(train_speakers)))
  plan = {}
  for split in SPLITS:
    repeats = spec.train_speakers_per_sentence if split == "train" else 1
    by_speaker: dict[Voice, list[Segment]] = {}
    for index in split_pairs[split]:
      chosen = rng.choice(len(speakers[split]), size=repeats, replace=False)
      if split != "train":
        voices = [speakers[split][c] for c in chosen]
      else:
        if spec.extra_training_variants:
          sex = "female" if extra_rng.random() < female_share else "male"
          chosen = extra_rng.choice(groups_by_sex[sex], size=repeats, replace=False)
        voices = [train_speakers[c][int(extra_rng.integers(len(train_speakers[c])))]
                  for c in chosen]
        if engine_groups:
          voices = [_other_engine_voice(engine_rng, engine_groups, engine_speakers,
                                        engine_pick_rng)
                    if engine_rng.random() < engine_share else voice for voice in voices]
      for voice in voices:
        by_speaker.setdefault(voice, []).append(Segment(*pairs[index], voice))
    talks = []
    voices = (sum(train_speakers + list(engine_speakers.values()), []) if split == "train"
              else speakers[split])
    for voice in dict.fromkeys(voices):   # once each: two draws can give the same speaker
      segments = by_speaker.get(voice, [])
      for start in range(0, len(segments), spec.segments_per_talk):
        talks.append(segments[start:start + spec.segments_per_talk])
    plan[split] = talks
  if spec.unseen_synthesizer:
    unseen_rng = stream(17)
    voices = sum(_engine_speakers(unseen_rng, source, spec.unseen_synthesizer, 2,
                                  names=unseen_voices(spec)), [])
    segments = [Segment(*pairs[index], voices[n % len(voices)])
                for n, index in enumerate(split_pairs["tst-COMMON"])]
    plan[UNSEEN_SYNTH_SPLIT] = [segments[start:start + spec.segments_per_talk]
                                for start in range(0, len(segments), spec.segments_per_talk)]
  return plan


def unseen_voices(spec: CorpusSpec) -> tuple[str, ...]:
  """The unseen synthesizer's voices that speak UNSEEN_SYNTH_SPLIT: all but those made from the
  same speaker as a training voice (festival's kal_diphone is flite's kal16)."""
  training = {(engine, name) for engine in spec.synthesizers if engine != "espeak"
              for name in synthesizers.voice_names(ENGINE_VOICES[engine])}
  engine = spec.unseen_synthesizer
  return tuple(name for name in synthesizers.voice_names(ENGINE_VOICES[engine])
               if synthesizers.SAME_SPEAKER.get((engine, name)) not in training)


def _other_engine_voice(rng, groups, speakers_of, pick_rng) -> Voice:
  """A training speaker of another synthesizer: a voice's speaker drawn from `rng` as without
  other_speakers_per_voice, then, where that voice has more speakers (`speakers_of`, keyed by
  its first), one of them from `pick_rng`."""
  group = groups[int(rng.integers(len(groups)))]
  voice = group[int(rng.integers(len(group)))]
  speakers = speakers_of[group[0]]
  return voice if len(speakers) == len(group) else speakers[int(pick_rng.integers(len(speakers)))]


def _resample(samples: np.ndarray, rate: int) -> np.ndarray:
  import soxr  # pylint: disable=import-outside-toplevel
  return soxr.resample(samples.astype(np.float32) / 32768.0, rate, SAMPLE_RATE)


def write_wav(path: str, samples: np.ndarray, rate: int = SAMPLE_RATE):
  """Atomic 16-bit mono wav write (a reader never sees a half-written file)."""
  tmp = path + ".tmp"
  pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
  with wave.open(tmp, "wb") as f:
    f.setnchannels(1)
    f.setsampwidth(2)
    f.setframerate(rate)
    f.writeframes(pcm.tobytes())
  os.replace(tmp, path)


_SYNTHS = {}


def _engine(engine: str, cache_dir: str):
  """This process's synthesizer of `engine` (made once)."""
  if engine not in _SYNTHS:
    _SYNTHS[engine] = (Synthesizer() if engine == "espeak" else
                       {"flite": synthesizers.Flite, "festival": synthesizers.Festival,
                        "mbrola": synthesizers.Mbrola,
                        "rhvoice": synthesizers.Rhvoice}[engine](cache_dir))
  return _SYNTHS[engine]


def speak(text: str, voice: Voice, cache_dir: str) -> np.ndarray:
  """float32 samples of `text` spoken by `voice`, at SAMPLE_RATE (its engine made once)."""
  synth = _engine(voice.engine, cache_dir)
  return _resample(synth.synthesize(text, voice), synth.sample_rate)


def _synthesize_talk(job):
  """Worker: synthesises one talk wav; returns its segment entries (offsets in seconds)."""
  path, segments, seed, cache_dir = job
  rng = np.random.default_rng(seed)
  pieces, entries, cursor = [], [], 0
  for segment in segments:
    gap = np.zeros(int(SAMPLE_RATE * rng.uniform(0.3, 0.9)), np.float32)
    speech = speak(segment.source, segment.voice, cache_dir)
    pieces += [gap, speech]
    cursor += len(gap)
    entries.append({"offset": round(cursor / SAMPLE_RATE, 4),
                    "duration": round(len(speech) / SAMPLE_RATE, 4)})
    cursor += len(speech)
  pieces.append(np.zeros(int(SAMPLE_RATE * 0.5), np.float32))
  if not os.path.exists(path):
    write_wav(path, np.concatenate(pieces))
  return entries


def _yaml_line(entry: dict) -> str:
  return ("- {duration: %s, offset: %s, speaker_id: %s, wav: %s, domain: %s, lang: %s}\n" %
          (entry["duration"], entry["offset"], entry["speaker_id"], entry["wav"],
           entry["domain"], entry["lang"]))


def _atomic_text(path: str, text: str):
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def _spec_json(spec: CorpusSpec) -> str:
  """The spec as recorded in a build's marker. train_speakers_per_variant and
  extra_training_variants are left out at their defaults, so that builds made before they
  existed stay valid (their plan is the same)."""
  fields = dataclasses.asdict(spec)
  for name, default in (("train_speakers_per_variant", 1), ("extra_training_variants", False),
                        ("bible_english", "web"), ("bible_max_words", 20),
                        ("synthesizers", ("espeak",)), ("unseen_synthesizer", ""),
                        ("other_synthesizer_share", 0.0), ("other_speakers_per_voice", 0)):
    if fields[name] == default or (name.startswith("bible") and "bible" not in spec.text):
      del fields[name]
  if "synthesizers" in fields:
    fields["synthesizers"] = list(fields["synthesizers"])
  if spec.unseen_synthesizer:       # builds of before the split left out training voices' twins
    fields["unseen_voices"] = list(unseen_voices(spec))
  if "bible" in spec.text:       # Bible text of before the capitals were truecased: rebuilt
    fields["bible_text"] = "truecased"
  return json.dumps(dict(fields, voices=split_variants(spec.seed)), sort_keys=True)


def direction_dir(out: str, source: str, target: str) -> str:
  """{out}/{src}-{tgt}: where `build` writes one direction (MuST-C's layout)."""
  return os.path.join(out, f"{source}-{target}")


def is_built(root: str, spec: CorpusSpec) -> bool:
  """Whether the direction directory `root` holds a complete build of `spec` (False when it is
  not complete); a complete build of another spec or speaker set raises FileExistsError."""
  marker = os.path.join(root, COMPLETE)
  if not os.path.exists(marker):
    return False
  if spec.synthesizers != ("espeak",) or spec.unseen_synthesizer:
    spec = effective_spec(spec, log=lambda message: None)
  with open(marker, encoding="utf-8") as f:
    if json.load(f).get("spec") == _spec_json(spec):
      return True
  raise FileExistsError(f"{root} was built with a different spec or speaker set; remove it "
                        f"(and any corpus prepared from it) or build into another directory "
                        f"(--out here, data.root in a config)")


def build(out: str, spec: CorpusSpec = CorpusSpec(), workers: int = 2,
          progress: bool = True) -> list[str]:
  """Builds every direction of `spec` under `out`; returns the direction directories.
  Synthesizers that cannot be had here are left out with a warning (`effective_spec`)."""
  wheels = po_text.download_wheels(spec.wheel_cache or po_text.default_wheel_cache()) if (
      "catalogs" in spec.text) else {}
  spec = effective_spec(spec)
  cache_dir = synthesizer_cache(spec)
  done_dirs = []
  spec_json = _spec_json(spec)
  for source, target in spec.directions():
    root = direction_dir(out, source, target)
    if is_built(root, spec):
      done_dirs.append(root)
      continue
    plan = plan_direction(spec, source, target, wheels, ding_pairs(spec, source, target) +
                          bible_pairs(spec, source, target))
    jobs, meta = [], []
    for split, talks in plan.items():
      os.makedirs(os.path.join(root, "data", split, "wav"), exist_ok=True)
      os.makedirs(os.path.join(root, "data", split, "txt"), exist_ok=True)
      for t, segments in enumerate(talks):
        talk = f"{split.replace('-', '_')}_{t:04d}"
        path = os.path.join(root, "data", split, "wav", f"{talk}.wav")
        jobs.append((path, segments, spec.seed * 100003 + len(jobs), cache_dir))
        meta.append((split, talk, segments))
    entries_by_split = {s: [] for s in spec.splits()}
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
      results = pool.imap(_synthesize_talk, jobs, chunksize=1)
      bar = progress_bar(results, total=len(jobs), desc=f"synthesising {source}-{target}",
                 unit="talk", disable=not progress)
      for (split, talk, segments), timings in zip(meta, bar):
        for segment, timing in zip(segments, timings):
          entries_by_split[split].append(dict(
              timing, speaker_id=segment.voice.speaker_id, wav=f"{talk}.wav",
              domain=segment.domain, lang=source, source=segment.source,
              target=segment.target))
      # Workers that exit on their own remove their espeak-ng data overlay; leaving the block
      # without this terminates them and leaks one temporary directory each.
      pool.close()
      pool.join()
    for split, entries in entries_by_split.items():
      txt = os.path.join(root, "data", split, "txt")
      _atomic_text(os.path.join(txt, f"{split}.{source}"),
                   "".join(e["source"] + "\n" for e in entries))
      _atomic_text(os.path.join(txt, f"{split}.{target}"),
                   "".join(e["target"] + "\n" for e in entries))
      _atomic_text(os.path.join(txt, f"{split}.yaml"), "".join(map(_yaml_line, entries)))
    counts = {s: len(e) for s, e in entries_by_split.items()}
    _atomic_text(os.path.join(root, COMPLETE),
                 json.dumps({"spec": spec_json, "segments": counts}))
    done_dirs.append(root)
  return done_dirs


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--sources", default="en", help="comma-separated source languages")
  parser.add_argument("--target", default="de")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--max-sentences", type=int, default=0)
  parser.add_argument("--speakers-per-sentence", type=int, default=2)
  parser.add_argument("--extra-training-variants", action="store_true",
                      help=f"train on {len(EXTRA_TRAINING_VARIANTS)} more voice variants")
  parser.add_argument("--speakers-per-variant", type=int, default=1,
                      help="training speakers of each voice variant, each with its own rate "
                           "and pitch")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--text", default="catalogs",
                      help=f"comma-separated text sources: {', '.join(TEXT_SOURCES)} (ding: "
                           f"German-English example sentences, ~15k; bible: English-Spanish "
                           f"verses)")
  parser.add_argument("--synthesizers", default="espeak",
                      help="training speakers' synthesizers: espeak plus any of "
                           f"{', '.join(ENGINES[1:])}")
  parser.add_argument("--unseen-synthesizer", default="",
                      help=f"build {UNSEEN_SYNTH_SPLIT}: tst-COMMON's sentences spoken by this "
                           f"synthesizer (one of {', '.join(ENGINES[1:])}, not among "
                           f"--synthesizers)")
  parser.add_argument("--other-synthesizer-share", type=float, default=0.0,
                      help="share of the training utterances spoken by the synthesizers "
                           "besides espeak (0: as often as their voices are among all)")
  parser.add_argument("--other-speakers-per-voice", type=int, default=0,
                      help="training speakers (rate, pitch) of each voice of the synthesizers "
                           "besides espeak (0: --speakers-per-variant)")
  parser.add_argument("--bible-english", default="web", help="web or kjv (--text bible)")
  parser.add_argument("--bible-max-words", type=int, default=20)
  parser.add_argument("--max-heldout", type=int, default=0,
                      help="at most this many dev and test sentences (0: 8%% each)")
  args = parser.parse_args(argv)
  text = tuple(t for t in args.text.split(",") if t)
  languages = tuple(args.sources.split(","))
  unknown = [l for l in languages + (args.target,) if l not in ESPEAK_VOICE]
  if unknown:
    parser.error(f"unsupported language(s) {unknown}; valid: {sorted(ESPEAK_VOICE)}")
  try:
    spec = CorpusSpec(sources=languages, target=args.target, seed=args.seed,
                      max_sentences=args.max_sentences,
                      train_speakers_per_sentence=args.speakers_per_sentence,
                      train_speakers_per_variant=args.speakers_per_variant,
                      extra_training_variants=args.extra_training_variants, text=text,
                      max_heldout=args.max_heldout,
                      synthesizers=tuple(e for e in args.synthesizers.split(",") if e),
                      unseen_synthesizer=args.unseen_synthesizer,
                      other_synthesizer_share=args.other_synthesizer_share,
                      other_speakers_per_voice=args.other_speakers_per_voice,
                      bible_english=args.bible_english, bible_max_words=args.bible_max_words)
  except ValueError as error:
    parser.error(str(error))
  for root in build(args.out, spec, args.workers):
    print(f"built {root}")


# The command line and console script: user errors -> their message and exit status 2.
cli = cli_errors.command_line_entry(main)


if __name__ == "__main__":
  cli()
