"""Diagonality of contribution matrices and the window selection of Alastruey et al. 2022.

All functions take one utterance's contribution matrix C [N, N] (valid tokens only) and work
on its row-normalised form (each output's contributions sum to 1), as the paper does.
"""

import math

import numpy as np


def normalise_rows(contributions: np.ndarray) -> np.ndarray:
  c = np.asarray(contributions, np.float64)
  return c / np.maximum(c.sum(axis=1, keepdims=True), 1e-30)


def diagonal_sums(contributions: np.ndarray) -> np.ndarray:
  """[N]: r -> Σ of the normalised contributions at distance |i - j| = r."""
  c = normalise_rows(contributions)
  n = c.shape[0]
  distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
  return np.bincount(distance.ravel(), weights=c.ravel(), minlength=n)


def diagonality_curve(contributions: np.ndarray) -> np.ndarray:
  """D(w) for w = 1 .. 2N ([2N] array, index w-1):
  D(w) = (1/N) Σ_i Σ_{|j-i| <= w//2} C_ij, rows normalised (paper eq. 6)."""
  sums = diagonal_sums(contributions)
  n = len(sums)
  cumulative = np.cumsum(sums) / n                # radius r -> D with w//2 = r
  radius = np.minimum(np.arange(1, 2 * n + 1) // 2, n - 1)
  return cumulative[radius]


def curve_at(curve: np.ndarray, window: int) -> float:
  """D(w) read off a diagonality curve (windows past 2N see everything)."""
  return float(curve[min(window, len(curve)) - 1])


def curve_area(curve: np.ndarray) -> float:
  """CCD of a diagonality curve: the area under D(w) for w in [1, 2N], divided by the 2N
  windows so that it lies in (0, 1] whatever the length (1 = all on the main diagonal)."""
  return float(np.mean(curve))


def curve_area_unnormalised(curve: np.ndarray) -> float:
  """CCD as the paper defines it: the area under D(w) over the discrete w = 1 .. 2N (unit
  steps), in (0, 2N]; it grows with the utterance's length, curve_area does not."""
  return float(np.sum(curve))


def diagonality(contributions: np.ndarray, window: int) -> float:
  """D(w, l) of one utterance."""
  return curve_at(diagonality_curve(contributions), window)


def contribution_loss(contributions: np.ndarray, window: int) -> float:
  """CL(l, w) = 1 - D(w, l): the share of contribution a local(w) layer would lose."""
  return 1.0 - diagonality(contributions, window)


def select_window(contributions: np.ndarray, threshold: float = 0.01,
                  patience_fraction: float = 0.1) -> int:
  """Algorithm 1: widen from the main diagonal while the mean of sub- or super-diagonal i
  exceeds `threshold`; stop after N·patience_fraction consecutive diagonals below it.
  Returns w = 2i+1 for the last qualifying i (0 when not even the main diagonal qualifies)."""
  c = normalise_rows(contributions)
  n = c.shape[0]
  window, counter = 0, 0
  for i in range(n):
    if counter >= n * patience_fraction:
      break
    if np.diagonal(c, i).mean() > threshold or np.diagonal(c, -i).mean() > threshold:
      window, counter = 2 * i + 1, 0
    else:
      counter += 1
  return window


def window_from_samples(windows) -> tuple[float, float, int]:
  """(μ, σ, w) over utterances: w = ceil(μ + σ), made odd (population σ, as numpy's std)."""
  windows = np.asarray(windows, np.float64)
  mean, std = float(windows.mean()), float(windows.std())
  window = max(1, math.ceil(mean + std - 1e-9))
  return mean, std, window + 1 if window % 2 == 0 else window
