"""Beneath a Steel Sky (Revolution Software, 1994; the freeware CD version 0.0372 that Debian's
`beneath-a-steel-sky` package ships): its recorded English speech and the same lines' text in
eight languages.

The game's files live in `sky.dsk`, indexed by `sky.dnr` (a little-endian uint32 count, then
8-byte entries: uint16 file number, 24-bit offset whose bit 23 says "shifted left by 4", 24-bit
flags: size in bits 0-21, "header kept" bit 22, "stored" bit 23). A file not stored whose
22-byte header's flag word has bit 7 set is ProPack-compressed (`rnc.unpack`) after the header.

- Text: file 60600 + 8 * language + section (language 0 English, 1 German, 7 Spanish). A line
  (its text number: section << 12 | line) is Huffman-coded at a bit offset kept in 2-bit units:
  a uint16 per block of 32 lines at byte 4, a skip byte per line at the uint16 at byte 0 (a byte
  with bit 7 counts (b & 0x7F) << 3), from the bit data at the uint16 at byte 2; bits are read
  from each byte's most significant first; a line ends at code 0.
- Speech: file 50000 + SPEECH_SECTION_START[section] + line, its 22-byte header's seventh
  uint16 the total size, then unsigned 8-bit PCM at 11,025 Hz. A line with such a file is one
  the game speaks; the others (object names, descriptions, menus) it only shows.

The formats follow ScummVM's `engines/sky` (disk.cpp, text.cpp, sound.cpp, hufftext.cpp): facts
about the files; the code is our own. The game's cast speaks none of the corpus's training
audio: its lines are the dev-real and tst-real splits.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from data_prep.embedded.recorded import rnc

PACKAGE = "beneath-a-steel-sky"
GAME_DIR = "usr/share/scummvm/beneath-a-steel-sky"
SAMPLE_RATE = 11025
HEADER_SIZE = 22
TEXT_FILE_BASE, SPEECH_FILE_BASE = 60600, 50000
SECTIONS_PER_LANGUAGE = 8
LANGUAGES = {"en": 0, "de": 1, "es": 7}
# Speech file numbers of each text section's first line (the game's own table).
SPEECH_SECTION_START = (0, 600, 1100, 2430, 3380, 4530, 5080, 5230)

# The text's Huffman code (game version 0.0372) as (code length, byte) of its leaves from left
# to right: the first code is all zeros, and each next one is the previous plus one, shifted
# to its length (a full binary tree is fixed by its leaves' depths in order).
TEXT_CODE = (
    (3, 32), (4, 101), (4, 97), (5, 111), (5, 115), (5, 116), (5, 110), (5, 46), (5, 105),
    (4, 114), (6, 0), (6, 69), (5, 117), (5, 109), (5, 65), (6, 108), (6, 73), (6, 100),
    (6, 82), (6, 78), (6, 83), (5, 84), (7, 79), (7, 104), (6, 99), (6, 68), (6, 103),
    (7, 76), (7, 67), (7, 112), (7, 85), (7, 33), (7, 121), (6, 77), (8, 80), (8, 118),
    (7, 72), (7, 63), (7, 98), (8, 39), (8, 102), (7, 44), (7, 71), (7, 66), (9, 86),
    (9, 107), (8, 70), (8, 113), (8, 119), (9, 75), (9, 45), (8, 87), (8, 74), (8, 42),
    (9, 122), (9, 89), (9, 106), (9, 43), (10, 81), (10, 133), (9, 41), (10, 90), (10, 139),
    (9, 60), (11, 149), (11, 126), (10, 138), (10, 135), (10, 58), (11, 127), (11, 93),
    (10, 35), (11, 120), (11, 88), (10, 145), (12, 136), (12, 96), (11, 50), (12, 48),
    (12, 131), (11, 49), (12, 47), (12, 40), (11, 61), (11, 134), (11, 94), (12, 51),
    (12, 57), (12, 152), (12, 52), (13, 125), (13, 56), (12, 92), (12, 34), (12, 144),
    (13, 38), (13, 141), (13, 53), (13, 54), (13, 146), (13, 143), (13, 142), (13, 147),
    (14, 140), (14, 55), (13, 128), (14, 129), (14, 153), (14, 36), (14, 64), (15, 91),
    (15, 154), (14, 95), (14, 62), (14, 150), (15, 130), (15, 37), (14, 9), (15, 156),
    (15, 151), (15, 123), (16, 148), (16, 33),
)


class SteelSkyError(ValueError):
  """The game's files are not what this reader knows (another version, a damaged file)."""


def prefix_code(leaves) -> dict[str, int]:
  """{bit string: byte} of a full binary tree given as (depth, byte) of its leaves in order."""
  codes, code, previous = {}, 0, None
  for depth, value in leaves:
    if previous is not None:
      code = (code + 1) << (depth - previous) if depth >= previous else \
          (code + 1) >> (previous - depth)
    codes[format(code, f"0{depth}b")] = value
    previous = depth
  return codes


_TEXT_CODES = prefix_code(TEXT_CODE)


class Disk:
  """sky.dsk's files by number, through sky.dnr's index."""

  def __init__(self, folder: str):
    with open(os.path.join(folder, "sky.dnr"), "rb") as f:
      index = f.read()
    (count,) = struct.unpack_from("<I", index, 0)
    if len(index) < 4 + 8 * count:
      raise SteelSkyError(f"{folder}/sky.dnr: {count} entries announced, "
                          f"{(len(index) - 4) // 8} present")
    self.entries = {}
    for n in range(count):
      entry = index[4 + 8 * n:12 + 8 * n]
      number = struct.unpack_from("<H", entry, 0)[0]
      offset = int.from_bytes(entry[2:5], "little")
      flags = int.from_bytes(entry[5:8], "little")
      self.entries[number] = (offset, flags)
    self.path = os.path.join(folder, "sky.dsk")

  def __contains__(self, number: int) -> bool:
    return number in self.entries

  def read(self, number: int) -> bytes:
    """File `number`, unpacked: with its 22-byte header unless the index says otherwise."""
    offset, flags = self.entries[number]
    if offset >> 23 & 1:
      offset = (offset & 0x7FFFFF) << 4
    size = flags & 0x3FFFFF
    with open(self.path, "rb") as f:
      f.seek(offset)
      data = f.read(size)
    if len(data) != size:
      raise SteelSkyError(f"sky.dsk file {number}: {len(data)} of {size} bytes")
    stored = flags >> 23 & 1
    if stored or not struct.unpack_from("<H", data, 0)[0] >> 7 & 1:
      return data
    body = rnc.unpack(data[HEADER_SIZE:])
    return body if flags >> 22 & 1 else data[:HEADER_SIZE] + body


def decode_line(section: bytes, line: int) -> bytes:
  """Line `line` (0-4095) of a text section file, as the game's bytes (without the final 0)."""
  block, index = line & 0xFE0, line & 0x1F
  skip_table, bit_data = struct.unpack_from("<HH", section, 0)
  offset = sum(struct.unpack_from(f"<{block >> 5}H", section, 4)) if block else 0
  for skip in section[skip_table + block:skip_table + block + index]:
    offset += (skip & 0x7F) << 3 if skip & 0x80 else skip
  position = bit_data + (offset >> 2)
  bit = 7 - 2 * (offset & 3)
  out, code = bytearray(), ""
  while position < len(section):
    code += "1" if section[position] >> bit & 1 else "0"
    bit -= 1
    if bit < 0:
      position, bit = position + 1, 7
    if code in _TEXT_CODES:
      value = _TEXT_CODES[code]
      if value == 0:
        return bytes(out)
      out.append(value)
      code = ""
    elif len(code) > 16:
      break
  raise SteelSkyError(f"text line {line}: no end of line before the section's end")


def line_count(section: bytes) -> int:
  """How many lines a text section file indexes (a skip byte each)."""
  skip_table, bit_data = struct.unpack_from("<HH", section, 0)
  return bit_data - skip_table


def speech_file(text_number: int) -> int:
  """The file number of a line's recorded speech (section << 12 | line)."""
  return SPEECH_FILE_BASE + SPEECH_SECTION_START[text_number >> 12] + (text_number & 0xFFF)


def speech_samples(data: bytes) -> np.ndarray:
  """A speech file (header + unsigned 8-bit PCM) -> float32 samples in [-1, 1) at 11,025 Hz."""
  total = struct.unpack_from("<11H", data, 0)[6]
  pcm = np.frombuffer(data[HEADER_SIZE:total], np.uint8)
  return (pcm.astype(np.float32) - 128.0) / 128.0
