"""Cutting a recording into segments at its pauses, by short-time energy.

Models trained on sentence-level segments (MuST-C's, the embedded corpus's) translate a
recording best in pieces of about a sentence, so a recording is cut in two steps:
1. at every pause: a run of at least `min_pause` seconds of frames more than PAUSE_BELOW_DB
   under the recording's speech level (its 90th-percentile frame energy), between speech or
   before or after it. A segment keeps `margin` seconds of the pause on either side of its
   speech and no more: the sentence-level segments such models train on start and end with
   little silence, and the silence would change the utterance's CMVN statistics;
2. a piece still longer than the limit is cut, near each place the limit falls, at the middle
   of the quietest stretch of the last `search_seconds` before it (the frames whose smoothed
   energy is within QUIET_MARGIN_DB of that window's minimum, the longest run of them): inside
   continuous speech the softest moment (a stop closure, a breath) rather than wherever the
   limit falls.
Every segment stays within the limit. Energy is measured as Kaldi frames it (25 ms windows,
10 ms hop); step 2 averages it over SMOOTH_SECONDS so that a pause outweighs the short gaps
between words. In background noise louder than the speech level less PAUSE_BELOW_DB no pause is
found, and only step 2 cuts.

Segments whose loudest smoothed frame is below SILENCE_DBFS are silence and are dropped (their
decode would be the model's guess at nothing); a recording with no other is "silent".
"""

from __future__ import annotations

import numpy as np

from multiformer_common.errors import InvalidValue
from data_prep import features
from data_prep.audio import SAMPLE_RATE

FRAME_LENGTH, FRAME_SHIFT = features.frame_geometry(SAMPLE_RATE)   # fbank's 25 ms / 10 ms
SMOOTH_SECONDS = 0.2
QUIET_MARGIN_DB = 3.0
PAUSE_BELOW_DB = 30.0
MIN_PAUSE_SECONDS = 0.3
EDGE_MARGIN_SECONDS = 0.05
SILENCE_DBFS = -60.0                      # 0.1 % of full scale
SEARCH_SECONDS = 5.0


def frame_energy_db(samples: np.ndarray, smooth_seconds: float = SMOOTH_SECONDS) -> np.ndarray:
  """[frames] each 10 ms frame's energy in dB of full scale (a sine of amplitude 1: -3 dB),
  over its 25 ms window, smoothed by a `smooth_seconds` moving average of the power (0: not)."""
  count = features.num_frames(len(samples), SAMPLE_RATE)
  if count == 0:
    return np.zeros((0,), np.float64)
  squares = np.concatenate([[0.0], np.cumsum(np.asarray(samples, np.float64) ** 2)])
  starts = np.arange(count) * FRAME_SHIFT
  power = (squares[starts + FRAME_LENGTH] - squares[starts]) / FRAME_LENGTH   # [frames]
  width = max(1, int(round(smooth_seconds * 100)))
  if width > 1:
    kernel = np.ones(width) / width
    power = np.convolve(np.pad(power, (width // 2, width - 1 - width // 2), mode="edge"),
                        kernel, mode="valid")                                 # [frames]
  return 10.0 * np.log10(np.maximum(power, 1e-12))


def _frame_centre(frame: int) -> int:
  return frame * FRAME_SHIFT + FRAME_LENGTH // 2


def _runs(flags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(starts, ends) of the runs of True in `flags` (ends exclusive)."""
  edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
  return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def quietest_point(energy_db: np.ndarray) -> int:
  """The index, in `energy_db`, of the middle of its longest run of frames within
  QUIET_MARGIN_DB of its minimum (the latest such run if several are longest)."""
  starts, ends = _runs(energy_db <= energy_db.min() + QUIET_MARGIN_DB)
  lengths = ends - starts
  longest = np.flatnonzero(lengths == lengths.max())[-1]
  return int((starts[longest] + ends[longest]) // 2)


def speech_stretches(samples: np.ndarray, min_pause: float = MIN_PAUSE_SECONDS,
                     margin: float = EDGE_MARGIN_SECONDS) -> list[tuple[int, int]]:
  """[(start, end)] sample ranges of the speech between the pauses of `samples` (step 1 of the
  module docstring), each with `margin` seconds of the pause on either side."""
  energy = frame_energy_db(samples, smooth_seconds=0.0)
  if energy.size == 0:
    return [(0, len(samples))]
  quiet = energy < np.percentile(energy, 90) - PAUSE_BELOW_DB
  starts, ends = _runs(quiet)
  shortest, keep = int(round(min_pause * 100)), int(round(margin * SAMPLE_RATE))
  bounds, start = [], 0
  for first, last in zip(starts, ends):              # frames [first, last) are quiet
    if last - first < shortest:
      continue
    pause_start = 0 if first == 0 else _frame_centre(first)
    pause_end = len(samples) if last == len(energy) else _frame_centre(last - 1)
    if pause_start > start:
      bounds.append((start, min(pause_start + keep, pause_end)))
    start = max(pause_end - keep, pause_start) if last < len(energy) else len(samples)
  if start < len(samples):
    bounds.append((start, len(samples)))
  return bounds or [(0, len(samples))]


def pause_cuts(samples: np.ndarray, max_seconds: float, search_seconds: float = SEARCH_SECONDS,
               min_pause: float = MIN_PAUSE_SECONDS, margin: float = EDGE_MARGIN_SECONDS
               ) -> list[tuple[int, int]]:
  """[(start, end)] sample ranges of `samples` in order: its speech between pauses (step 1;
  all of it where there is no pause), each cut within the limit (step 2: at most max_seconds
  each, searching the last min(search_seconds, max_seconds / 2) before each limit)."""
  if max_seconds <= 0:
    raise InvalidValue(f"segment_seconds={max_seconds}; give a positive number of seconds")
  limit = max(1, int(round(max_seconds * SAMPLE_RATE)))
  search = int(round(min(search_seconds, max_seconds / 2) * SAMPLE_RATE))
  energy = frame_energy_db(samples)
  ranges = []
  for first, last in speech_stretches(samples, min_pause, margin):
    start = first
    while last - start > limit:
      cut = _quiet_cut(energy, start, start + limit, search)
      ranges.append((start, cut))
      start = cut
    ranges.append((start, last))
  return ranges


def _quiet_cut(energy: np.ndarray, start: int, end: int, search: int) -> int:
  """A cut in (start, end]: the middle of the quietest stretch of the frames (of the whole
  recording's smoothed `energy`) whose centre lies in [end - search, end)."""
  first = max(0, -(-(end - search - FRAME_LENGTH // 2) // FRAME_SHIFT))
  last = min(len(energy), (end - FRAME_LENGTH // 2) // FRAME_SHIFT)
  if last <= first:                      # a window shorter than one frame: cut at the limit
    return end
  frame = first + quietest_point(energy[first:last])
  return min(end, max(start + 1, _frame_centre(frame)))


def is_silent(samples: np.ndarray) -> bool:
  """Whether no smoothed frame of `samples` reaches SILENCE_DBFS (or it has no whole frame)."""
  energy = frame_energy_db(samples)
  return energy.size == 0 or float(energy.max()) < SILENCE_DBFS
