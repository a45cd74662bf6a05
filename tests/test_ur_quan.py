"""The Ur-Quan Masters reader on archives the tests build (a resource map, a conversation's text
and stamps, Ogg Vorbis clips of tones): pages cut as the engine plays them, what is left out and
counted, utterances of at most max_seconds, and a real split's words kept out of training."""

import contextlib
import io
import zipfile

import numpy as np
import pytest

from data_prep.embedded import build, recorded
from data_prep.embedded.recorded import ur_quan
from data_prep.embedded.spec import CorpusSpec

RATE = ur_quan.SAMPLE_RATE

TEXT = """#(HELLO)\tvux-000.ogg
Greetings, human.

We see your ship.
It is ugly.

#(player_says)
Hello there.

#(TOO_FEW_STAMPS)\tvux-001.ogg
One.
Two.
Three.

#(SPLICED)\tvux-002.ogg
The first part.

#(NUMBERS)\tvux-003.ogg
Go to 241.6 now.
Then leave.

#(OUT_TAKE_1)\tvux-004.ogg
Did not!

#(OUT_TAKE_2)\tvux-004.ogg
Did too!
"""

STAMPS = """#(HELLO) 1000,0,2000
#(player_says)
#(TOO_FEW_STAMPS) 500
#(SPLICED) 1500,1500
#(NUMBERS) 1000
#(OUT_TAKE_1) 500
#(OUT_TAKE_2) 500
"""

RMP = ("comm.vux.dialogue = CONVERSATION:base/comm/vux/vux.txt:addons/3dovoice/vux/:"
       "addons/3dovoice/vux/vux.ts\n"
       "comm.orz.dialogue = CONVERSATION:base/comm/orz/orz.txt:addons/3dovoice/orz/:"
       "addons/3dovoice/orz/orz.ts\n")


def _tones(*spans) -> bytes:
  """An Ogg Vorbis clip of (seconds, frequency) tones in turn."""
  import soundfile  # pylint: disable=import-outside-toplevel
  parts = [0.3 * np.sin(2 * np.pi * f * np.arange(int(s * RATE)) / RATE) for s, f in spans]
  out = io.BytesIO()
  soundfile.write(out, np.concatenate(parts).astype(np.float32), RATE, format="OGG",
                  subtype="VORBIS")
  return out.getvalue()


def _peak_frequency(samples: np.ndarray, rate: int) -> float:
  spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
  return float(np.argmax(spectrum) * rate / len(samples))


def make_archives(folder) -> ur_quan.Archives:
  voice, content = folder / "voice.uqm", folder / "content.uqm"
  with zipfile.ZipFile(voice, "w") as z:
    z.writestr("3dovoice/3dovoice.rmp", RMP)
    z.writestr("3dovoice/vux/vux.ts", STAMPS)
    z.writestr("3dovoice/vux/vux-000.ogg", _tones((1.0, 400), (2.0, 1000), (1.5, 2500)))
    z.writestr("3dovoice/vux/vux-001.ogg", _tones((1.5, 400)))
    z.writestr("3dovoice/vux/vux-002.ogg", _tones((1.5, 700), (1.5, 1500)))
    z.writestr("3dovoice/vux/vux-003.ogg", _tones((1.0, 400), (1.0, 900)))
    z.writestr("3dovoice/vux/vux-004.ogg", _tones((0.5, 400), (0.5, 900)))
  with zipfile.ZipFile(content, "w") as z:
    z.writestr("base/comm/vux/vux.txt", TEXT)          # orz's conversation is not there
  return ur_quan.Archives(str(voice), str(content))


def test_conversations_name_the_race_by_its_clips_folder():
  found = ur_quan.conversations(RMP + "comm.yehat.rebel.dialogue = CONVERSATION:base/comm/"
                                "yehatrebels/yehatrebels.txt:addons/3dovoice/yehatrebels/:"
                                "addons/3dovoice/yehatrebels/yehatrebels.ts\n")
  assert [c.race for c in found] == ["vux", "orz", "yehatrebels"]
  assert found[0] == ur_quan.Conversation("vux", "base/comm/vux/vux.txt",
                                          "addons/3dovoice/vux/", "addons/3dovoice/vux/vux.ts")
  with pytest.raises(ur_quan.UrQuanError, match="no CONVERSATION"):
    ur_quan.conversations("comm.vux.graphics = GFXRES:base/comm/vux/vux.ani\n")


def test_pages_play_as_the_engine_cuts_them():
  tally = recorded.Tally()
  conversation = ur_quan.conversations(RMP)[0]
  pages = ur_quan.pages(conversation, TEXT, STAMPS, tally)
  by_clip = {}
  for page in pages:
    by_clip.setdefault(page.clip.rsplit("/", 1)[-1], []).append(
        (page.text, page.start, page.end))
  # Empty lines are no page; a zero is no stamp; the last page plays to the clip's end.
  assert by_clip["vux-000.ogg"] == [("Greetings, human.", 0.0, 1.0),
                                    ("We see your ship.", 1.0, 3.0),
                                    ("It is ugly.", 3.0, None)]
  # More stamps than pages: the clip goes on with text spliced from elsewhere.
  assert by_clip["vux-002.ogg"] == [("The first part.", 0.0, 1.5)]
  assert "vux-001.ogg" not in by_clip and "vux-004.ogg" not in by_clip
  assert tally == {"block without a clip (the player's line)": 1,
                   "clip block whose stamps are not its pages": 1,
                   "block whose clip other blocks name too": 2}


def test_uqm_lines_cut_each_clip_where_its_pages_play(tmp_path):
  archives = make_archives(tmp_path)
  tally = recorded.Tally()
  lines = list(recorded.uqm_lines(archives, tally, max_seconds=3.2))
  assert [(line.id, line.speaker, line.text) for line in lines] == [
      ("uqm_vux-000_0", "uqm_vux", "Greetings, human. We see your ship."),
      ("uqm_vux-000_2", "uqm_vux", "It is ugly."),
      ("uqm_vux-002_0", "uqm_vux", "The first part.")]
  # Each utterance is the span its pages play: its length and its tones.
  for line, seconds, tones in zip(lines, (3.0, 1.5, 1.5), ((400, 1000), (2500,), (700,))):
    assert len(line.audio) / recorded.SAMPLE_RATE == pytest.approx(seconds, abs=0.01)
    heard = [_peak_frequency(part, recorded.SAMPLE_RATE)
             for part in np.array_split(line.audio, len(tones))]
    assert heard == pytest.approx(tones, abs=15)
  assert tally == {"linked": 3, "linked pages": 4, "block without a clip (the player's line)": 1,
                   "clip block whose stamps are not its pages": 1,
                   "block whose clip other blocks name too": 2,
                   "pages with digits or a placeholder": 2, "race without text or stamps": 1,
                   "page past the clip's end": 0}
  # Without a limit the clip's three pages are one utterance; without audio, a page each.
  assert [line.text for line in recorded.uqm_lines(archives, recorded.Tally())][0] == (
      "Greetings, human. We see your ship. It is ugly.")
  assert len(list(recorded.uqm_lines(archives, recorded.Tally(), with_audio=False))) == 5


def test_the_training_split_leaves_out_what_a_real_split_says(monkeypatch):
  sky = [recorded.RecordedLine(f"sky_{n}", "sky_s0", f"Sky line {n}.", {"es": "L."})
         for n in range(30)]
  uqm = [recorded.RecordedLine(f"uqm_a_{n}", "uqm_vux", f"Sky line {n}!", {}) for n in range(30)]
  monkeypatch.setattr(recorded, "game_folder", lambda game, cache_dir, package="": game)
  monkeypatch.setattr(recorded, "sky_lines", lambda folder, tally: sky)
  monkeypatch.setattr(recorded, "uqm_archives", lambda cache_dir: contextlib.nullcontext())
  monkeypatch.setattr(recorded, "uqm_lines", lambda archives, tally: iter(uqm))
  written = []
  monkeypatch.setattr(build, "_recorded_talks",
                      lambda root, split, lines, *rest: written.extend(lines) or [])
  spec = CorpusSpec(target="es", recorded_train=("uqm",), real_test="sky", real_heldout=5)
  log = []
  build._recorded_train_split("unused", spec, log=log.append)
  held = {recorded.text_key(line.text) for split in build._sky_held_out(spec, log=log.append)[1]
          for line in split}
  assert len(held) == 10 and len(written) == 20
  assert not {recorded.text_key(line.text) for line in written} & held
  assert "The Ur-Quan Masters" in log[0] and "says a real split's line 10" in log[0]


def test_spec_takes_uqm_for_training_only():
  assert CorpusSpec(recorded_train=("queen", "uqm")).recorded_train == ("queen", "uqm")
  with pytest.raises(ValueError, match="recorded_train 'sky'; valid: any of queen, uqm"):
    CorpusSpec(recorded_train=("sky",))
  with pytest.raises(ValueError, match="spoken_dialogue 'uqm'; valid: any of queen, sky"):
    CorpusSpec(spoken_dialogue=("uqm",))


def test_without_the_packages_training_is_built_without_uqm_and_says_so(monkeypatch):
  def unavailable(game, cache_dir, package=""):
    raise recorded.GameUnavailable(f"apt-get download {package or game} failed")
  monkeypatch.setattr(recorded, "game_folder", unavailable)
  build._game_problem.cache_clear()
  warnings = []
  effective = build.effective_spec(CorpusSpec(recorded_train=("uqm",)), log=warnings.append)
  build._game_problem.cache_clear()
  assert effective.recorded_train == ()
  assert len(warnings) == 1 and "The Ur-Quan Masters" in warnings[0]
  assert "apt-get download uqm failed" in warnings[0] and "no recorded speech" in warnings[0]
