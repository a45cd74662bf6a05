"""The recorded-speech readers (data_prep/embedded/recorded) on tiny game files the tests build:
ProPack (RNC method 1) blocks made by an encoder written here from the format's description,
a Beneath a Steel Sky disk with Huffman-coded text in three languages and a packed speech file,
an Amazon Queen resource file with a dialogue and MP3 clips; then the splits the corpus builds
from them and the warning where a game cannot be had."""

import io
import os
import struct

import numpy as np
import pytest

from data_prep.embedded import build, plan, recorded
from data_prep.embedded.recorded import amazon_queen, rnc, steel_sky
from data_prep.embedded.spec import CorpusSpec


# ---------------------------------------------------------------- ProPack (RNC method 1)

class _BitWriter:
  """Bits least significant first into little-endian 16-bit words; a literal run goes after
  every word holding a written bit, and the bits after it fill the partly written word first
  (the reader's view: it loads a word only when it needs its bits)."""

  def __init__(self):
    self.out = bytearray()
    self.word_at, self.used = None, 16      # the word being filled and its written bits

  def bits(self, value: int, n: int):
    for k in range(n):
      if self.used == 16:
        self.word_at, self.used = len(self.out), 0
        self.out += b"\0\0"
      if value >> k & 1:
        word = struct.unpack_from("<H", self.out, self.word_at)[0] | 1 << self.used
        struct.pack_into("<H", self.out, self.word_at, word)
      self.used += 1

  def literal(self, data: bytes):
    self.out += data


def _canonical_codes(lengths):
  """{index: (code, length)}: shortest first, in index order (ProPack's assignment)."""
  codes, code = {}, 0
  for length in range(1, 17):
    for index, l in enumerate(lengths):
      if l == length:
        codes[index] = (code >> (16 - length), length)
        code += 1 << (16 - length)
  return codes


def _write_table(writer, lengths):
  writer.bits(len(lengths), 5)
  for l in lengths:
    writer.bits(l, 4)
  return _canonical_codes(lengths)


def _write_value(writer, codes, value):
  index = value if value < 2 else value.bit_length()
  code, length = codes[index]
  for k in range(length - 1, -1, -1):      # the code's first bit first
    writer.bits(code >> k & 1, 1)
  if index >= 2:
    writer.bits(value - (1 << (index - 1)), index - 1)


def rnc_pack(chunks) -> bytes:
  """A ProPack block of `chunks`, each a list of (literal bytes, (offset, length) or None) runs
  (the last run of a chunk without a match), with every table's codes 4 bits long."""
  writer = _BitWriter()
  writer.bits(0, 2)
  out = bytearray()
  for runs in chunks:
    tables = [_write_table(writer, [4] * 16) for _ in range(3)]
    writer.bits(len(runs), 16)
    for n, (literal, match) in enumerate(runs):
      _write_value(writer, tables[0], len(literal))
      if literal:
        writer.literal(literal)
        out += literal
      if n < len(runs) - 1:
        offset, length = match
        _write_value(writer, tables[1], offset - 1)
        _write_value(writer, tables[2], length - 2)
        for _ in range(length):
          out.append(out[-offset])
  packed = bytes(writer.out)
  header = b"RNC\x01" + struct.pack(">IIHH", len(out), len(packed), rnc.crc16(bytes(out)),
                                    rnc.crc16(packed)) + bytes([0, len(chunks)])
  return header + packed, bytes(out)


def test_crc16_is_crc16_arc():
  assert rnc.crc16(b"123456789") == 0xBB3D        # the catalogued check value of CRC-16/ARC


def test_rnc_unpacks_literals_matches_and_overlapping_copies():
  block, expected = rnc_pack([
      [(b"Steel sky ", (10, 10)), (b"", (1, 5)), (b"abc", (3, 7)), (b"end", None)],
      [(b"!" * 300, (150, 40)), (bytes(range(256)), None)]])
  assert expected.startswith(b"Steel sky Steel sky      abcabcabca")
  assert rnc.unpack(block) == expected


def test_rnc_refuses_other_signatures_and_bad_crcs():
  block, _ = rnc_pack([[(b"hello", None)]])
  with pytest.raises(rnc.RncError, match="signature"):
    rnc.unpack(b"RNC\x02" + block[4:])
  damaged = bytearray(block)
  damaged[-1] ^= 0xFF
  with pytest.raises(rnc.RncError, match="CRC"):
    rnc.unpack(bytes(damaged))


# ---------------------------------------------------------------- Beneath a Steel Sky

def _text_section(lines: list[bytes]) -> bytes:
  """A text section file: each line Huffman-coded (steel_sky.TEXT_CODE) + code 0, padded to
  2-bit units (to a multiple of 8 units when it needs more than 127)."""
  codes = {value: code for code, value in steel_sky.prefix_code(steel_sky.TEXT_CODE).items()}
  encoded = []
  for line in lines:
    bits = "".join(codes[c] for c in line) + codes[0]
    units = -(-len(bits) // 2)
    if units > 127:
      units = -(-units // 8) * 8
    encoded.append(bits.ljust(2 * units, "0"))
  blocks = -(-len(lines) // 32)
  skip_table = 4 + 2 * blocks
  skips = bytearray()
  block_units = [0] * blocks
  for n, bits in enumerate(encoded):
    units = len(bits) // 2
    skips.append(units if units <= 127 else 0x80 | units >> 3)
    block_units[n // 32] += units
  bit_data = skip_table + 32 * blocks
  skips = skips.ljust(32 * blocks, b"\0")
  stream = "".join(encoded)
  stream = stream.ljust(-(-len(stream) // 8) * 8 + 16, "0")
  data = bytes(int(stream[k:k + 8], 2) for k in range(0, len(stream), 8))
  return (struct.pack("<HH", skip_table, bit_data) + struct.pack(f"<{blocks}H", *block_units)
          + bytes(skips) + data)


def _speech_file(pcm: bytes) -> bytes:
  """A packed speech file as the disk holds it: the 22-byte header (flag with bit 7, the
  total size in its seventh word) then the ProPack block of the PCM."""
  block, _ = rnc_pack([[(pcm[:100], (100, 50)), (pcm[150:], None)]])
  unpacked = pcm[:100] + pcm[:50] + pcm[150:]
  header = struct.pack("<11H", 0x81, 0, 0, 0, 0, 0, steel_sky.HEADER_SIZE + len(unpacked), 0,
                       0, 0, 0)
  return header + block, unpacked


def make_sky_folder(folder: str, texts: dict, spoken: list[int], pcm: bytes) -> bytes:
  """sky.dnr + sky.dsk with text sections 0-7 of each language in `texts` ({language:
  [section 0 lines]}, the other sections one line) and a speech file for the `spoken` lines of
  section 0. Returns the PCM the speech files unpack to."""
  files = {}
  for language, lines in texts.items():
    for section in range(8):
      files[steel_sky.TEXT_FILE_BASE + 8 * steel_sky.LANGUAGES[language] + section] = (
          _text_section(lines if section == 0 else [b"Dummy"]), True)
  unpacked = None
  for line in spoken:
    files[steel_sky.speech_file(line)], unpacked = _speech_file(pcm)[0], _speech_file(pcm)[1]
    files[steel_sky.speech_file(line)] = (files[steel_sky.speech_file(line)], False)
  disk, index = bytearray(), bytearray(struct.pack("<I", len(files)))
  for number, (data, stored) in sorted(files.items()):
    while len(disk) % 16:
      disk.append(0)
    offset = len(disk) >> 4 | 1 << 23              # shifted by 4 (bit 23)
    disk += data
    flags = len(data) | (stored << 23)
    index += struct.pack("<H", number) + offset.to_bytes(3, "little") + flags.to_bytes(
        3, "little")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "sky.dnr"), "wb") as f:
    f.write(index)
  with open(os.path.join(folder, "sky.dsk"), "wb") as f:
    f.write(disk)
  return unpacked


def _lines(n, fmt):
  return [fmt.format(k).encode("latin-1") for k in range(n)]


def test_sky_text_lines_decode_across_blocks_and_long_skips():
  lines = _lines(40, "Line {} is here.")
  lines[5] = b"A " + b"very long line, " * 12 + b"past 127 units."
  section = _text_section(lines)
  assert steel_sky.line_count(section) == 64            # two blocks of 32 skip bytes
  for n in (0, 5, 6, 31, 32, 39):
    assert steel_sky.decode_line(section, n) == lines[n]


def test_sky_lines_link_speech_to_three_languages(tmp_path):
  english = _lines(36, "I had to inspect item {}.")
  english[3] = b"It's titled `PUSSIES ON PARADE'!"
  german = _lines(36, "Ich mu( das Ding {} inspizieren.")
  german[3] = b"Gr)(e: GL}HBIRNE f#r K*se"
  spanish = _lines(36, "Ten\x87a que inspeccionar {}.")
  spanish[3] = b"\x8a\x8bEst<n LLENAS! \x8aPara qu+ sirve t\\ se\x8dor?"
  pcm = bytes(np.arange(2000) % 251)
  unpacked = make_sky_folder(str(tmp_path), {"en": english, "de": german, "es": spanish},
                             spoken=[3, 33, 35], pcm=pcm)
  tally = recorded.Tally()
  lines = recorded.sky_lines(str(tmp_path), tally)
  assert [line.id for line in lines] == ["sky_00003", "sky_00033", "sky_00035"]
  assert tally["linked"] == 3
  first = lines[0]
  assert first.text == "It's titled 'pussies on parade'!"
  assert first.translations == {"de": "Größe: glühbirne für Käse",
                                "es": "¿¡Están llenas! ¿Para qué sirve tú señor?"}
  assert lines[1].text == "I had to inspect item 33."
  loaded = recorded.load_sky_audio(steel_sky.Disk(str(tmp_path)), first)
  expected = (np.frombuffer(unpacked, np.uint8).astype(np.float32) - 128) / 128
  assert len(loaded.audio) == round(len(expected) * 16000 / 11025)
  # the PCM survives the resampling to 16 kHz: compare at the original rate
  import soxr
  back = soxr.resample(loaded.audio, 16000, 11025)
  assert np.corrcoef(back[200:-200], expected[200:len(back) - 200])[0, 1] > 0.9


def test_sky_disk_reads_stored_and_packed_files(tmp_path):
  pcm = bytes(np.arange(1000) % 200)
  unpacked = make_sky_folder(str(tmp_path), {"en": [b"Hello."]}, spoken=[0], pcm=pcm)
  disk = steel_sky.Disk(str(tmp_path))
  speech = disk.read(steel_sky.speech_file(0))
  assert speech[steel_sky.HEADER_SIZE:] == unpacked
  samples = steel_sky.speech_samples(speech)
  assert samples.dtype == np.float32 and len(samples) == len(unpacked)
  assert steel_sky.decode_line(disk.read(steel_sky.TEXT_FILE_BASE), 0) == b"Hello."


def test_speech_files_follow_the_section_table():
  assert steel_sky.speech_file(0x0005) == 50005
  assert steel_sky.speech_file(0x2007) == 50000 + 1100 + 7
  assert steel_sky.speech_file(0x6001) == 50000 + 5080 + 1


# ---------------------------------------------------------------- Flight of the Amazon Queen

def _string(text: bytes, offset: int, align: int) -> bytes:
  """A length-prefixed string at `offset`, padded to `align`."""
  out = bytes([len(text)]) + text
  if text:
    end = (offset + len(out) + align - 1) & ~(align - 1)
    out = out.ljust(end - offset, b"\0")
  return out


def make_dog(talk_key: int, person_lines, joe_lines, opening: bytes, again=(b"", b"")):
  """A .DOG file: header, a one-level tree, Joe's table (the opening line its first, counted
  among his lines), the person's table and second table."""
  levels = 1
  joe_offset = 32 + 96 * levels
  body = bytearray(joe_offset)
  body += struct.pack(">HH", 0, 0) + _string(opening, joe_offset + 4, 2)
  for line_id, text in joe_lines:
    body = body.ljust(-(-len(body) // 4) * 4, b"\0")
    body += struct.pack(">Hh", 0, line_id) + _string(text, len(body) + 4, 4)
  body = body.ljust(-(-len(body) // 4) * 4, b"\0")
  person_offset = len(body)
  for line_id, text in person_lines:
    body += struct.pack(">Hh", 0, line_id) + _string(text, len(body) + 4, 4)
  person2_offset = len(body)
  body += _string(again[0], len(body), 2)
  body += _string(again[1], len(body), 2)
  header = struct.pack(">5h6h3H", levels, 7, talk_key, len(joe_lines) + 1, len(person_lines),
                       0, 0, 0, 0, 0, 0, person_offset, 0, person2_offset)
  body[:len(header)] = header
  return b"\0" * amazon_queen.DOG_HEADER_SIZE + bytes(body)


def make_queen_file(path: str, resources: dict):
  """queen.1c: 13 bytes, the entry count, 21-byte entries, then the resources."""
  names = sorted(resources)
  start = 15 + 21 * len(names)
  index, data = bytearray(b"QTALK\0\0\0\0\0\0\0\0" + struct.pack(">H", len(names))), bytearray()
  for name in names:
    index += name.encode().ljust(12, b"\0") + b"\x01" + struct.pack(
        ">II", start + len(data), len(resources[name]))
    data += resources[name]
  with open(path, "wb") as f:
    f.write(index + data)


def _mp3(seconds: float, frequency: float = 300.0) -> bytes:
  import soundfile
  t = np.arange(int(11025 * seconds)) / 11025
  out = io.BytesIO()
  soundfile.write(out, (0.3 * np.sin(2 * np.pi * frequency * t)).astype(np.float32), 11025,
                  format="MP3", subtype="MPEG_LAYER_III")
  return out.getvalue()


def test_queen_segments_follow_the_engine_naming():
  found = amazon_queen.segments("Hello there.*FLNice day*XY00(237,112)Bye.", " 5  1aP", "talk5")
  assert [(s.clip, s.text, s.command) for s in found] == [
      ("05001AP1.SB", "Hello there.", "FL"), ("05001AP2.SB", "Nice day", "XY"),
      ("05001AP3.SB", "Bye.", "")]
  opening = amazon_queen.segments("*FFWhat?", " 5SSSSJ", "JOE")
  assert [(s.clip, s.text) for s in opening] == [("05SSSSJ1.SB", ""), ("05SSSSJ2.SB", "What?")]


def test_queen_lines_link_clips_and_count_the_rest(tmp_path):
  dog = make_dog(5, person_lines=[(0x1A, b"You're walking a VERY fine line.*02(sigh)"),
                                  (0x1B, b"Super Soldier Treatment^_."),
                                  (0x1C, b"No clip for me.")],
                 joe_lines=[(0x03, b"<gulp> I'm off."), (0x04, b"")],
                 opening=b"Hi there!", again=(b"Back again?", b"0"))
  resources = {"TALK05.DOG": dog, "05SSSSJ1.SB": _mp3(0.8), "05XXXXP1.SB": _mp3(0.6),
               "05001AP1.SB": _mp3(1.2), "05001AP2.SB": _mp3(0.4), "05001BP1.SB": _mp3(1.0),
               "050003J1.SB": _mp3(0.5), "99SSSSJ1.SB": _mp3(0.3)}
  make_queen_file(str(tmp_path / "queen.1c"), resources)
  tally = recorded.Tally()
  lines = list(recorded.queen_lines(str(tmp_path), tally))
  assert [(line.id, line.speaker, line.text) for line in lines] == [
      ("queen_05SSSSJ1", "queen_joe", "Hi there!"),
      ("queen_05XXXXP1", "queen_talk5", "Back again?"),
      ("queen_05001AP1", "queen_talk5", "You're walking a very fine line."),
      ("queen_05001BP1", "queen_talk5", "Super Soldier Treatment."),
      ("queen_050003J1", "queen_joe", "I'm off.")]
  assert tally == {"linked": 5, "stage directions only": 1, "dialogue segment without a clip": 1,
                   "segment without text": 1, "clips no dialogue or cutaway names": 1}
  for line in lines:
    assert line.audio.dtype == np.float32 and 0.3 * 16000 < len(line.audio) < 1.3 * 16000


def make_cut(sentences) -> bytes:
  """A .CUT file: header fields, then the objects' sentences from the sentences' offset."""
  body = bytearray(struct.pack(">HhhHHH", 0, -len(sentences), 0, 0, 12, 0))
  for sentence in sentences:
    body += _string(sentence, len(body), 2)
  return b"\0" * amazon_queen.DOG_HEADER_SIZE + bytes(body)


def test_cutaway_objects_speak_their_sentences_where_the_clip_exists(tmp_path):
  cut = make_cut([b"Hey, over here!", b"*", b"", b"Oh it's you.*FRYou again.", b"#CREDITS"])
  assert [(s.clip, s.text) for s in amazon_queen.cutaway_segments("C1A.CUT", cut)] == [
      ("C1A__011.SB", "Hey, over here!"), ("C1A__041.SB", "Oh it's you."),
      ("C1A__042.SB", "You again.")]
  make_queen_file(str(tmp_path / "queen.1c"), {"C1A.CUT": cut, "C1A__011.SB": _mp3(0.5),
                                               "C1A__042.SB": _mp3(0.5)})
  tally = recorded.Tally()
  lines = list(recorded.queen_lines(str(tmp_path), tally))
  assert [(line.id, line.speaker, line.text) for line in lines] == [
      ("queen_C1A__011", "queen_cut_c1a", "Hey, over here!"),
      ("queen_C1A__042", "queen_cut_c1a", "You again.")]
  assert tally["cutaway sentence without a clip (not spoken)"] == 1


def test_clean_text():
  assert recorded.clean_text("  <ahem> Oh,  a VERY fine line ...I  think ! ") == \
      "Oh, a very fine line...I think!"
  assert recorded.clean_text("LINC is OK, I said") == "Linc is ok, I said"   # "I" stays


# ---------------------------------------------------------------- splits and fallbacks

def _line(n, text, speaker="sky_s0"):
  return recorded.RecordedLine(f"sky_{n:05d}", speaker, text, {"es": text})


def test_real_heldout_lines_are_disjoint_unique_and_not_in_training():
  lines = [_line(n, f"Line number {n}.") for n in range(50)]
  lines += [_line(50, "Yes."), _line(51, "yes!"), _line(52, "Trained line.")]
  spec = CorpusSpec(target="es", real_test="sky", real_heldout=20)
  dev, tst = plan.real_heldout_lines(lines, spec, excluded={"trained line"})
  assert len(dev) == len(tst) == 20
  keys = [recorded.text_key(line.text) for line in dev + tst]
  assert len(set(keys)) == 40
  assert not {"yes", "trained line"} & set(keys)        # said twice / a training transcript
  assert (dev, tst) == plan.real_heldout_lines(lines, spec, excluded={"trained line"})


def test_a_game_that_cannot_be_had_is_left_out_with_a_warning(monkeypatch):
  def unavailable(game, cache_dir):
    raise recorded.GameUnavailable(f"apt-get download for {game} failed")
  monkeypatch.setattr(recorded, "game_folder", unavailable)
  build._game_problem.cache_clear()
  warnings = []
  spec = CorpusSpec(target="es", recorded_train=("queen",), spoken_dialogue=("sky",),
                    real_test="sky")
  effective = build.effective_spec(spec, log=warnings.append)
  build._game_problem.cache_clear()
  assert effective.recorded_train == effective.spoken_dialogue == ()
  assert effective.real_test == ""
  assert effective.splits() == ("train", "dev", "tst-COMMON")
  assert effective.transcription_pairs() == []
  assert len(warnings) == 3
  assert "Flight of the Amazon Queen" in warnings[0] and "no recorded speech" in warnings[0]
  assert "Beneath a Steel Sky" in warnings[1] and "do not read its dialogue" in warnings[1]
  assert "Beneath a Steel Sky" in warnings[2] and "dev-real" in warnings[2]


def test_spoken_dialogue_is_read_by_training_voices_and_never_says_a_real_split_line(
    monkeypatch):
  """The games' dialogue text for the training voices: queen's lines and sky's lines that no
  real split holds (nor says the words of one), each text once, every voice a training voice."""
  sky = [_line(n, f"Sky line {n}.") for n in range(40)] + [_line(40, "Sky line 3!")]
  queen = [recorded.RecordedLine(f"queen_{n}", "queen_joe", text, {})
           for n, text in enumerate(["Hi, I'm Joe King.", "Sky line 7.", "Hi, I'm Joe king!"])]
  monkeypatch.setattr(recorded, "game_folder", lambda game, cache_dir: game)
  monkeypatch.setattr(recorded, "sky_lines", lambda folder, tally: sky)
  monkeypatch.setattr(recorded, "queen_lines", lambda folder, tally, with_audio=True: queen)
  spec = CorpusSpec(target="es", synthesizers=("espeak", "flite"),
                    other_synthesizer_share=0.5, recorded_train=("queen",),
                    spoken_dialogue=("queen", "sky"), real_test="sky", real_heldout=6)
  _, held_out = build._sky_held_out(spec, log=lambda message: None)
  held_keys = {recorded.text_key(line.text) for split in held_out for line in split}
  assert len(held_keys) == 12 and not held_keys & {"sky line 7", "sky line 3"}
  lines = build._dialogue_lines(spec)
  keys = [recorded.text_key(text) for text, _ in lines]
  assert len(keys) == len(set(keys)) == 2 + 41 - 1 - 1 - 12     # each text once
  assert not set(keys) & held_keys
  assert dict(lines)["Hi, I'm Joe King."] == "queen-text"
  assert dict(lines)["Sky line 3."] == "sky-text"
  talks = plan.plan_spoken_text(spec, "en", lines)
  segments = [segment for talk in talks for segment in talk]
  assert [(s.source, s.domain) for s in segments] != [] and sorted(
      (s.source, s.domain) for s in segments) == sorted(lines)
  assert all(s.target == s.source for s in segments)
  training = set(plan.split_variants(spec.seed)["train"]) | set(
      build.voices.voice_names(build.voices.ENGINE_VOICES["flite"]))
  assert {s.voice.variant for s in segments} <= training
  flite = sum(s.voice.engine == "flite" for s in segments) / len(segments)
  assert 0.3 < flite < 0.7                                      # other_synthesizer_share
  assert talks == plan.plan_spoken_text(spec, "en", lines)     # deterministic
  assert spec.transcription_pairs() == ["en-en"]
  assert CorpusSpec(spoken_dialogue=("sky",)).transcription_pairs() == ["en-en"]


def test_a_build_from_before_spoken_dialogue_still_matches_its_marker():
  assert "spoken_dialogue" not in build._spec_json(CorpusSpec())
  assert '"spoken_dialogue": ["sky"]' in build._spec_json(CorpusSpec(spoken_dialogue=("sky",)))


def test_spec_refuses_a_real_test_without_its_subtitles():
  with pytest.raises(ValueError, match="real_test='sky' needs English"):
    CorpusSpec(target="fr", real_test="sky")
  with pytest.raises(ValueError, match="recorded_train"):
    CorpusSpec(recorded_train=("monkey-island",))
  with pytest.raises(ValueError, match="spoken_dialogue 'monkey-island'; valid: any of queen"):
    CorpusSpec(spoken_dialogue=("monkey-island",))
  assert CorpusSpec(target="es", real_test="sky").splits()[-3:] == (
      "dev-real", "tst-real", "tst-COMMON-5k")


def test_band_limited_keeps_speech_band_and_drops_what_11khz_cannot_hold():
  t = np.arange(16000) / 16000
  low, high = np.sin(2 * np.pi * 1000 * t), np.sin(2 * np.pi * 7000 * t)
  out = build.band_limited((0.4 * (low + high)).astype(np.float32))
  spectrum = np.abs(np.fft.rfft(out[1000:-1000]))
  freqs = np.fft.rfftfreq(len(out) - 2000, 1 / 16000)
  at = lambda f: spectrum[np.argmin(np.abs(freqs - f))]
  assert len(out) == 16000
  assert at(7000) < 0.01 * at(1000)
  assert at(1000) > 0.9 * np.abs(np.fft.rfft(0.4 * low[1000:-1000])).max()


def test_train_only_pairs_join_the_asr_training_and_nothing_else(tmp_path):
  """The recorded transcripts (en-en, training split only) train ASR; ST, dev and the ST
  vocabulary never see them."""
  from data_prep import prepare
  from multiformer_jax import experiment
  from multiformer_jax.data import input_pipeline as ip
  from tests.conftest import _good_segments, write_split
  from tests.test_train import tiny_config
  root = str(tmp_path / "corpus")
  for pair, splits in (("en-es", ("train", "dev")), ("en-en", ("train",))):
    for split in splits:
      write_split(root, split, {f"{pair}_{split}{i}": ("wav", *_good_segments(4)[::-1])
                                for i in range(2)}, pair)
  os.makedirs(os.path.join(root, "en-es", "text"))
  for lang, lines in (("en", "zebra crossing ahead\nthe zebra speaks\n"),
                      ("es", "paso de cebra\nla cebra habla\n")):
    with open(os.path.join(root, "en-es", "text", f"game.{lang}"), "w") as f:
      f.write(lines)
  out = str(tmp_path / "prepared")
  summary = prepare.prepare("mustc", root, ["en-es"], out, ["train", "dev"], asr_vocab=40,
                            st_vocab=48, workers=1, progress=False, train_only_pairs=["en-en"])
  assert summary["train_only_pairs"] == ["en-en"]
  assert summary["text_only"] == {"en-es": ["game"]}
  assert ip.text_only_lines(out, "en") == ["zebra crossing ahead", "the zebra speaks"]
  assert ip.text_only_lines(out, "es", pairs=["en-de"]) == []
  config = tiny_config(out)
  pairs = lambda stage, split: sorted(set(map(str, ip.SplitData(
      experiment.pipeline_config(config, stage), split).tag_values["pair"])))
  assert pairs("asr", "train") == ["en-en", "en-es"]
  assert pairs("st", "train") == ["en-es"]
  assert pairs("asr", "dev") == pairs("st", "dev") == ["en-es"]
  # The MT stage may train on it: more pairs, target side in the ST vocabulary.
  from multiformer_jax.data import text_pairs as tp
  from multiformer_jax.training import mt_stage
  data = mt_stage.split_data(config, "train")
  pairs = tp.text_pairs(data, 48)
  more = tp.with_text_only(pairs, data)
  assert len(more) == len(pairs) + 2
  assert more.references[-2:] == ["paso de cebra", "la cebra habla"]
  tokens = data.vocab.encode("la cebra habla")
  assert more.target[-1, :len(tokens) + 1].tolist() == tokens + [2]     # + EOS
