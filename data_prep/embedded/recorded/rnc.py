"""Rob Northen's ProPack ("RNC"), method 1: the compression of Beneath a Steel Sky's files.

A packed block is an 18-byte header ("RNC\\x01", unpacked and packed lengths as big-endian
uint32, the CRC-16 of each, a leeway byte, the number of chunks), then a bit stream read least
significant bit first in little-endian 16-bit words, with runs of literal bytes interleaved:

    2 bits (ignored), then per chunk:
      three Huffman tables (literal run lengths, match offsets, match lengths): a 5-bit count
      of codes, a 4-bit length per code; codes are canonical, shortest first, in index order
      a 16-bit count of runs; each run: a literal length, that many bytes copied verbatim from
      the byte stream, then (not after the chunk's last run) a match: offset + 1, length + 2
    a table value v >= 2 is (1 << (v - 1)) | the next v - 1 bits, else v itself.

Literal bytes start at the next 16-bit word the bit reader has not loaded; the bits it holds
stay in front of the words that follow the bytes. This module follows the format as ScummVM's
`engines/sky/rnc_deco.cpp` documents it; the code is our own.
"""

from __future__ import annotations

import struct

import numpy as np

SIGNATURE = b"RNC\x01"
HEADER_SIZE = 18


class RncError(ValueError):
  """A block that is not method-1 ProPack or fails its CRC."""


def _crc_table() -> np.ndarray:
  table = np.zeros(256, np.uint32)
  for byte in range(256):
    value = byte
    for _ in range(8):
      value = (value >> 1) ^ 0xA001 if value & 1 else value >> 1
    table[byte] = value
  return table


_CRC_TABLE = [int(v) for v in _crc_table()]


def crc16(data: bytes) -> int:
  """CRC-16/ARC (reflected polynomial 0xA001, initial value 0), ProPack's check."""
  crc = 0
  table = _CRC_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc


class _BitReader:
  """Least-significant-bit-first bits from little-endian 16-bit words, loaded lazily, with
  literal byte runs taken from the next unloaded word (see the module)."""

  def __init__(self, data: bytes, position: int):
    self.data, self.position = data, position
    self.bits, self.count = 0, 0

  def _load(self):
    word = self.data[self.position:self.position + 2].ljust(2, b"\0")
    self.bits |= (word[0] | word[1] << 8) << self.count
    self.count += 16
    self.position += 2

  def peek(self, n: int) -> int:
    """The next n bits without consuming them (nor committing a word load)."""
    bits, count, position = self.bits, self.count, self.position
    while count < n:
      word = self.data[position:position + 2].ljust(2, b"\0")
      bits |= (word[0] | word[1] << 8) << count
      count += 16
      position += 2
    return bits & ((1 << n) - 1)

  def read(self, n: int) -> int:
    while self.count < n:
      self._load()
    value = self.bits & ((1 << n) - 1)
    self.bits >>= n
    self.count -= n
    return value

  def literal(self, n: int) -> bytes:
    run = self.data[self.position:self.position + n]
    self.position += n
    return run


class _HuffmanTable:
  """One of a chunk's three tables: a lookup over the next 16 bits -> (code length, value)."""

  def __init__(self, reader: _BitReader, previous: "_HuffmanTable | None"):
    count = reader.read(5)
    if not count:             # an empty table keeps the previous chunk's (as ProPack does)
      if previous is None:
        raise RncError("ProPack stream: an empty Huffman table in the first chunk")
      self.lengths, self.values = previous.lengths, previous.values
      return
    code_lengths = [reader.read(4) for _ in range(count)]
    lengths = np.zeros(1 << 16, np.int8)
    values = np.zeros(1 << 16, np.int16)
    code = 0
    for length in range(1, 17):
      for index, code_length in enumerate(code_lengths):
        if code_length != length:
          continue
        prefix = code >> (16 - length)
        reversed_prefix = int(f"{prefix:0{length}b}"[::-1], 2)
        # every 16-bit lookahead whose low `length` bits are the reversed code
        slots = reversed_prefix + (np.arange(1 << (16 - length)) << length)
        unclaimed = slots[lengths[slots] == 0]
        lengths[unclaimed], values[unclaimed] = length, index
        code += 1 << (16 - length)
    self.lengths, self.values = lengths, values

  def decode(self, reader: _BitReader) -> int:
    lookahead = reader.peek(16)
    length = int(self.lengths[lookahead])
    if not length:
      raise RncError("ProPack stream: bits that no Huffman code matches")
    reader.read(length)
    value = int(self.values[lookahead])
    if value >= 2:
      value = (1 << (value - 1)) | reader.read(value - 1)
    return value


def unpack(block: bytes) -> bytes:
  """The bytes a method-1 ProPack block packs. RncError for another signature, a CRC
  mismatch or a stream that ends early."""
  if block[:4] != SIGNATURE:
    raise RncError(f"not a method-1 ProPack block (signature {block[:4]!r}, expected "
                   f"{SIGNATURE!r})")
  unpacked_size, packed_size, unpacked_crc, packed_crc = struct.unpack_from(">IIHH", block, 4)
  chunks = block[17]
  packed = block[HEADER_SIZE:HEADER_SIZE + packed_size]
  if len(packed) != packed_size or crc16(packed) != packed_crc:
    raise RncError(f"ProPack block: packed data fails its CRC ({len(packed)} of {packed_size} "
                   f"bytes)")
  reader = _BitReader(block, HEADER_SIZE)
  reader.read(2)
  out = bytearray()
  tables = (None, None, None)
  for _ in range(chunks):
    tables = tuple(_HuffmanTable(reader, previous) for previous in tables)
    literals, offsets, lengths = tables
    runs = reader.read(16)
    for run in range(runs, 0, -1):
      length = literals.decode(reader)
      if length:
        out += reader.literal(length)
        # the words after the literal bytes follow the bits already held
      if run > 1:
        offset = offsets.decode(reader) + 1
        length = lengths.decode(reader) + 2
        if offset > len(out):
          raise RncError(f"ProPack stream: a match {offset} bytes back after {len(out)} bytes")
        start = len(out) - offset
        if offset >= length:
          out += out[start:start + length]
        else:                 # overlapping: repeats the last `offset` bytes
          pattern = bytes(out[start:])
          out += (pattern * (length // offset + 1))[:length]
  if len(out) != unpacked_size or crc16(bytes(out)) != unpacked_crc:
    raise RncError(f"ProPack block: unpacked data fails its CRC ({len(out)} of {unpacked_size} "
                   f"bytes)")
  return bytes(out)
