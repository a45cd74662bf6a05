"""The training batches: the reference assembly's (the per-utterance functions composed as the
earlier pipeline did, a fresh array per batch), inline and from worker processes writing into
shared memory; a batch still referred to is never overwritten; slots are reused; a dead
worker is named; a corpus of the earlier format is refused with its conversion command and
converts to the same batches."""

import json
import os
import signal
import time

import numpy as np
import pytest

from data_prep import convert_features, vocab
from data_prep.features import SpecAugment, utterance_cmvn, utterance_cmvn_in_place
from multiformer_jax.data import input_pipeline as ip, native_cmvn
from tests.old_format import write_old_format


def reference_batch(batcher: ip.Batcher, bucket_id: int, indices, epoch: int) -> dict:
  """The earlier Batcher.assemble (main 5c9dc56), transcribed: per utterance its features,
  apply_cmvn, SpecAugment's copy with the generator of (seed, epoch, utterance), then the
  tokens, into zero-initialised arrays."""
  bucket, data, cfg = batcher.buckets[bucket_id], batcher.data, batcher.data.config
  n = len(indices) // batcher.process_count
  local = indices[batcher.process_index * n:(batcher.process_index + 1) * n]
  batch = {"features": np.zeros((n, bucket.frames, data.feature_dim), np.float32),
           "lengths": np.ones(n, np.int32),
           "prev_tokens": np.full((n, bucket.tokens), vocab.PAD_ID, np.int32),
           "targets": np.full((n, bucket.tokens), vocab.PAD_ID, np.int32),
           "weights": np.zeros(n, np.float32), "index": np.full(n, -1, np.int32)}
  for row, i in enumerate(local):
    if i < 0:
      continue
    fbank = ip.apply_cmvn(np.array(data.fbank(i)), cfg.cmvn, data.gcmvn)
    if cfg.specaugment:
      fbank = SpecAugment.from_policy(cfg.specaugment_policy)(
          fbank, np.random.default_rng([cfg.seed, epoch, int(i)]))
    batch["features"][row, :len(fbank)] = fbank
    batch["lengths"][row] = len(fbank)
    tokens = data.tokens[i]
    batch["prev_tokens"][row, 0] = vocab.EOS_ID
    batch["prev_tokens"][row, 1:len(tokens) + 1] = tokens
    batch["targets"][row, :len(tokens)] = tokens
    batch["targets"][row, len(tokens)] = vocab.EOS_ID
    batch["weights"][row] = 1.0
    batch["index"][row] = i
  return batch


def _batcher(out, cmvn="utterance", seed=3):
  config = ip.PipelineConfig(out, stage="st", max_frames=1200, num_buckets=4, seed=seed,
                             cmvn=cmvn)
  return ip.Batcher(ip.SplitData(config, "train"), True, 2)


def _expected(batcher, count):
  """The first `count` batches of the plan (across epochs) by the reference assembly."""
  out, epoch = [], 0
  while len(out) < count:
    out += [reference_batch(batcher, b, idx, epoch) for b, idx in batcher.epoch_plan(epoch)]
    epoch += 1
  return out[:count]


def _assert_same(got, want):
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("cmvn", ["utterance", "global", "none"])
def test_inline_batches_are_the_reference_assemblys_bit_for_bit(prepared, cmvn):
  batcher = _batcher(prepared[1], cmvn)
  iterator = ip.TrainIterator(batcher)
  for want in _expected(batcher, 9):                    # crosses an epoch boundary
    _assert_same(next(iterator), want)


def test_worker_batches_are_the_reference_and_kept_ones_stay_intact(prepared):
  batcher = _batcher(prepared[1])
  expected = _expected(batcher, 16)
  with ip.TrainIterator(batcher, workers=2, prefetch=3) as iterator:
    kept = [next(iterator) for _ in range(16)]          # all held: slots are never reused
    for got, want in zip(kept, expected):
      _assert_same(got, want)
    assert len(iterator._pool.slots.slots) >= 16


def test_dropped_batches_return_their_slots(prepared):
  batcher = _batcher(prepared[1])
  expected = _expected(batcher, 30)
  with ip.TrainIterator(batcher, workers=2, prefetch=3) as iterator:
    for want in expected:
      _assert_same(next(iterator), want)
    # prefetch 3 + the batch just handed out + the one being assembled as it was taken
    assert len(iterator._pool.slots.slots) <= 5


def test_a_restored_worker_iterator_continues_with_the_next_batch(prepared):
  batcher = _batcher(prepared[1])
  expected = _expected(batcher, 14)
  with ip.TrainIterator(batcher, workers=2, prefetch=4) as iterator:
    next(iterator)                                       # prefetches ahead, then is moved
    iterator.restore(json.loads(json.dumps({"epoch": 0, "position": 0})))
    for _ in range(7):
      next(iterator)
    state = iterator.state()
  with ip.TrainIterator(batcher, workers=2) as resumed:
    resumed.restore(state)
    for want in expected[7:]:
      _assert_same(next(resumed), want)


def test_a_worker_killed_midway_is_named(prepared):
  with ip.TrainIterator(_batcher(prepared[1]), workers=1, prefetch=1) as iterator:
    next(iterator)
    os.kill(iterator._pool._processes[0].pid, signal.SIGKILL)
    time.sleep(0.5)
    with pytest.raises(RuntimeError, match=r"loader worker .* died with exit code -9"):
      for _ in range(3):
        next(iterator)


def test_the_earlier_format_is_refused_with_its_command_and_converts_to_the_same_batches(
    prepared, tmp_path):
  old = write_old_format(prepared[1], str(tmp_path / "old"))
  with pytest.raises(ValueError, match=r"earlier format.*python -m "
                                       r"data_prep.convert_features --prepared .*old"):
    _batcher(old)
  summary = convert_features.convert(old, delete_tfds=True, progress=False)
  assert summary["features"] == "frames" and not os.path.exists(os.path.join(old, "tfds"))
  assert convert_features.convert(old, progress=False) == summary      # a no-op now
  new, converted = _batcher(prepared[1]), _batcher(old)
  for b, indices in new.epoch_plan(1)[:6]:
    _assert_same(converted.assemble(b, indices, 1), new.assemble(b, indices, 1))
  for split in ("train", "dev"):
    a = ip.SplitData(ip.PipelineConfig(old, stage="asr"), split)
    b = ip.SplitData(ip.PipelineConfig(prepared[1], stage="asr"), split)
    for i in range(len(a)):
      np.testing.assert_array_equal(a.fbank(i), b.fbank(i))


def test_in_place_and_compiled_utterance_cmvn_are_utterance_cmvn_bit_for_bit():
  assert native_cmvn.kernel() is not None              # the C++ function built here
  rng = np.random.default_rng(7)
  scratch = np.empty((3000, 80))
  for frames in [1, 2, 5, 77, 640, 2999, 3000] + list(rng.integers(5, 3000, 40)):
    x = (rng.normal(size=(frames, 80)) * rng.uniform(0.1, 9) + rng.uniform(-20, 20)).astype(
        np.float32)
    x[:, 3] = 7.25                                      # a constant bin: the variance floor
    expected = utterance_cmvn(x)
    for buffer in (scratch, None):
      got = x.copy()
      utterance_cmvn_in_place(got, buffer)
      np.testing.assert_array_equal(got, expected)
    out = np.full_like(x, np.nan)
    native_cmvn.utterance_cmvn_into(x, out)
    np.testing.assert_array_equal(out, expected)
