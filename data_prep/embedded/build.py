"""Builds the embedded speech-translation corpus: real translated sentences, synthetic speakers.

The text comes from `text/` (message catalogs of PyPI wheels, the Ding dictionary's example
sentences, Bible verses), the speakers from `voices/` (espeak-ng, flite, festival, MBROLA,
RHVoice), who speaks what from `plan.py`, every setting from `spec.CorpusSpec`. Written in the
exact MuST-C on-disk layout, so the MuST-C reader serves it unchanged:

    {out}/{src}-{tgt}/data/{split}/wav/{talk}.wav          16 kHz mono 16-bit
    {out}/{src}-{tgt}/data/{split}/txt/{split}.yaml        - {duration, offset, speaker_id,
                                                              wav, domain, lang}
    {out}/{src}-{tgt}/data/{split}/txt/{split}.{src|tgt}   one segment per line

Splits are MuST-C's: train, dev, tst-COMMON (and tst-unseen-synth with an unseen
synthesizer). English->German is the default; `--sources de,es,fr,it,pt --target en` builds
several languages -> English (mTEDx-style directions). Deterministic for a seed; resumable
(finished talks are kept) and atomic (a direction is marked complete only when every file is in
place).

    python -m data_prep.embedded --out data/embedded            # en-de, ~1 minute
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import os

import numpy as np

from multiformer_common.errors import ExistingOutput
from multiformer_common import atomic, cli_errors
from multiformer_common.progress import progress_bar
from data_prep.embedded import recorded, text, voices
from data_prep.embedded.plan import (plan_direction, plan_spoken_text, real_heldout_lines,
                                     split_variants, unseen_voices)
from data_prep.embedded.spec import (NARROWBAND_SPLIT, REAL_SPLITS, RECORDED_GAMES,
                                     UNSEEN_SYNTH_SPLIT, CorpusSpec, add_arguments,
                                     specs_from_arguments)

SAMPLE_RATE = voices.SAMPLE_RATE
NARROW_RATE = 11025        # the games' sampling rate
COMPLETE = ".complete.json"
RECORDED_PER_TALK = 20
TEXT_ONLY_DIR = "text"      # {direction}/text/{name}.{language}: parallel text without speech


def effective_spec(spec: CorpusSpec, log=print) -> CorpusSpec:
  """`spec` without the synthesizers and games that cannot be had here (fetched and run once to
  know), each named in a warning: training then hears espeak-ng alone; without the unseen
  synthesizer there is no UNSEEN_SYNTH_SPLIT; without a game no recorded training speech or no
  real splits."""
  engines = [e for e in spec.synthesizers if e != "espeak"]
  unseen = [spec.unseen_synthesizer] if spec.unseen_synthesizer else []
  missing = []
  for engine in engines + unseen:
    problem = _engine_problem(engine, voices.cache_dir(spec.package_cache()))
    if problem:
      log(f"WARNING: the embedded corpus is built without {engine} ({problem}); "
          + ("training hears espeak-ng alone" if engine in engines else
             f"there is no {UNSEEN_SYNTH_SPLIT} split"))
      missing.append(engine)
  without_game = {
      "recorded_train": "the ASR training hears no recorded speech",
      "spoken_dialogue": "the training voices do not read its dialogue",
      "real_test": f"there are no {', '.join(REAL_SPLITS + (NARROWBAND_SPLIT,))} splits"}
  for setting, consequence in without_game.items():
    value = getattr(spec, setting)
    for game in (value if isinstance(value, tuple) else [value] * bool(value)):
      problem = _game_problem(game, spec.package_cache())
      if problem:
        log(f"WARNING: the embedded corpus is built without {RECORDED_GAMES[game]} "
            f"({problem}); {consequence}")
        value = tuple(g for g in value if g != game) if isinstance(value, tuple) else ""
        spec = dataclasses.replace(spec, **{setting: value})
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
  name = voices.voice_names(voices.ENGINE_VOICES[engine])[0]
  try:
    voices.engine(engine, cache_dir).synthesize(
        "Hello.", voices.Voice("en-us", name, 175, 50, engine))
  except voices.SynthesizerUnavailable as error:
    return str(error)
  return ""


@functools.lru_cache(maxsize=None)
def _game_problem(game: str, cache_dir: str) -> str:
  """Why `game`'s recorded speech cannot be had here ("" if it can), asked once per process."""
  try:
    recorded.check_available(game, cache_dir)
  except recorded.GameUnavailable as error:
    return str(error)
  return ""


def band_limited(samples: np.ndarray) -> np.ndarray:
  """16 kHz audio through the games' 11,025 Hz sampling: nothing above 5.5 kHz is left."""
  import soxr  # pylint: disable=import-outside-toplevel
  low = soxr.resample(samples.astype(np.float32), SAMPLE_RATE, NARROW_RATE)
  back = soxr.resample(low, NARROW_RATE, SAMPLE_RATE).astype(np.float32)
  return np.resize(back, len(samples)) if len(back) != len(samples) else back


def _talk_audio(utterances, rng) -> tuple[np.ndarray, list[dict]]:
  """One talk's audio from its utterances' samples, 0.3-0.9 s of silence before each and 0.5 s
  at the end -> (samples, [{offset, duration}] in seconds)."""
  pieces, entries, cursor = [], [], 0
  for speech in utterances:
    gap = np.zeros(int(SAMPLE_RATE * rng.uniform(0.3, 0.9)), np.float32)
    pieces += [gap, speech]
    cursor += len(gap)
    entries.append({"offset": round(cursor / SAMPLE_RATE, 4),
                    "duration": round(len(speech) / SAMPLE_RATE, 4)})
    cursor += len(speech)
  pieces.append(np.zeros(int(SAMPLE_RATE * 0.5), np.float32))
  return np.concatenate(pieces), entries


def _synthesize_talk(job):
  """Worker: synthesises one talk wav (band-limited if asked); returns its segment entries."""
  path, segments, seed, cache_dir, narrowband = job
  rng = np.random.default_rng(seed)
  speech = (voices.speak(segment.source, segment.voice, cache_dir) for segment in segments)
  samples, entries = _talk_audio(speech, rng)
  if not os.path.exists(path):
    voices.write_wav(path, band_limited(samples) if narrowband else samples)
  return entries


def _yaml_line(entry: dict) -> str:
  return ("- {duration: %s, offset: %s, speaker_id: %s, wav: %s, domain: %s, lang: %s}\n" %
          (entry["duration"], entry["offset"], entry["speaker_id"], entry["wav"],
           entry["domain"], entry["lang"]))


def _atomic_text(path: str, content: str):
  atomic.write_text(path, content)


def _spec_json(spec: CorpusSpec) -> str:
  """What a build's marker records: every setting but the cache's place, the voices of each
  split and, with an unseen synthesizer, the voices that speak it."""
  fields = {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(spec).items() if k != "cache_root"}
  if not spec.spoken_dialogue:     # later settings: builds from before them still match
    del fields["spoken_dialogue"]
  if spec.uqm_share == 1.0 or "uqm" not in spec.recorded_train:   # it draws nothing then
    del fields["uqm_share"]
  fields["voices"] = split_variants(spec.seed)
  if spec.unseen_synthesizer:
    fields["unseen_voices"] = list(unseen_voices(spec))
  return json.dumps(fields, sort_keys=True)


def direction_dir(out: str, source: str, target: str) -> str:
  """{out}/{src}-{tgt}: where `build` writes one direction (MuST-C's layout)."""
  return os.path.join(out, f"{source}-{target}")


def is_built(root: str, spec: CorpusSpec) -> bool:
  """Whether the direction directory `root` holds a complete build of `spec` (False when it is
  not complete); a complete build of another spec or speaker set raises FileExistsError."""
  marker = os.path.join(root, COMPLETE)
  if not os.path.exists(marker):
    return False
  if spec.synthesizers != ("espeak",) or spec.unseen_synthesizer or spec.recorded_train or \
      spec.spoken_dialogue or spec.real_test:     # what can be had here decides what was built
    spec = effective_spec(spec, log=_quiet)
  with open(marker, encoding="utf-8") as f:
    if json.load(f).get("spec") == _spec_json(spec):
      return True
  raise ExistingOutput(f"{root} was built with a different spec or speaker set; remove it "
                        f"(and any corpus prepared from it) or build into another directory "
                        f"(--out here, data.root in a config)")


def _synthesize_direction(root: str, spec: CorpusSpec, source: str, target: str, plan: dict,
                          workers: int, progress: bool, talk_prefix: str = ""
                          ) -> dict[str, list[dict]]:
  """Writes every talk's wav of `plan` under `root` (named `talk_prefix`{split}_{number})
  -> {split: [segment entries]}."""
  cache_dir = voices.cache_dir(spec.package_cache())
  jobs, meta = [], []
  narrow_rng = np.random.default_rng([spec.seed, 23])
  for split, talks in plan.items():
    os.makedirs(os.path.join(root, "data", split, "wav"), exist_ok=True)
    os.makedirs(os.path.join(root, "data", split, "txt"), exist_ok=True)
    for t, segments in enumerate(talks):
      talk = f"{talk_prefix}{split.replace('-', '_')}_{t:04d}"
      path = os.path.join(root, "data", split, "wav", f"{talk}.wav")
      narrowband = split == "train" and spec.narrowband_share > 0 and (
          narrow_rng.random() < spec.narrowband_share)
      jobs.append((path, segments, spec.seed * 100003 + len(jobs), cache_dir, narrowband))
      meta.append((split, talk, segments))
  entries_by_split = {s: [] for s in plan}
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
  return entries_by_split


def build(out: str, spec: CorpusSpec = CorpusSpec(), workers: int = 2,
          progress: bool = True) -> list[str]:
  """Builds every direction of `spec` under `out`; returns the direction directories.
  Synthesizers that cannot be had here are left out with a warning (`effective_spec`)."""
  wheels = text.catalog_wheels(spec)
  spec = effective_spec(spec)
  done_dirs = []
  for source, target in spec.directions():
    root = direction_dir(out, source, target)
    if is_built(root, spec):
      done_dirs.append(root)
      continue
    pairs = text.direction_pairs(spec, source, target, wheels,
                                 text.ding_pairs(spec, source, target) +
                                 text.bible_pairs(spec, source, target))
    plan = plan_direction(spec, source, target, pairs)
    entries_by_split = _synthesize_direction(root, spec, source, target, plan, workers,
                                             progress)
    if spec.real_test and source == "en":
      entries_by_split.update(_real_splits(root, spec, target, entries_by_split["tst-COMMON"]))
    _write_split_texts(root, spec, source, target, entries_by_split)
    done_dirs.append(root)
  for pair in spec.transcription_pairs():
    root = direction_dir(out, *pair.split("-"))
    if not is_built(root, spec):
      entries = _recorded_train_split(root, spec) if spec.recorded_train else []
      if spec.spoken_dialogue:
        plan = {"train": plan_spoken_text(spec, "en", _dialogue_lines(spec))}
        entries += _synthesize_direction(root, spec, "en", "en", plan, workers, progress,
                                         talk_prefix="spoken_")["train"]
      _write_split_texts(root, spec, "en", "en", {"train": entries})
    done_dirs.append(root)
  return done_dirs


def _write_split_texts(root: str, spec: CorpusSpec, source: str, target: str,
                       entries_by_split: dict[str, list[dict]]):
  """Each split's yaml and text files, then the direction's marker (the build is complete)."""
  for split, entries in entries_by_split.items():
    txt = os.path.join(root, "data", split, "txt")
    os.makedirs(txt, exist_ok=True)
    for language, side in dict(((source, "source"), (target, "target"))).items():
      _atomic_text(os.path.join(txt, f"{split}.{language}"),
                   "".join(e[side] + "\n" for e in entries))
    _atomic_text(os.path.join(txt, f"{split}.yaml"), "".join(map(_yaml_line, entries)))
  counts = {s: len(e) for s, e in entries_by_split.items()}
  _atomic_text(os.path.join(root, COMPLETE),
               json.dumps({"spec": _spec_json(spec), "segments": counts}))


def _recorded_talks(root: str, split: str, lines, source: str, target_of, seed: int,
                    progress: bool) -> list[dict]:
  """Writes recorded lines as talks of RECORDED_PER_TALK (each speaker's lines together) ->
  the split's segment entries. A talk already written is kept (the build resumes)."""
  for folder in ("wav", "txt"):
    os.makedirs(os.path.join(root, "data", split, folder), exist_ok=True)
  by_speaker: dict[str, list] = {}
  for line in lines:
    by_speaker.setdefault(line.speaker, []).append(line)
  talks = [group[start:start + RECORDED_PER_TALK] for group in by_speaker.values()
           for start in range(0, len(group), RECORDED_PER_TALK)]
  rng = np.random.default_rng([seed, 29])
  entries = []
  for t, talk_lines in enumerate(progress_bar(talks, desc=f"writing {split}", unit="talk",
                                              disable=not progress)):
    talk = f"{split.replace('-', '_')}_{t:04d}"
    path = os.path.join(root, "data", split, "wav", f"{talk}.wav")
    samples, timings = _talk_audio([line.audio for line in talk_lines], rng)
    if not os.path.exists(path):
      voices.write_wav(path, samples)
    entries += [dict(timing, speaker_id=line.speaker, wav=f"{talk}.wav",
                     domain=line.id.split("_")[0], lang=source, source=line.text,
                     target=target_of(line)) for line, timing in zip(talk_lines, timings)]
  return entries


def _recorded_train_split(root: str, spec: CorpusSpec, progress: bool = True, log=print
                          ) -> list[dict]:
  """The transcribed training split of spec.recorded_train's recorded dialogue (an en-en
  direction: the transcript is the target too), games in RECORDED_GAMES' order; of The Ur-Quan
  Masters', a draw of spec.uqm_share. A line that says the words of a real split's line is left
  out (counted)."""
  held_keys = set()
  if spec.real_test:
    held_keys = {recorded.text_key(line.text) for split in _sky_held_out(spec, log=_quiet)[1]
                 for line in split}
  lines = []
  for game in (g for g in RECORDED_GAMES if g in spec.recorded_train):
    tally = recorded.Tally()
    with recorded.training_lines(game, spec.package_cache(), tally) as found:
      share = spec.uqm_share if game == "uqm" else 1.0
      drawn = np.random.default_rng([spec.seed, 41])
      for line in found:
        if drawn.random() >= share:
          tally["linked, left out: beyond uqm_share"] += 1
          continue
        if recorded.text_key(line.text) in held_keys:
          tally["linked, left out: says a real split's line"] += 1
          continue
        lines.append(line)
    log(f"{RECORDED_GAMES[game]}: {tally.summary()}")
  return _recorded_talks(root, "train", lines, "en", lambda line: line.text, spec.seed,
                         progress)


def _quiet(message: str):
  """A log that says nothing."""


def _sky_held_out(spec: CorpusSpec, log=print) -> tuple[list, tuple[list, list]]:
  """(other lines, (dev-real's, tst-real's)) of Beneath a Steel Sky: the real splits' lines,
  drawn from those whose words no training transcript says, and every line that says none of
  their words (what training may read as text); without real splits, every line and ([], [])."""
  tally = recorded.Tally()
  lines = recorded.sky_lines(recorded.game_folder("sky", spec.package_cache()), tally)
  log(f"{RECORDED_GAMES['sky']}: {tally.summary()}")
  if not spec.real_test:
    return lines, ([], [])
  excluded = set()
  if "queen" in spec.recorded_train + spec.spoken_dialogue:    # no held-out line's text
                                                               # may be a training transcript
    excluded = {recorded.text_key(line.text) for line in recorded.queen_lines(
        recorded.game_folder("queen", spec.package_cache()), recorded.Tally(),
        with_audio=False)}
  held_out = real_heldout_lines(lines, spec, excluded)
  held_keys = {recorded.text_key(line.text) for split in held_out for line in split}
  return [line for line in lines if recorded.text_key(line.text) not in held_keys], held_out


def _dialogue_lines(spec: CorpusSpec) -> list[tuple[str, str]]:
  """(text, domain) of spec.spoken_dialogue's games, each text once: queen's linked lines,
  sky's lines that no real split holds (nor says the words of one); domain `{game}-text`."""
  found = {}
  if "queen" in spec.spoken_dialogue:
    folder = recorded.game_folder("queen", spec.package_cache())
    for line in recorded.queen_lines(folder, recorded.Tally(), with_audio=False):
      found.setdefault(recorded.text_key(line.text), (line.text, "queen-text"))
  if "sky" in spec.spoken_dialogue:
    for line in _sky_held_out(spec, log=_quiet)[0]:
      found.setdefault(recorded.text_key(line.text), (line.text, "sky-text"))
  return list(found.values())


def _write_text_only(root: str, name: str, source: str, target: str, others):
  """The game's `others` lines (never a held-out line's words) as parallel text without
  speech ({root}/text/{name}.{language}): what an MT stage may read (mt.text_only)."""
  os.makedirs(os.path.join(root, TEXT_ONLY_DIR), exist_ok=True)
  _atomic_text(os.path.join(root, TEXT_ONLY_DIR, f"{name}.{source}"),
               "".join(line.text + "\n" for line in others))
  _atomic_text(os.path.join(root, TEXT_ONLY_DIR, f"{name}.{target}"),
               "".join(line.translations[target] + "\n" for line in others))


def _real_splits(root: str, spec: CorpusSpec, target: str, tst_common: list[dict],
                 progress: bool = True, log=print) -> dict[str, list[dict]]:
  """dev-real and tst-real from Beneath a Steel Sky's recorded lines (against its `target`
  subtitles), and NARROWBAND_SPLIT: tst-COMMON's talks band-limited to 5.5 kHz."""
  others, held_out = _sky_held_out(spec, log)
  disk = recorded.steel_sky.Disk(recorded.game_folder("sky", spec.package_cache()))
  _write_text_only(root, "sky", "en", target, others)
  splits = {}
  for split, chosen in zip(REAL_SPLITS, held_out):
    chosen = [recorded.load_sky_audio(disk, line) for line in chosen]
    splits[split] = _recorded_talks(root, split, chosen, "en",
                                    lambda line: line.translations[target], spec.seed, progress)
  narrow_wav = os.path.join(root, "data", NARROWBAND_SPLIT, "wav")
  os.makedirs(narrow_wav, exist_ok=True)
  for wav in sorted({entry["wav"] for entry in tst_common}):
    path = os.path.join(narrow_wav, wav)
    if not os.path.exists(path):
      import soundfile  # pylint: disable=import-outside-toplevel
      samples, _ = soundfile.read(os.path.join(root, "data", "tst-COMMON", "wav", wav),
                                  dtype="float32")
      voices.write_wav(path, band_limited(samples))
  splits[NARROWBAND_SPLIT] = [dict(entry) for entry in tst_common]
  return splits


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m data_prep.embedded",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="the corpus folder (data.root in a config)")
  parser.add_argument("--workers", type=int, default=2, help="synthesising processes")
  add_arguments(parser)
  args = parser.parse_args(argv)
  try:
    specs = specs_from_arguments(args)
  except ValueError as error:
    parser.error(str(error))
  for spec in specs:
    for root in build(args.out, spec, args.workers):
      print(f"built {root}")


# The command line and console script: user errors -> their message and exit status 2.
cli = cli_errors.command_line_entry(main)
