"""Cepstral mean and variance normalisation of a batch's features as data.cmvn says: per utterance
(in C++ where it is built: native_cmvn), with the training split's global statistics, or none.
"""

from __future__ import annotations

import os

import numpy as np

from data_prep import features as features_lib
from multiformer_jax.data import native_cmvn


def read_gcmvn(prepared_dir: str, summary: dict) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std) of the global CMVN statistics preparation wrote from the training split."""
  stats = np.load(os.path.join(prepared_dir, summary["gcmvn"]))
  return stats["mean"], stats["std"]


def apply_cmvn(fbank: np.ndarray, cmvn: str, gcmvn=None) -> np.ndarray:
  """fbank [frames, 80] normalised as data.cmvn says: per utterance, with the global (mean,
  std) `gcmvn`, or not at all."""
  if cmvn == "utterance":
    return features_lib.utterance_cmvn(fbank)
  if cmvn == "global":
    return features_lib.global_cmvn(fbank, *gcmvn)
  return fbank


def apply_cmvn_into(fbank: np.ndarray, out: np.ndarray, cmvn: str, gcmvn=None, scratch=None):
  """out [frames, 80] = apply_cmvn(fbank, cmvn, gcmvn), the same values, written into `out`
  (utterance CMVN by the C++ function; `scratch`: float64 room for its numpy fallback)."""
  if cmvn == "utterance":
    native_cmvn.utterance_cmvn_into(fbank, out, scratch)
  elif cmvn == "global":
    np.subtract(fbank, gcmvn[0], out=out)
    np.divide(out, gcmvn[1], out=out)
  else:
    np.copyto(out, fbank)
