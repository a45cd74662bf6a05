"""Flight of the Amazon Queen (Interactive Binary Illusions, 1995; the freeware CD version that
Debian's `flight-of-the-amazon-queen` package ships): its recorded English dialogue.

Everything is in `queen.1c`: a big-endian uint16 entry count at byte 13, then 21-byte entries
from byte 15 (name[12] NUL-padded, bundle byte, offset uint32, size uint32, big-endian). Speech
clips (`.SB`) are bare MP3 streams (11,025 Hz mono). Dialogues (`.DOG`) hold the text, after a
20-byte file header, as big-endian int16s:

    levels (negative: the player cannot leave), unique key, talk key, Joe's line count,
    the other person's line count, 2 x (game state, test value, item), the person's table
    offset, the cutaway's, the person's second table's; the dialogue tree from byte 32
    (levels x 6 nodes x 16 bytes); Joe's table at 32 + 96 * levels.

A table's line: 2 bytes, its id (int16), a length byte and the text, the next line at the
following multiple of 4. Joe's first line (its id a flag: 0 = he opens the dialogue with it)
is the opening line, and counts among his lines. The person's second table: their line and Joe's when
they meet again (aligned to 2).

A line is spoken as segments cut at its `*` commands (`*` + two characters; `*XY` takes 11
more): segment n (from 0) of a line plays the clip `{talk key:2}{id:4x}{J|P}{n + 1:x}` with
spaces written as 0 (`{talk key:2}SSSSJ` / `XXXXJ` / `XXXXP` for the opening and meeting-again
lines) and `.SB` appended.

Cutaway scenes (`.CUT`, a 20-byte file header, then big-endian: panel, object count (negative:
cannot be skipped), flags, the game-state offset, the sentences' offset, the banks' offset)
give each of their objects in turn the next sentence (a length-prefixed string aligned to 2);
object k (from 1) speaks its sentence's segments as `{scene name padded to 5 with _}{k:02d}`
+ the segment's number. Which objects speak is in the game's logic, not in the scene: a
sentence is spoken where its clip exists. These rules follow ScummVM's `engines/queen` (talk.cpp, sound.cpp,
resource.cpp): facts about the files; the code is our own.
"""

from __future__ import annotations

import dataclasses
import io
import re
import struct

import numpy as np

PACKAGE = "flight-of-the-amazon-queen"
GAME_DIR = "usr/share/scummvm/flight-of-the-amazon-queen"
DATA_FILE = "queen.1c"
SAMPLE_RATE = 11025
DOG_HEADER_SIZE = 20
JOE = "JOE"


class AmazonQueenError(ValueError):
  """The game's files are not what this reader knows (another version, a damaged file)."""


def read_index(path: str) -> dict[str, tuple[int, int]]:
  """{resource name: (offset, size)} of queen.1c's index."""
  with open(path, "rb") as f:
    head = f.read(15)
    if len(head) < 15:
      raise AmazonQueenError(f"{path}: {len(head)} bytes, too short for an index")
    (count,) = struct.unpack_from(">H", head, 13)
    table = f.read(21 * count)
  if len(table) != 21 * count:
    raise AmazonQueenError(f"{path}: {count} index entries announced, {len(table) // 21} "
                           f"present")
  entries = {}
  for n in range(count):
    name = table[21 * n:21 * n + 12].split(b"\0")[0].decode("latin-1").upper()
    offset, size = struct.unpack_from(">II", table, 21 * n + 13)
    entries[name] = (offset, size)
  return entries


@dataclasses.dataclass(frozen=True)
class Segment:
  """One clip's worth of a dialogue line: the clip's name, its text, who says it."""
  clip: str
  text: str
  speaker: str       # JOE, or the dialogue's other person as "talk{key}"
  command: str       # the `*` command that ends it ("" at the line's end)


def _string(data: bytes, offset: int, align: int) -> tuple[str, int]:
  """(text, offset after it) of a length-prefixed string aligned to `align` bytes."""
  length = data[offset]
  offset += 1
  if not length:
    return "", offset
  text = data[offset:offset + length].decode("latin-1")
  return text, (offset + length + align - 1) & ~(align - 1)


def _table(data: bytes, offset: int, count: int) -> list[tuple[int, str]]:
  """(id, text) of a dialogue table's `count` lines."""
  lines = []
  for _ in range(count):
    (line_id,) = struct.unpack_from(">h", data, offset + 2)
    text, offset = _string(data, offset + 4, 4)
    lines.append((line_id, text))
  return lines


_COMMAND = re.compile(r"\*(XY.{11}|..)", re.S)


def segments(text: str, clip_prefix: str, speaker: str) -> list[Segment]:
  """A line cut at its `*` commands into its clips' segments (see the module)."""
  pieces, start = [], 0
  for match in _COMMAND.finditer(text):
    pieces.append((text[start:match.start()], match.group(1)[:2]))
    start = match.end()
  if start != len(text):
    pieces.append((text[start:], ""))
  return [Segment(f"{clip_prefix}{n + 1:x}".replace(" ", "0").upper() + ".SB", piece, speaker,
                  command) for n, (piece, command) in enumerate(pieces)]


def dialogue_segments(dog: bytes) -> list[Segment]:
  """Every segment of one .DOG file (its 20-byte header included) that the game can speak."""
  data = dog[DOG_HEADER_SIZE:]
  levels, _, talk_key, joe_count, person_count = struct.unpack_from(">5h", data, 0)
  levels = abs(levels)
  person_offset, _, person2_offset = struct.unpack_from(">3H", data, 22)
  joe_offset = 32 + 96 * levels
  person = f"talk{talk_key}"
  found = []
  (no_opening,) = struct.unpack_from(">H", data, joe_offset + 2)
  if not no_opening:
    opening, _ = _string(data, joe_offset + 4, 2)
    found += segments(opening, f"{talk_key:2d}SSSSJ", JOE)
  again, offset = _string(data, person2_offset, 2)
  found += segments(again, f"{talk_key:2d}XXXXP", person)
  joe_again, _ = _string(data, offset, 2)
  found += segments(joe_again, f"{talk_key:2d}XXXXJ", JOE)
  for line_id, text in _table(data, person_offset, person_count):
    found += segments(text, f"{talk_key:2d}{line_id:4x}P", person)
  for line_id, text in _table(data, joe_offset, joe_count)[1:]:   # [0]: the opening line
    found += segments(text, f"{talk_key:2d}{line_id:4x}J", JOE)
  return found


def cutaway_segments(name: str, cut: bytes) -> list[Segment]:
  """Every sentence segment of the cutaway scene `name` (e.g. C30E.CUT, its header included)."""
  data = cut[DOG_HEADER_SIZE:]
  (objects,) = struct.unpack_from(">h", data, 2)
  (offset,) = struct.unpack_from(">H", data, 8)
  scene = name.rsplit(".", 1)[0].upper()
  found = []
  for k in range(1, abs(objects) + 1):
    sentence, offset = _string(data, offset, 2)
    if sentence and sentence != "*" and not sentence.startswith("#"):   # "#": the credits
      found += segments(sentence, f"{scene.ljust(5, '_')}{k:02d}", f"cut_{scene.lower()}")
  return found


def decode_clip(data: bytes) -> np.ndarray:
  """A .SB clip (an MP3 stream) -> float32 samples at 11,025 Hz."""
  import soundfile  # pylint: disable=import-outside-toplevel
  samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
  if rate != SAMPLE_RATE:
    raise AmazonQueenError(f"a speech clip at {rate} Hz; the game's are {SAMPLE_RATE} Hz")
  return samples if samples.ndim == 1 else samples.mean(axis=1)
