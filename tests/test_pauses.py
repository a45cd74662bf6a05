"""Cutting recordings at pauses: a segment per sentence where the pauses between sentences
are long enough, never a cut inside a sentence (synthesised speech), every segment within the
limit; and progress that does not flood a log file."""

import gc
import io

import numpy as np
import pytest
import soxr

from data_prep.embedded.voices import Voice, espeak
from data_prep.audio import SAMPLE_RATE
from multiformer_common.progress import PeriodicProgress, progress_bar
from multiformer_jax.evaluation import pauses

SENTENCES = [
    "It didn't take him more than five minutes.",
    "His sports career was blighted by a series of injuries.",
    "In the various regions of India, Hindus worship different gods.",
    "The weather will be fine tomorrow.",
    "She opened the window and looked at the sea.",
    "We should meet again next week to talk about the plan.",
    "Nobody knew where the old map had gone.",
    "He will appear as a guest star in the television show.",
]


def _speech_span(samples, threshold=0.01):
  """(first, last) sample index above the threshold: where the sentence's sound is."""
  loud = np.flatnonzero(np.abs(samples) > threshold)
  return int(loud[0]), int(loud[-1])


@pytest.fixture(scope="module")
def spoken():
  """Sentences spoken by espeak-ng at 16 kHz, float in [-1, 1]."""
  synth = espeak.Synthesizer()
  voice = Voice("en-us", "m3", 165, 45)
  out = []
  for text in SENTENCES:
    audio = synth.synthesize(text, voice).astype(np.float32) / 32768.0
    out.append(soxr.resample(audio, synth.sample_rate, SAMPLE_RATE).astype(np.float32))
  return out


def test_no_sentence_is_cut_and_every_segment_is_within_the_limit(spoken):
  rng = np.random.default_rng(0)
  pieces, spans, at = [], [], 0
  for audio in spoken:
    gap = np.zeros(int(rng.uniform(0.25, 0.7) * SAMPLE_RATE), np.float32)
    first, last = _speech_span(audio)
    spans.append((at + first, at + last))
    pieces += [audio, gap]
    at += len(audio) + len(gap)
  recording = np.concatenate(pieces)
  recording += rng.normal(0, 1e-3, recording.shape).astype(np.float32)  # a quiet room
  gaps = [(b - a) / SAMPLE_RATE for (_, a), (b, _) in zip(spans, spans[1:])]
  long_gaps = sum(g >= pauses.MIN_PAUSE_SECONDS + 0.05 for g in gaps)
  assert 0 < long_gaps < len(gaps)
  for limit in (6.0, 9.0, 14.0, 1000.0):
    cuts = pauses.pause_cuts(recording, limit)
    assert all(a < b <= c < d for (a, b), (c, d) in zip(cuts, cuts[1:]))   # in order
    assert all(0 < end - start <= limit * SAMPLE_RATE for start, end in cuts)
    for first, last in spans:             # every sentence whole inside one segment
      assert any(start <= first and last < end for start, end in cuts), \
          f"limit {limit}: the sentence at {first / SAMPLE_RATE:.2f} s is cut: {cuts}"
    # Between segments only pause: at most the margin of it is kept on either side.
    for (_, end), (start, _) in zip(cuts, cuts[1:]):
      assert not any(first < start and last > end for first, last in spans)
    assert len(cuts) > long_gaps          # every pause between sentences is a cut
    kept = sum(end - start for start, end in cuts) / SAMPLE_RATE
    assert kept < len(recording) / SAMPLE_RATE - 0.2 * long_gaps   # the pauses left out
  # A sentence alone, with silence before and after it: one segment.
  quiet = np.zeros(SAMPLE_RATE // 2, np.float32)
  for audio in spoken:
    assert len(pauses.pause_cuts(np.concatenate([quiet, audio, quiet]), 1000.0)) == 1


def test_without_pauses_the_cut_is_the_softest_point_and_the_limit_holds():
  t = np.arange(12 * SAMPLE_RATE) / SAMPLE_RATE
  loudness = np.where(np.abs(t - 7.3) < 0.15, 0.02, 0.5)   # one soft moment at 7.3 s
  tone = (loudness * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
  cuts = pauses.pause_cuts(tone, 8.0)
  assert len(cuts) == 2 and abs(cuts[0][1] / SAMPLE_RATE - 7.3) < 0.1
  flat = (0.5 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)      # nothing to prefer
  cuts = pauses.pause_cuts(flat, 5.0)
  assert all(end - start <= 5 * SAMPLE_RATE for start, end in cuts) and len(cuts) == 3


def test_a_short_recording_is_one_segment_and_the_limit_must_be_positive():
  assert pauses.pause_cuts(np.zeros(100, np.float32), 1.0) == [(0, 100)]
  with pytest.raises(ValueError, match="segment_seconds=0"):
    pauses.pause_cuts(np.zeros(100, np.float32), 0)


def test_silence_is_below_the_threshold_and_speech_above(spoken):
  assert pauses.is_silent(np.zeros(SAMPLE_RATE, np.float32))
  assert pauses.is_silent(np.full(SAMPLE_RATE, 1e-4, np.float32))
  assert pauses.is_silent(np.zeros(100, np.float32))                 # no whole frame
  assert not pauses.is_silent(spoken[0])
  sine = np.sin(2 * np.pi * 440 * np.arange(SAMPLE_RATE) / SAMPLE_RATE)
  assert abs(pauses.frame_energy_db(sine).mean() + 3.01) < 0.05     # a full-scale sine: -3 dB


class _Log(io.StringIO):
  def isatty(self):
    return False


def test_progress_in_a_file_is_a_line_every_so_often(capsys):
  assert isinstance(progress_bar(total=5, stream=_Log()), PeriodicProgress)
  bar = PeriodicProgress(total=1000, desc="decoding", unit="file", every_s=3600)
  for _ in range(1000):
    bar.update(1)
  bar.close()
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1 and "decoding: 1000/1000 file" in lines[0], lines
  bar = PeriodicProgress(total=3, desc="x", every_s=0.0)
  bar.update(1)
  bar.update(1)
  assert len(capsys.readouterr().err.splitlines()) == 2
  assert list(PeriodicProgress(range(3), disable=True)) == [0, 1, 2]
  assert capsys.readouterr().err == ""
  # Behind a zip that stops first (as the corpus build iterates it), the last line still comes.
  bar = PeriodicProgress(range(4), desc="talks", every_s=3600)
  assert len(list(zip(range(4), bar))) == 4
  del bar
  gc.collect()
  assert "talks: 4/4 it" in capsys.readouterr().err
