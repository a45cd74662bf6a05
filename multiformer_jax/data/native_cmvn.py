"""Per-utterance CMVN by a small C++ function (cpu/cmvn.cc), from the prepared features into
the batch: one read of the features for the statistics and one for the result, about ten times
numpy's speed, the same float32 values bit for bit (tests/test_loader.py). Built on first use
with the system's C++ compiler (multiformer_common.native_build); where it cannot be built the
numpy function (data_prep.features.utterance_cmvn_in_place) does the same work, and the
reason is logged once."""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import numpy as np

from data_prep import features as features_lib
from multiformer_common import native_build

SOURCE = Path(__file__).with_name("cpu") / "cmvn.cc"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
         "-std=c++17")

_log = logging.getLogger(__name__)


@functools.cache
def kernel():
  """The compiled function, or None (then numpy's) where it cannot be built or loaded."""
  try:
    library = ctypes.cdll.LoadLibrary(str(native_build.build("data_cmvn", [SOURCE],
                                                             flags=FLAGS)))
  except (RuntimeError, OSError) as error:
    _log.warning("utterance CMVN runs in numpy (slower, the same values): the C++ function "
                 "is unavailable: %s", error)
    return None
  function = library.UtteranceCmvn
  function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
  function.restype = None
  return function


def utterance_cmvn_into(source: np.ndarray, out: np.ndarray, scratch=None):
  """out [frames, bins] float32 (C order) = utterance_cmvn(source [frames, bins] float32)."""
  function = kernel()
  if function is None or not (source.flags.c_contiguous and out.flags.c_contiguous):
    np.copyto(out, source)
    features_lib.utterance_cmvn_in_place(out, scratch)
    return
  function(source.ctypes.data, out.ctypes.data, source.shape[0], source.shape[1])
