"""Two runs filling the package cache at once (ablate --jobs 2 on a machine whose corpus is not
built yet): each assembles in its own staging folder, one copy lands whole, neither fails.
Done with two real processes released together."""

import multiprocessing
import os
import time

from multiformer_common import packages
from data_prep.embedded.voices import common


def _assemble(staging):
  os.makedirs(staging)
  for i in range(50):
    with open(os.path.join(staging, f"part{i}"), "w", encoding="utf-8") as f:
      f.write(str(os.getpid()))
  time.sleep(0.3)                  # both are inside assemble() at once


def _racer(cache_dir, barrier, results):
  barrier.wait()
  path = common.assembled_dir(cache_dir, "voice-lib", ["pkg-a", "pkg-b"], _assemble)
  results.put((path, sorted(os.listdir(path))))


def test_two_processes_assembling_one_cache_folder(tmp_path):
  context = multiprocessing.get_context("spawn")
  barrier, results = context.Barrier(2), context.Queue()
  racers = [context.Process(target=_racer, args=(str(tmp_path), barrier, results))
            for _ in range(2)]
  for racer in racers:
    racer.start()
  outcomes = [results.get(timeout=60) for _ in racers]
  for racer in racers:
    racer.join(60)
    assert racer.exitcode == 0
  (path, files), other = outcomes
  assert other == (path, files) and files == sorted(f"part{i}" for i in range(50))
  writers = {open(os.path.join(path, f), encoding="utf-8").read() for f in files}
  assert len(writers) == 1                             # one process's copy, whole
  assert os.listdir(tmp_path) == [os.path.basename(path)]   # no staging folder left


def test_a_folder_already_in_place_is_kept(tmp_path):
  final, staging = tmp_path / "pkg", tmp_path / "staging"
  final.mkdir()
  (final / "theirs").write_text("complete")
  staging.mkdir()
  (staging / "ours").write_text("complete")
  assert packages.move_into_place(str(staging), str(final)) == str(final)
  assert os.listdir(final) == ["theirs"] and not staging.exists()
