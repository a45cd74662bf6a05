"""Who speaks what: the deterministic plan of one direction of the embedded corpus.

Sentences are shuffled with the spec's seed and cut into dev, tst-COMMON and train. Speakers are
espeak-ng voice variants of both sexes, each with its own speaking rate and pitch; dev and
tst-COMMON each get HELDOUT_PER_SEX variants of each sex that training never hears. Voices of the
other synthesizers in spec.synthesizers replace a share of the training utterances' espeak-ng
speakers; tst-unseen-synth is tst-COMMON's sentences spoken by spec.unseen_synthesizer's voices
whose speaker no training voice shares. Each random draw has a stream of its own, so that one
setting leaves the other splits' draws as they were.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from data_prep.embedded import recorded, voices
from data_prep.embedded.spec import ESPEAK_VOICE, SPLITS, UNSEEN_SYNTH_SPLIT, CorpusSpec
from data_prep.embedded.voices import Voice

# The speaker population: espeak-ng voice variants of both sexes. espeak-ng's deterministic
# variants are all male but `shelby`; the other female ones are used in their steady form
# (voices/espeak.py), so that a seed gives the same audio. Each held-out split gets
# HELDOUT_PER_SEX variants of each sex, drawn with the corpus seed and never heard in training.
VARIANTS_BY_SEX = {
    "male": ("Denis", "Diogo", "Henrique", "Hugo", "Storm", "adam", "benjamin", "david",
             "edward2", "klatt6", "michel", "miguel", "mike2"),
    "female": ("shelby", "f1-steady", "f2-steady", "f3-steady", "f4-steady", "f5-steady",
               "Annie-steady", "Andrea-steady", "Alicia-steady", "steph-steady",
               "belinda-steady"),
}
HELDOUT_PER_SEX = 1


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


def _espeak_speakers(rng, language: str, variants) -> list[Voice]:
  """One speaker per variant, each with its own speaking rate (words per minute) and pitch."""
  return [Voice(ESPEAK_VOICE[language], variant, int(rng.integers(125, 186)),
                int(rng.integers(25, 76))) for variant in variants]


def engine_speakers(rng, language: str, engine: str, per_voice: int = 1,
                    names=None) -> list[Voice]:
  """`per_voice` speakers of each voice of `engine` (of `names` only, if given), female voices
  first, each with its own rate and pitch."""
  speakers = []
  for sex in ("female", "male"):
    for name in voices.ENGINE_VOICES[engine].get(sex, ()):
      if names is None or name in names:
        speakers += [Voice(ESPEAK_VOICE[language], name, int(rng.integers(140, 201)),
                           int(rng.integers(30, 71)), engine) for _ in range(per_voice)]
  return speakers


def _engine_share(spec: CorpusSpec, engine_voices: list, espeak_voices: list) -> float:
  """How often a training utterance is the other synthesizers': other_synthesizer_share, or,
  where that is 0, their voices' share of all training voices."""
  return spec.other_synthesizer_share or (
      len(engine_voices) / (len(engine_voices) + len(espeak_voices)))


def unseen_voices(spec: CorpusSpec) -> tuple[str, ...]:
  """The unseen synthesizer's voices that speak UNSEEN_SYNTH_SPLIT: all but those made from the
  same speaker as a training voice (festival's kal_diphone is flite's kal16)."""
  training = {(engine, name) for engine in spec.synthesizers if engine != "espeak"
              for name in voices.voice_names(voices.ENGINE_VOICES[engine])}
  engine = spec.unseen_synthesizer
  return tuple(name for name in voices.voice_names(voices.ENGINE_VOICES[engine])
               if voices.SAME_SPEAKER.get((engine, name)) not in training)


def _talks(segments: list[Segment], size: int) -> list[list[Segment]]:
  return [segments[start:start + size] for start in range(0, len(segments), size)]


def plan_direction(spec: CorpusSpec, source: str, target: str, pairs: list[tuple]
                   ) -> dict[str, list[list[Segment]]]:
  """{split: [talk segments]} of one direction, from its (source text, target text, domain)
  `pairs` (text.direction_pairs)."""
  direction_key = sum(map(ord, source + target))
  stream = lambda n=None: np.random.default_rng(     # an independent stream of this direction
      [spec.seed, direction_key] + ([] if n is None else [n]))
  rng = stream()
  order = rng.permutation(len(pairs))
  if spec.max_sentences:
    order = order[:spec.max_sentences]
  n_held = max(1, int(len(order) * spec.heldout_fraction))
  if spec.max_heldout:
    n_held = min(n_held, spec.max_heldout)
  split_pairs = {"dev": order[:n_held], "tst-COMMON": order[n_held:2 * n_held],
                 "train": order[2 * n_held:]}
  speakers = {split: _espeak_speakers(rng, source, variants)
              for split, variants in split_variants(spec.seed).items()}
  # Other synthesizers' training speakers (a stream of their own): a sentence's espeak-ng
  # speaker is replaced by one of theirs with probability other_synthesizer_share, or as often
  # as they are among all training voices.
  engine_rng = stream(13)
  engine_voices = [voice for engine in spec.synthesizers if engine != "espeak"
                   for voice in engine_speakers(engine_rng, source, engine)]
  engine_share = _engine_share(spec, engine_voices, speakers["train"])
  plan = {}
  for split in SPLITS:
    repeats = spec.train_speakers_per_sentence if split == "train" else 1
    by_speaker: dict[Voice, list[Segment]] = {}
    for index in split_pairs[split]:
      chosen = rng.choice(len(speakers[split]), size=repeats, replace=False)
      voices_of_sentence = [speakers[split][c] for c in chosen]
      if split == "train" and engine_voices:
        voices_of_sentence = [
            engine_voices[int(engine_rng.integers(len(engine_voices)))]
            if engine_rng.random() < engine_share else voice for voice in voices_of_sentence]
      for voice in voices_of_sentence:
        by_speaker.setdefault(voice, []).append(Segment(*pairs[index], voice))
    split_speakers = speakers[split] + (engine_voices if split == "train" else [])
    plan[split] = [talk for voice in dict.fromkeys(split_speakers)   # once each
                   for talk in _talks(by_speaker.get(voice, []), spec.segments_per_talk)]
  if spec.unseen_synthesizer:
    unseen = engine_speakers(stream(17), source, spec.unseen_synthesizer, 2,
                             names=unseen_voices(spec))
    segments = [Segment(*pairs[index], unseen[n % len(unseen)])
                for n, index in enumerate(split_pairs["tst-COMMON"])]
    plan[UNSEEN_SYNTH_SPLIT] = _talks(segments, spec.segments_per_talk)
  return plan


def real_heldout_lines(lines, spec: CorpusSpec, excluded=frozenset()) -> tuple[list, list]:
  """(dev-real, tst-real): spec.real_heldout recorded lines each, disjoint in their words, drawn
  with the spec's seed from `lines` (recorded.RecordedLine) whose words (recorded.text_key) are
  said once in the game and are not in `excluded` (the training transcripts)."""
  said = collections.Counter(recorded.text_key(line.text) for line in lines)
  usable = [line for line in lines if said[recorded.text_key(line.text)] == 1 and
            recorded.text_key(line.text) not in excluded]
  order = np.random.default_rng([spec.seed, 31]).permutation(len(usable))
  n = spec.real_heldout
  return ([usable[i] for i in sorted(order[:n])], [usable[i] for i in sorted(order[n:2 * n])])


def plan_spoken_text(spec: CorpusSpec, source: str, lines: list[tuple[str, str]]
                     ) -> list[list[Segment]]:
  """Talks of (text, domain) `lines` read by the training voices (the training split's espeak-ng
  variants and the other synthesizers' voices at their share, as plan_direction draws them, in
  a stream of their own): transcribed speech without translation (spec.spoken_dialogue)."""
  rng = np.random.default_rng([spec.seed, 37])
  espeak = _espeak_speakers(rng, source, split_variants(spec.seed)["train"])
  others = [voice for engine in spec.synthesizers if engine != "espeak"
            for voice in engine_speakers(rng, source, engine)]
  share = _engine_share(spec, others, espeak)
  by_speaker: dict[Voice, list[Segment]] = {}
  for text, domain in lines:
    pool = others if others and rng.random() < share else espeak
    voice = pool[int(rng.integers(len(pool)))]
    by_speaker.setdefault(voice, []).append(Segment(text, text, domain, voice))
  return [talk for voice in dict.fromkeys(espeak + others) if voice in by_speaker
          for talk in _talks(by_speaker[voice], spec.segments_per_talk)]
