"""The large-corpus code paths on tiny data: many small shards, a preparation killed midway,
a full disk, and training batches assembled ahead by worker processes."""

import errno
import json
import os
import re
import shutil
import types
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from data_prep import corpora, feature_store, index_io, prepare
from data_prep.audio import cut_segment, load_audio
from data_prep.features import fbank
from multiformer_jax.data import input_pipeline as ip

SMALL_SHARD_FRAMES = 300        # the tiny corpus's train split (~4000 frames) in many shards


def _prepare(root, out, **kw):
  return prepare.prepare("mustc", root, ["en-de"], out, ["train", "dev"], asr_vocab=40,
                         st_vocab=40, progress=False, **kw)


def _records(out, split):
  """The split's rows as prepared: index columns and the features read back by offset."""
  with open(os.path.join(out, "prepared.json"), encoding="utf-8") as f:
    summary = json.load(f)
  index = index_io.load(os.path.join(out, "index", f"{split}.npz"))
  store = feature_store.FeatureStore(
      [os.path.join(out, p) for p in summary["feature_files"][split]], index["feature_file"],
      index["feature_offset"], index["n_frames"], 80)
  return [{"id": index["id"][i], "target_text": index["target_text"][i],
           "fbank": np.array(store.view(i))} for i in range(len(index["id"]))]


@pytest.fixture(scope="module")
def sharded(prepared, tmp_path_factory):
  """The test corpus prepared again with many small shards and two workers."""
  out = str(tmp_path_factory.mktemp("sharded"))
  return _prepare(prepared[0], out, workers=2, shard_frames=SMALL_SHARD_FRAMES), out


def test_every_segment_reads_back_as_computed_from_many_shards(prepared, sharded):
  root, one_shard = prepared
  summary, out = sharded
  assert summary["shards"]["train"] >= 6 and summary["shards"]["dev"] >= 2
  names = os.listdir(os.path.join(out, feature_store.DIRECTORY, "train"))
  assert len([n for n in names if n.endswith(".f32")]) == summary["shards"]["train"]
  segments = {r.id: r for r in corpora.read_mustc(root, "en-de", "train")}
  audio = {}
  records = _records(out, "train")
  assert len(records) == summary["splits"]["train"] == 40
  for record in records:
    segment = segments[record["id"]]
    if segment.audio_path not in audio:
      audio[segment.audio_path] = load_audio(segment.audio_path)[0]
    expected = fbank(cut_segment(audio[segment.audio_path], segment.offset, segment.duration))
    np.testing.assert_array_equal(record["fbank"], expected)
    assert record["target_text"] == segment.target_text
  # The same records in the same order as with one shard and one worker.
  reference = _records(one_shard, "train")
  assert [r["id"] for r in records] == [r["id"] for r in reference]
  for got, want in zip(records, reference):
    np.testing.assert_array_equal(got["fbank"], want["fbank"])
  for split in ("train", "dev"):
    a, b = np.load(os.path.join(out, "index", f"{split}.npz")), \
        np.load(os.path.join(one_shard, "index", f"{split}.npz"))
    assert sorted(a.files) == sorted(b.files)
    for key in set(a.files) - {"feature_file", "feature_offset"}:   # where, not what
      np.testing.assert_array_equal(a[key], b[key])
  # Global CMVN from the shards' sums equals the one-shard statistics.
  a, b = np.load(os.path.join(out, "gcmvn.npz")), np.load(os.path.join(one_shard, "gcmvn.npz"))
  for key in ("mean", "std"):
    np.testing.assert_allclose(a[key], b[key], rtol=1e-6)
  with open(os.path.join(out, "prep_report.json"), encoding="utf-8") as f, \
      open(os.path.join(one_shard, "prep_report.json"), encoding="utf-8") as g:
    assert json.load(f) == json.load(g)


def test_shard_plan_is_bounded_and_covers_every_talk():
  durations = [[3.0, 4.0], [50.0], [1.0], [2.0, 2.0, 2.0], [0.5], [30.0], [7.0]]
  jobs = [(f"t{i}", [types.SimpleNamespace(duration=d) for d in ds], True)
          for i, ds in enumerate(durations)]
  target = 1000                                       # frames (10 s)
  shards = prepare.plan_shards(jobs, target, min_shards=1)
  assert [i for shard in shards for i in shard] == list(range(len(jobs)))
  largest_talk = max(sum(ds) for ds in durations) * 100
  for shard in shards:
    frames = sum(sum(durations[i]) * 100 for i in shard)
    assert frames < target + largest_talk
    assert frames - sum(durations[shard[-1]]) * 100 < target     # closed once it reaches it
  assert len(prepare.plan_shards(jobs, 10 ** 9, min_shards=4)) >= 4   # one per worker
  assert prepare.plan_shards([], target, 2) == [[]]


PREPARE = ("import sys; sys.path.insert(0, {cwd!r}); from data_prep import prepare; "
           "prepare.prepare('mustc', {root!r}, ['en-de'], {out!r}, ['train', 'dev'], "
           "asr_vocab=40, st_vocab=40, workers=2, progress=False, shard_frames={frames})")


def test_a_killed_preparation_keeps_finished_shards_and_finishes_on_rerun(prepared, sharded,
                                                                           tmp_path):
  root = prepared[0]
  out = str(tmp_path / "killed")
  env = {**os.environ, prepare.FAULT_ENV: "prepare.train.shard:3"}
  code = PREPARE.format(cwd=os.getcwd(), root=root, out=out, frames=SMALL_SHARD_FRAMES)
  result = subprocess.run([sys.executable, "-c", code], env=env, start_new_session=True,
                          capture_output=True, timeout=300)
  assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
  shards = os.path.join(out, feature_store.DIRECTORY, "train")
  written = {name: os.stat(os.path.join(shards, name)) for name in os.listdir(shards)
             if not name.endswith(".tmp")}
  assert written and not os.path.exists(os.path.join(out, "prepared.json"))
  summary = _prepare(root, out, workers=2, shard_frames=SMALL_SHARD_FRAMES)
  assert summary == sharded[0]
  for name, before in written.items():         # finished shards were kept, not rewritten
    after = os.stat(os.path.join(shards, name))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
  for got, want in zip(_records(out, "train"), _records(sharded[1], "train")):
    assert got["id"] == want["id"]
    np.testing.assert_array_equal(got["fbank"], want["fbank"])


def test_a_killed_preparation_worker_is_named_with_its_shard_and_the_rerun_finishes(
    prepared, sharded, tmp_path):
  """A worker SIGKILLed as it starts shard 2 (what the kernel's OOM killer does): the
  preparation stops at once naming the shard, not waiting for ever; the rerun finishes with
  the records of an uninterrupted preparation."""
  root = prepared[0]
  out = str(tmp_path / "worker_killed")
  started = time.monotonic()
  result = subprocess.run(
      [sys.executable, "-m", "data_prep.prepare", "--corpus", "mustc", "--root", root,
       "--pairs", "en-de", "--out", out, "--splits", "train,dev", "--asr-vocab", "40",
       "--st-vocab", "40", "--workers", "2", "--shard-frames", str(SMALL_SHARD_FRAMES)],
      env={**os.environ, prepare.FAULT_ENV: "prepare.train.worker:2"}, capture_output=True,
      text=True, timeout=300, check=False)
  assert time.monotonic() - started < 240                      # generous: it does not hang
  assert result.returncode == 2, result.stderr[-3000:]
  assert re.search(r"a preparation worker died while writing \S+/train/00002-of-\d+\.f32 "
                   r"\(pid \d+\): killed", result.stderr), result.stderr[-3000:]
  assert "rerun the same command to resume" in result.stderr
  summary = _prepare(root, out, workers=2, shard_frames=SMALL_SHARD_FRAMES)
  assert summary == sharded[0]
  for got, want in zip(_records(out, "train"), _records(sharded[1], "train")):
    assert got["id"] == want["id"]
    np.testing.assert_array_equal(got["fbank"], want["fbank"])


def test_a_truncated_shard_is_named_when_a_run_starts_and_repaired_by_the_command(
    prepared, sharded, tmp_path):
  out = str(tmp_path / "truncated")
  shutil.copytree(sharded[1], out)
  shard = os.path.join(out, feature_store.DIRECTORY, "train", "00003-of-%05d.f32"
                       % sharded[0]["shards"]["train"])
  with open(shard, "r+b") as f:
    f.truncate(os.path.getsize(shard) // 2 // 320 * 320)        # whole rows, too few
  with pytest.raises(ValueError, match=r"1 feature shard\(s\) of train in .* are shorter "
                                       r"than the index says: .*00003-of-\d+\.f32: \d+ bytes, "
                                       r"\d+ needed.*python -m data_prep.prepare --repair "
                                       r"--out .*truncated"):
    ip.SplitData(ip.PipelineConfig(out), "train")
  result = subprocess.run([sys.executable, "-m", "data_prep.prepare", "--repair", "--out", out,
                           "--workers", "1"], capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0 and "1 shard(s) rewritten" in result.stdout, result.stderr
  for got, want in zip(_records(out, "train"), _records(sharded[1], "train")):
    assert got["id"] == want["id"]
    np.testing.assert_array_equal(got["fbank"], want["fbank"])


def test_a_full_disk_says_what_to_do_and_keeps_the_finished_work(prepared, tmp_path,
                                                                 monkeypatch):
  root = prepared[0]
  records = corpora.read_mustc(root, "en-de", "dev")
  talk = [r for r in records if r.talk == "dev0"]
  cache = str(tmp_path / "dev0.npz")
  shard = str(tmp_path / "shard-00000-of-00001")
  job = (shard, str(tmp_path / "sidecar.json"), [(cache, list(talk), False)],
         False, "")

  def full(self, example):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(feature_store.ShardWriter, "write", full)
  with pytest.raises(OSError, match=r"disk full while writing .*shard-00000.*rerun the same "
                                    r"command"):
    prepare.write_shard(job)
  assert os.path.exists(cache)                          # the talk's features are kept
  assert not os.path.exists(shard) and not os.path.exists(shard + ".tmp")


def _batcher(out):
  config = ip.PipelineConfig(out, stage="st", max_frames=1200, num_buckets=4, seed=3)
  return ip.Batcher(ip.SplitData(config, "train"), True, 2)


def _assert_same(got, want):
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key])


def test_prefetching_workers_give_the_synchronous_batches_and_state(sharded):
  out = sharded[1]
  synchronous = ip.TrainIterator(_batcher(out))
  expected, states = [], []
  for _ in range(14):                                   # crosses epoch boundaries
    expected.append(next(synchronous))
    states.append(synchronous.state())
  with ip.TrainIterator(_batcher(out), workers=2, prefetch=3) as prefetching:
    for want, state in zip(expected, states):
      _assert_same(next(prefetching), want)
      assert prefetching.state() == state
      assert len(prefetching._pending) <= 3                     # a bounded read-ahead
  with ip.TrainIterator(_batcher(out), workers=2, prefetch=5) as resumed:
    next(resumed)                                        # prefetches ahead, then is moved
    resumed.restore(json.loads(json.dumps(states[6])))
    for want in expected[7:]:
      _assert_same(next(resumed), want)
