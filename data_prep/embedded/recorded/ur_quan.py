"""The Ur-Quan Masters (Toys for Bob's Star Control II, 3DO voice pack; Debian's non-free
`uqm-voice` and `uqm-content`, CC BY-NC-SA 2.5): its recorded alien dialogue, a cast of some
twenty actors.

Both packages are zip archives (`.uqm`). The voice pack's resource map (`3dovoice.rmp`) names,
per race, its conversation: `comm.{race}.dialogue = CONVERSATION:{text}:{clip dir}:{stamps}`,
paths from the content root (`addons/3dovoice/...` are in the voice pack, whose archive root
is `3dovoice/`; `base/...` in the content package). A conversation's text is blocks

    #(TAG)<tab>{race}-NNN.ogg        (the clip; no clip: the player's line, never spoken)
    line
    line ...

and its stamps file has a line `#(TAG) ms,ms,...` per block. The engine (UQM's trackplayer.c)
cuts the text into pages at line ends (empty lines are no page), and plays the clip's page k
from the sum of the first k stamps for stamp k milliseconds (zeros are no stamp); with one
stamp fewer than pages the last page plays to the clip's end, with fewer still the stamps are
not the text's, and with more the clip goes on with text spliced from other blocks. The clips
are Ogg Vorbis, 11,025 Hz mono. These are facts about the files; the code is our own.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import re
import zipfile

import numpy as np

PACKAGE = "uqm-voice"
TEXT_PACKAGE = "uqm-content"
GAME_DIR = "usr/share/games/uqm/content"
VOICE_ARCHIVE = "addons/uqm-0.8.0-voice.uqm"
CONTENT_ARCHIVE = "packages/uqm-0.8.0-content.uqm"
RESOURCE_MAP = "addons/3dovoice/3dovoice.rmp"
SAMPLE_RATE = 11025

_DIALOGUE = re.compile(r"^comm\.([\w.]+)\.dialogue\s*=\s*CONVERSATION:([^:\s]+):([^:\s]+):"
                       r"([^:\s]+)\s*$", re.M)
_BLOCK_HEAD = re.compile(r"^#\((\w+)\)[ \t]*(\S*)[ \t]*$")


class UrQuanError(ValueError):
  """The game's files are not what this reader knows (another version, a damaged file)."""


@dataclasses.dataclass(frozen=True)
class Conversation:
  """One race's conversation: where its text, clips and stamps are (content paths)."""
  race: str          # its clips' folder: arilou, ..., yehatrebels
  text: str
  clip_dir: str
  stamps: str


@dataclasses.dataclass(frozen=True)
class Page:
  """One subtitle page of a clip: its text and where the engine plays it (seconds; end None:
  to the clip's end)."""
  clip: str
  text: str
  start: float
  end: float | None


class Archives:
  """The two packages' archives, read by content path (addons/... or base/...)."""

  def __init__(self, voice_path: str, content_path: str):
    self.voice = zipfile.ZipFile(voice_path)
    self.content = zipfile.ZipFile(content_path)

  def _member(self, path: str) -> tuple[zipfile.ZipFile, str]:
    if path.startswith("addons/"):
      return self.voice, path[len("addons/"):]
    return self.content, path

  def __contains__(self, path: str) -> bool:
    archive, name = self._member(path)
    try:
      archive.getinfo(name)
    except KeyError:
      return False
    return True

  def read(self, path: str) -> bytes:
    archive, name = self._member(path)
    try:
      return archive.read(name)
    except KeyError as error:
      raise UrQuanError(f"{path}: not in {archive.filename}") from error

  def close(self):
    self.voice.close()
    self.content.close()

  def __enter__(self) -> "Archives":
    return self

  def __exit__(self, *exc_info):
    self.close()


def conversations(resource_map: str) -> list[Conversation]:
  """The conversations a voice pack's resource map names, in its order."""
  found = [Conversation(clips.rstrip("/").rsplit("/", 1)[-1], text, clips.rstrip("/") + "/",
                        stamps)
           for _, text, clips, stamps in _DIALOGUE.findall(resource_map)]
  if not found:
    raise UrQuanError("the resource map names no CONVERSATION (another version?)")
  return found


def text_blocks(text: str) -> list[tuple[str, str, list[str]]]:
  """(tag, clip or "", pages) of a conversation's text: each block's non-empty lines."""
  blocks = []
  for line in text.splitlines():
    head = _BLOCK_HEAD.match(line)
    if head:
      blocks.append((head.group(1), head.group(2), []))
    elif blocks and line.strip():
      blocks[-1][2].append(line.strip())
  return blocks


def stamps(text: str) -> dict[str, list[int]]:
  """{tag: page durations in ms} of a stamps file (zeros dropped, as the engine does)."""
  found = {}
  for line in text.splitlines():
    head = re.match(r"^#\((\w+)\)\s*(.*)$", line.strip())
    if head:
      found[head.group(1)] = [int(v) for v in re.split(r"[,\s]+", head.group(2))
                              if v.isdigit() and int(v)]
  return found


def pages(conversation: Conversation, text: str, stamp_text: str, tally) -> list[Page]:
  """The spoken pages of a conversation with where each plays in its clip. Counted in `tally`
  and left out: blocks without a clip (the player's), blocks whose clip other blocks name too
  (the game's out-takes: one clip holds all their lines, so no block's stamps place its text),
  blocks without stamps, blocks whose stamps are fewer than their pages less one."""
  durations = stamps(stamp_text)
  blocks = text_blocks(text)
  naming = collections.Counter(clip for _, clip, _ in blocks)
  found = []
  for tag, clip, lines in blocks:
    if not clip:
      tally["block without a clip (the player's line)"] += 1
      continue
    if naming[clip] > 1:
      tally["block whose clip other blocks name too"] += 1
      continue
    if not lines:
      tally["clip block without text"] += 1
      continue
    if tag not in durations:
      tally["clip block without stamps"] += 1
      continue
    times = durations[tag]
    if len(times) + 1 < len(lines):
      tally["clip block whose stamps are not its pages"] += 1
      continue
    start = 0.0
    for k, line in enumerate(lines):
      end = start + times[k] / 1000 if k < len(times) else None
      found.append(Page(conversation.clip_dir + clip, line, start, end))
      start = end if end is not None else start
  return found


def decode_clip(data: bytes) -> np.ndarray:
  """An Ogg Vorbis clip -> float32 samples at SAMPLE_RATE (UrQuanError if it is not that)."""
  import soundfile  # pylint: disable=import-outside-toplevel
  samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
  if rate != SAMPLE_RATE:
    raise UrQuanError(f"a clip at {rate} Hz; this reader knows {SAMPLE_RATE} Hz")
  return samples.mean(axis=1)
