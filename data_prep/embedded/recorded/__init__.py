"""Recorded speech of real people, from three games Debian packages with their text.

- amazon_queen: Flight of the Amazon Queen's dialogue, ~4,000 clips of its cast; it joins the
  ASR training (an X-X pair: transcripts, no translation).
- steel_sky: Beneath a Steel Sky's ~3,500 spoken lines, another studio's cast, with the game's
  own Spanish and German subtitles: the dev-real and tst-real splits (real speech translation).
- ur_quan: The Ur-Quan Masters' alien dialogue (Debian's non-free section), a third cast; it
  can join the ASR training as Flight of the Amazon Queen's does.

`queen_lines`, `uqm_lines` and `sky_lines` yield `RecordedLine`s (16 kHz audio, cleaned text) and count
what they leave out, with the reason, in a `Tally`; `training_lines` opens either training
game's. `game_folder` fetches a game's package (apt-get download + dpkg-deb -x into the cache,
as the Bible's); `check_available` and `GameUnavailable` say what is missing where a game
cannot be had.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
from typing import Iterator

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common import packages
from data_prep.embedded.recorded import amazon_queen, steel_sky, ur_quan

SAMPLE_RATE = 16000
GAMES = {"queen": amazon_queen, "sky": steel_sky, "uqm": ur_quan}
# The Ur-Quan Masters' pages are joined into utterances of at most this many seconds.
UQM_MAX_SECONDS = 15.0


class GameUnavailable(RuntimeError):
  """A game's package cannot be fetched or read here."""


@dataclasses.dataclass(frozen=True)
class RecordedLine:
  """One recorded utterance: its id, who speaks it, its English text and its translations."""
  id: str
  speaker: str
  text: str
  translations: dict
  audio: np.ndarray | None = None     # float32 at SAMPLE_RATE, or None until loaded


class Tally(collections.Counter):
  """Counts of what a reader did with each clip or line: "linked", or a reason it was not."""

  def summary(self) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in self.most_common())


def game_folder(game: str, cache_dir: str, package: str = "") -> str:
  """The unpacked game data folder of `game` (queen | sky | uqm; `package`: another of its
  packages, uqm's text), fetched into the cache if needed. GameUnavailable says what is
  missing."""
  module = GAMES[game]
  package = package or module.PACKAGE
  try:
    root = packages.fetch(package, cache_dir)
  except packages.PackageUnavailable as error:
    raise GameUnavailable(str(error)) from error
  folder = os.path.join(root, module.GAME_DIR)
  if not os.path.isdir(folder):
    raise GameUnavailable(f"{package} has no {module.GAME_DIR} (another version?)")
  return folder


def uqm_archives(cache_dir: str) -> ur_quan.Archives:
  """The Ur-Quan Masters' voice pack and content, fetched into the cache if needed."""
  voice = os.path.join(game_folder("uqm", cache_dir), ur_quan.VOICE_ARCHIVE)
  content = os.path.join(game_folder("uqm", cache_dir, ur_quan.TEXT_PACKAGE),
                         ur_quan.CONTENT_ARCHIVE)
  for path in (voice, content):
    if not os.path.isfile(path):
      raise GameUnavailable(f"{path} is missing (another version of the packages?)")
  return ur_quan.Archives(voice, content)


def check_available(game: str, cache_dir: str):
  """Fetches what `game` (queen | sky | uqm) reads, if needed; GameUnavailable says what is
  missing."""
  if game == "uqm":
    uqm_archives(cache_dir).close()
  else:
    game_folder(game, cache_dir)


# The games whose lines can join the ASR training, in the order they join it.
TRAINING_GAMES = ("queen", "uqm")


@contextlib.contextmanager
def training_lines(game: str, cache_dir: str, tally: Tally) -> Iterator[Iterator[RecordedLine]]:
  """-> the lines of a training game (one of TRAINING_GAMES), read while the context is
  open (The Ur-Quan Masters' archives close with it)."""
  if game == "queen":
    yield queen_lines(game_folder(game, cache_dir), tally)
  elif game == "uqm":
    with uqm_archives(cache_dir) as archives:
      yield uqm_lines(archives, tally)
  else:
    raise InvalidValue(f"recorded training game {game!r}; valid: {TRAINING_GAMES}")


# Stage directions and marks that are not spoken: <gulp>, (sigh), the trademark sign ^_.
_UNSPOKEN = re.compile(r"<[^>]*>|\([^)]*\)|\^_|\*")
_SHOUTED = re.compile(r"\b([^\W\d_]{2,})\b")


def clean_text(text: str) -> str:
  """A line as a transcript or a reference: stage directions dropped, the games' quote marks
  (`...') as plain ones, words in capitals for emphasis ("a VERY fine line") in lower case
  (capitalised at the start), spaces collapsed."""
  text = _UNSPOKEN.sub(" ", text).replace("`", "'")
  text = _SHOUTED.sub(lambda m: m.group(1).lower() if m.group(1).isupper() else m.group(1),
                      text)
  text = re.sub(r"\s+([.,!?;:])", r"\1", " ".join(text.split()))
  return text[:1].upper() + text[1:]


def text_key(text: str) -> str:
  """What two lines share when they say the same words: lower-case letters, digits, spaces."""
  return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def _to_16k(samples: np.ndarray, rate: int) -> np.ndarray:
  import soxr  # pylint: disable=import-outside-toplevel
  return soxr.resample(samples.astype(np.float32), rate, SAMPLE_RATE).astype(np.float32)


def queen_lines(folder: str, tally: Tally, with_audio: bool = True) -> Iterator[RecordedLine]:
  """Flight of the Amazon Queen's dialogue and cutaway clips linked to their text, in file
  order (dialogues, then cutaways).
  Left out, and counted: segments without text, segments whose clip the game lacks (in a
  cutaway: sentences of objects that do not speak), clips two lines name (the first keeps it), text that is all stage directions, undecodable clips."""
  path = os.path.join(folder, amazon_queen.DATA_FILE)
  index = amazon_queen.read_index(path)
  seen = set()
  with open(path, "rb") as f:
    def resource(name):
      offset, size = index[name]
      f.seek(offset)
      return f.read(size)
    found = [segment for name in sorted(n for n in index if n.endswith(".DOG"))
             for segment in amazon_queen.dialogue_segments(resource(name))]
    found += [segment for name in sorted(n for n in index if n.endswith(".CUT"))
              for segment in amazon_queen.cutaway_segments(name, resource(name))]
    for segment in found:
      if segment.text.strip() in ("", "0"):
        tally["segment without text"] += 1
        continue
      if segment.clip not in index:
        tally["cutaway sentence without a clip (not spoken)" if segment.speaker.startswith(
            "cut_") else "dialogue segment without a clip"] += 1
        continue
      if segment.clip in seen:
        tally["clip already linked"] += 1
        continue
      seen.add(segment.clip)
      text = clean_text(segment.text)
      if not any(c.isalpha() for c in text):
        tally["stage directions only"] += 1
        continue
      audio = None
      if with_audio:
        try:
          audio = _to_16k(amazon_queen.decode_clip(resource(segment.clip)),
                          amazon_queen.SAMPLE_RATE)
        except Exception:  # pylint: disable=broad-except  # counted, never a crash
          tally["undecodable clip"] += 1
          continue
      tally["linked"] += 1
      yield RecordedLine(f"queen_{segment.clip[:-3]}", f"queen_{segment.speaker.lower()}",
                         text, {}, audio)
    tally["clips no dialogue or cutaway names"] = sum(
        1 for n in index if n.endswith(".SB") and n not in seen)


def uqm_lines(archives: ur_quan.Archives, tally: Tally, with_audio: bool = True,
              max_seconds: float = UQM_MAX_SECONDS) -> Iterator[RecordedLine]:
  """The Ur-Quan Masters' spoken pages, as the engine plays them, joined in clip order into
  utterances of at most `max_seconds` (a page longer than that is one utterance alone): the
  transcript is their lines, the audio the span they play. Left out, and counted: what
  ur_quan.pages leaves, missing or undecodable clips, pages the clip ends before, utterances
  that write numbers in digits or hold a placeholder (the words said are not the text's) and
  utterances of stage directions only (counted in pages; "linked" counts utterances). Without
  audio, the utterances are each clip's pages."""
  rmp = archives.read(ur_quan.RESOURCE_MAP).decode("latin-1")
  for conversation in ur_quan.conversations(rmp):
    if conversation.text not in archives or conversation.stamps not in archives:
      tally["race without text or stamps"] += 1
      continue
    found = ur_quan.pages(conversation, archives.read(conversation.text).decode("latin-1"),
                          archives.read(conversation.stamps).decode("latin-1"), tally)
    by_clip: dict[str, list] = {}
    for page in found:
      by_clip.setdefault(page.clip, []).append(page)
    for clip, clip_pages in by_clip.items():
      if clip not in archives:
        tally["clip the pack lacks"] += len(clip_pages)
        continue
      samples, length = None, None
      if with_audio:
        try:
          samples = ur_quan.decode_clip(archives.read(clip))
        except Exception:  # pylint: disable=broad-except  # counted, never a crash
          tally["undecodable clip"] += len(clip_pages)
          continue
        length = len(samples) / ur_quan.SAMPLE_RATE
      next_page = 0
      for group in _uqm_utterances(clip_pages, length, max_seconds, tally):
        number, next_page = next_page, next_page + len(group)   # the clip's page it starts at
        written = " ".join(page.text for page in group)
        text = clean_text(written)
        if re.search(r"[\d%$<>]", written):
          tally["pages with digits or a placeholder"] += len(group)
          continue
        if not any(c.isalpha() for c in text):
          tally["stage directions only"] += len(group)
          continue
        audio = None
        if with_audio:
          start, end = group[0].start, group[-1].end or length
          audio = _to_16k(samples[int(start * ur_quan.SAMPLE_RATE):
                                  int(end * ur_quan.SAMPLE_RATE)], ur_quan.SAMPLE_RATE)
        tally["linked pages"] += len(group)
        tally["linked"] += 1
        name = clip.rsplit("/", 1)[-1][:-len(".ogg")]
        yield RecordedLine(f"uqm_{name}_{number}",
                           f"uqm_{conversation.race}", text, {}, audio)


def _uqm_utterances(clip_pages, length, max_seconds: float, tally: Tally) -> list[list]:
  """A clip's pages in runs of at most `max_seconds` (`length`: the clip's, None = each page
  alone); pages that start or end past the clip's end are counted and left out. A clip's
  pages are one block's (ur_quan.pages) and play in turn, so those kept are its first pages,
  and the runs cover them in order."""
  if length is None:
    return [[page] for page in clip_pages]
  kept = [page for page in clip_pages if page.start < length and (page.end or 0) <= length]
  tally["page past the clip's end"] += len(clip_pages) - len(kept)
  groups = []
  for page in kept:
    end = page.end or length
    if groups and end - groups[-1][0].start <= max_seconds:
      groups[-1].append(page)
    else:
      groups.append([page])
  return groups


# The games' fonts put German and Spanish letters on ASCII and high codes (sky's text).
SKY_CHARACTERS = {
    "de": {"#": "ü", "*": "ä", ")": "ö", "(": "ß", "}": "Ü", "~": "Ä", "\x7f": "Ö"},
    "es": {"+": "é", "<": "á", "\\": "ú", "\x87": "í", "\x88": "ó", "\x8a": "¿", "\x8b": "¡",
           "\x8c": "Ñ", "\x8d": "ñ", "#": "ü", "}": "Ü", "\x85": "à"},
    "en": {},
}


def sky_text(raw: bytes, language: str) -> str:
  """A decoded line of Beneath a Steel Sky in `language` as Unicode (SKY_CHARACTERS)."""
  table = SKY_CHARACTERS[language]
  return "".join(table.get(c, c) for c in raw.decode("latin-1"))


def sky_lines(folder: str, tally: Tally, languages=("es", "de")) -> list[RecordedLine]:
  """Beneath a Steel Sky's spoken lines (those with a speech file) with their English text and
  its `languages` translations; audio is not loaded (`load_sky_audio`). Left out, and counted:
  lines whose text cannot be decoded or is empty in any language."""
  disk = steel_sky.Disk(folder)
  sections = {language: [disk.read(steel_sky.TEXT_FILE_BASE + steel_sky.SECTIONS_PER_LANGUAGE
                                   * steel_sky.LANGUAGES[language] + s)
                         for s in range(steel_sky.SECTIONS_PER_LANGUAGE)]
              for language in ("en",) + tuple(languages)}
  found, speech_files = [], set()
  for section in range(steel_sky.SECTIONS_PER_LANGUAGE):
    for line in range(steel_sky.line_count(sections["en"][section])):
      number = section << 12 | line
      if steel_sky.speech_file(number) not in disk:
        continue
      speech_files.add(steel_sky.speech_file(number))
      try:
        texts = {language: clean_text(sky_text(steel_sky.decode_line(files[section], line),
                                               language))
                 for language, files in sections.items()}
      except steel_sky.SteelSkyError:
        tally["undecodable text"] += 1
        continue
      if not all(any(c.isalpha() for c in t) for t in texts.values()):
        tally["no text in a language"] += 1
        continue
      tally["linked"] += 1
      found.append(RecordedLine(f"sky_{number:05d}", f"sky_s{section}", texts.pop("en"),
                                texts))
  tally["speech file of no text line"] = sum(
      1 for n in disk.entries
      if steel_sky.SPEECH_FILE_BASE <= n < steel_sky.TEXT_FILE_BASE and n not in speech_files)
  return found


def load_sky_audio(disk: steel_sky.Disk, line: RecordedLine) -> RecordedLine:
  """`line` with its recorded audio (16 kHz), read from the game's `disk`."""
  number = int(line.id.split("_")[1])
  samples = steel_sky.speech_samples(disk.read(steel_sky.speech_file(number)))
  return dataclasses.replace(line, audio=_to_16k(samples, steel_sky.SAMPLE_RATE))
