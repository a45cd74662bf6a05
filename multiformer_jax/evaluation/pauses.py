"""Cutting a long recording into segments at its pauses, by short-time energy.

A recording longer than the segment limit is cut, near each place the limit falls, at the
middle of the quietest stretch of the last `search_seconds` before it: the frames whose
smoothed energy is within `QUIET_MARGIN_DB` of that window's minimum, the longest run of them.
Between two sentences that is the pause; inside continuous speech it is the softest moment
(a stop closure, a breath) rather than wherever the limit falls. Every segment stays within
the limit. Energy is measured as Kaldi frames it (25 ms windows, 10 ms hop), averaged over
`SMOOTH_SECONDS` so that a pause outweighs the short gaps between words.

Segments whose loudest smoothed frame is below SILENCE_DBFS are silence and are dropped (their
decode would be the model's guess at nothing); a recording with no other is "silent".
"""

from __future__ import annotations

import numpy as np

from data_prep.audio import SAMPLE_RATE

FRAME_SHIFT = SAMPLE_RATE // 100          # 10 ms
FRAME_LENGTH = SAMPLE_RATE * 25 // 1000   # 25 ms: fbank's analysis window
SMOOTH_SECONDS = 0.2
QUIET_MARGIN_DB = 3.0
SILENCE_DBFS = -60.0                      # 0.1 % of full scale
SEARCH_SECONDS = 5.0


def frame_energy_db(samples: np.ndarray) -> np.ndarray:
  """[frames] each 10 ms frame's energy in dB of full scale (a sine of amplitude 1: -3 dB),
  over its 25 ms window, smoothed by a SMOOTH_SECONDS moving average of the power."""
  if len(samples) < FRAME_LENGTH:
    return np.zeros((0,), np.float64)
  count = 1 + (len(samples) - FRAME_LENGTH) // FRAME_SHIFT
  squares = np.concatenate([[0.0], np.cumsum(np.asarray(samples, np.float64) ** 2)])
  starts = np.arange(count) * FRAME_SHIFT
  power = (squares[starts + FRAME_LENGTH] - squares[starts]) / FRAME_LENGTH   # [frames]
  width = max(1, int(round(SMOOTH_SECONDS * 100)))
  kernel = np.ones(width) / width
  smoothed = np.convolve(np.pad(power, (width // 2, width - 1 - width // 2), mode="edge"),
                         kernel, mode="valid")                                # [frames]
  return 10.0 * np.log10(np.maximum(smoothed, 1e-12))


def quietest_point(energy_db: np.ndarray) -> int:
  """The index, in `energy_db`, of the middle of its longest run of frames within
  QUIET_MARGIN_DB of its minimum (the latest such run if several are longest)."""
  quiet = energy_db <= energy_db.min() + QUIET_MARGIN_DB
  edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
  starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)     # [runs]
  lengths = ends - starts
  longest = np.flatnonzero(lengths == lengths.max())[-1]
  return int((starts[longest] + ends[longest]) // 2)


def pause_cuts(samples: np.ndarray, max_seconds: float,
               search_seconds: float = SEARCH_SECONDS) -> list[tuple[int, int]]:
  """[(start, end)] sample ranges that cover `samples` in order, each at most max_seconds long,
  cut at the quietest stretch of the last min(search_seconds, max_seconds / 2) before each
  limit. A recording within the limit is one range."""
  if max_seconds <= 0:
    raise ValueError(f"segment_seconds={max_seconds}; give a positive number of seconds")
  limit = max(1, int(round(max_seconds * SAMPLE_RATE)))
  if len(samples) <= limit:
    return [(0, len(samples))]
  energy = frame_energy_db(samples)
  search = int(round(min(search_seconds, max_seconds / 2) * SAMPLE_RATE))
  cuts, start = [], 0
  while len(samples) - start > limit:
    # The frames whose centre lies in [start + limit - search, start + limit).
    end = start + limit
    first = max(0, (end - search - FRAME_LENGTH // 2) // FRAME_SHIFT + 1)
    last = min(len(energy), (end - FRAME_LENGTH // 2) // FRAME_SHIFT)
    if last <= first:                    # a window shorter than one frame: cut at the limit
      cut = end
    else:
      frame = first + quietest_point(energy[first:last])
      cut = min(end, max(start + 1, frame * FRAME_SHIFT + FRAME_LENGTH // 2))
    cuts.append((start, cut))
    start = cut
  cuts.append((start, len(samples)))
  return cuts


def is_silent(samples: np.ndarray) -> bool:
  """Whether no smoothed frame of `samples` reaches SILENCE_DBFS (or it has no whole frame)."""
  energy = frame_energy_db(samples)
  return energy.size == 0 or float(energy.max()) < SILENCE_DBFS
