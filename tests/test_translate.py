"""Translating one's own audio files: the same hypotheses as evaluation for the same audio,
bounded compilation, long files cut at pauses, results streamed and kept, bad files named and
skipped."""

import json
import os

import numpy as np
import pytest
import soundfile

from data_prep import corpora
from data_prep.audio import SAMPLE_RATE, cut_segment, load_audio
from multiformer_jax.training import train
from multiformer_jax import translate
from multiformer_jax.evaluation import audio_files, pauses
from multiformer_jax.evaluation import results as eval_results
from multiformer_jax import schema
from tests.test_train import tiny_config

RNG = np.random.default_rng(7)


def _tone(seconds, path=None):
  """Tones and noise like the tiny corpus's speech; written to `path` as 16-bit wav if given."""
  t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
  audio = (0.2 * np.sin(2 * np.pi * RNG.uniform(150, 400) * t)
           + 0.05 * RNG.normal(size=t.size)).astype(np.float32)
  if path is not None:
    soundfile.write(str(path), audio, SAMPLE_RATE, subtype="PCM_16")
  return audio


@pytest.fixture(scope="module")
def evaluated_run(prepared, tmp_path_factory):
  """A tiny two-stage run evaluated on dev from its latest checkpoints, both stages' n-best
  rescored with a word LM and their utterances slowed down by speaking-rate normalisation
  (evaluation settings that translation must follow too)."""
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, max_updates=4, eval_every=4)
  config.eval.after_training = True
  config.eval.lm_weight, config.eval.lm_stages = 5.0, ("asr", "st")
  # CTC heads in both stages and speaking-rate normalisation, which translation follows too.
  config.asr.ctc_weight = config.st.ctc_weight = 0.3
  config.eval.rate_norm_target = 0.05
  workdir = str(tmp_path_factory.mktemp("translated_run"))
  train.train_and_evaluate(config, workdir)
  return workdir


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def test_a_file_decodes_as_evaluation_decodes_the_same_audio(prepared, evaluated_run, tmp_path):
  root, _ = prepared
  records = corpora.read_mustc(root, "en-de", "dev")[:3]
  paths, audio = [], []
  for r in records:
    samples, _ = load_audio(r.audio_path)
    segment = cut_segment(samples, r.offset, r.duration)
    path = str(tmp_path / f"{r.id}.wav")
    soundfile.write(path, segment, SAMPLE_RATE, subtype="FLOAT")     # the exact samples
    paths.append(path)
    audio.append(segment)
  results = audio_files.decode_files(evaluated_run, paths, segment_seconds=1000.0)
  for stage in ("asr", "st"):
    directory = eval_results.find(evaluated_run, stage, "dev",
                                  schema.load_config(evaluated_run))
    hyps = dict(zip(_lines(os.path.join(directory, "ids.txt")),
                    _lines(os.path.join(directory, "hyp.txt"))))
    assert [r[stage] for r in results] == [hyps[r.id] for r in records], stage
  assert [r["segments"] for r in results] == [1, 1, 1]
  # Two utterances with a pause between them, in one file longer than the limit: cut in the
  # pause, each piece decoded as that piece alone would be, the texts joined.
  pause = np.zeros(int(0.6 * SAMPLE_RATE), np.float32)
  joined = np.concatenate([audio[0], pause, audio[1]])
  limit = (len(audio[0]) + len(pause) // 2) / SAMPLE_RATE + 0.1
  path = str(tmp_path / "joined.wav")
  soundfile.write(path, joined, SAMPLE_RATE, subtype="FLOAT")
  (result,) = audio_files.decode_files(evaluated_run, [path], ("asr",), segment_seconds=limit)
  assert result["segments"] == 2
  cut = pauses.pause_cuts(joined, limit)[0][1]
  assert len(audio[0]) < cut < len(audio[0]) + len(pause)
  parts = [str(tmp_path / "first.wav"), str(tmp_path / "second.wav")]
  soundfile.write(parts[0], joined[:cut], SAMPLE_RATE, subtype="FLOAT")
  soundfile.write(parts[1], joined[cut:], SAMPLE_RATE, subtype="FLOAT")
  alone = audio_files.decode_files(evaluated_run, parts, ("asr",), segment_seconds=1000.0)
  assert result["asr"] == " ".join(r["asr"] for r in alone if r["asr"])


def test_many_lengths_compile_one_program_per_bucket_and_decode_as_alone(evaluated_run,
                                                                       tmp_path):
  """Files of 24 different lengths: each stage compiles at most one search per frame bucket
  (the old one-file-at-a-time path compiled one per length), and a file decodes to the same
  text inside a padded batch of others as alone."""
  paths = []
  for i, seconds in enumerate(np.linspace(0.3, 3.9, 24)):
    paths.append(str(tmp_path / f"f{i:02d}.wav"))
    _tone(seconds, paths[-1])
  decoder = audio_files.FileDecoder(evaluated_run, segment_seconds=4.0)
  assert decoder.edges == [256, 400]
  streamed = list(decoder.decode(paths))
  assert sorted(r["index"] for r in streamed) == list(range(24))
  compiled = decoder.compiled_programs()
  assert set(compiled) == {"asr", "st"}
  assert all(1 <= n <= len(decoder.edges) for n in compiled.values()), compiled
  by_index = {r["index"]: r for r in streamed}
  for i in (0, 11, 23):
    (alone,) = audio_files.decode_files(evaluated_run, [paths[i]], segment_seconds=4.0)
    assert alone == {k: v for k, v in by_index[i].items() if k != "index"}
  # The API: the same texts, in the order given, each also handed over as it is decoded.
  seen = []
  listed = audio_files.decode_files(evaluated_run, paths[:5], segment_seconds=4.0,
                                     on_result=seen.append)
  assert [r["path"] for r in listed] == paths[:5]
  assert sorted(r["path"] for r in seen) == paths[:5]
  assert [r["asr"] for r in listed] == [by_index[i]["asr"] for i in range(5)]


def test_a_bounded_number_of_files_is_held_open(evaluated_run, tmp_path):
  """With small batches, the bucket of the oldest open file is decoded, full or not: no more
  than max_open_files files wait, and every file comes out."""
  paths = [str(tmp_path / f"g{i}.wav") for i in range(9)]
  for i, path in enumerate(paths):
    _tone(0.5 if i % 3 else 3.0, path)        # mostly short, a long one now and then
  decoder = audio_files.FileDecoder(evaluated_run, ("asr",), segment_seconds=4.0,
                                        batch_frames=800)
  assert decoder.batch_sizes == [3, 2] and decoder.max_open_files == 6
  order = [r["index"] for r in decoder.decode(paths)]
  assert sorted(order) == list(range(9))


def test_bad_files_are_named_and_the_others_decoded(evaluated_run, tmp_path):
  t = np.arange(12000) / 8000
  stereo = np.stack([0.2 * np.sin(2 * np.pi * 220 * t)] * 2, axis=1)
  good = str(tmp_path / "stereo_8k.flac")
  soundfile.write(good, stereo, 8000)
  corrupt = tmp_path / "corrupt.wav"
  corrupt.write_bytes(b"RIFF not a wav" * 10)
  empty = str(tmp_path / "empty.wav")
  soundfile.write(empty, np.zeros(0, np.float32), SAMPLE_RATE)
  silent = str(tmp_path / "silent.wav")
  soundfile.write(silent, np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE)
  short = str(tmp_path / "short.wav")
  soundfile.write(short, _tone(0.01), SAMPLE_RATE)
  nans = str(tmp_path / "nans.wav")
  soundfile.write(nans, np.full(SAMPLE_RATE, np.nan, np.float32), SAMPLE_RATE, subtype="FLOAT")
  paths = [str(tmp_path / "nowhere.wav"), str(corrupt), good, empty, silent, short, nans]
  results = audio_files.decode_files(evaluated_run, paths)
  reasons = [r.get("error", "") for r in results]
  expected = ["missing audio file", "unreadable audio", "", "empty audio", "silent",
              "shorter than one 25 ms analysis window", "non-finite samples"]
  for path, reason, want in zip(paths, reasons, expected):
    assert want in reason and (not want or reason.startswith(path)), (path, reason)
  assert isinstance(results[2]["st"], str) and results[2]["segments"] == 1
  with pytest.raises(ValueError, match=r"segment_seconds=0"):
    audio_files.decode_files(evaluated_run, [good], segment_seconds=0)


def test_the_command_streams_to_a_file_and_a_rerun_skips_what_is_there(evaluated_run, tmp_path,
                                                                       capsys):
  paths = [str(tmp_path / f"h{i}.wav") for i in range(4)]
  for path in paths:
    _tone(1.0, path)
  missing = str(tmp_path / "missing.wav")
  out = tmp_path / "out" / "results.jsonl"
  argv = ["--workdir", evaluated_run, "--output", str(out), "--stages", "asr", "--"]
  assert translate.main(argv + paths[:2] + [missing]) == 1
  assert "missing.wav: missing audio file" in capsys.readouterr().err
  first = [json.loads(line) for line in out.read_text().splitlines()]
  assert sorted(r["path"] for r in first) == paths[:2]
  assert set(first[0]) == {"path", "segments", "asr"}
  with open(out, "a", encoding="utf-8") as f:          # a line a killed run left half-written
    f.write('{"path": "' + paths[3])
  assert translate.main(argv + paths) == 0
  assert "2 of 4 files are already in" in capsys.readouterr().err
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert sorted(r["path"] for r in rows) == sorted(paths) and rows[:2] == first
  # TSV: a header, one row per file; text to stdout when there is no --output.
  tsv = tmp_path / "results.tsv"
  assert translate.main(["--workdir", evaluated_run, "--output", str(tsv)] + paths[:2]) == 0
  lines = tsv.read_text().splitlines()
  assert lines[0] == "path\tsegments\tasr\tst" and len(lines) == 3
  assert translate.main(["--workdir", evaluated_run, paths[0]]) == 0
  assert capsys.readouterr().out.startswith(f"{paths[0]} (1 segment(s))\n  transcript")
  with pytest.raises(ValueError, match="name a .tsv or .jsonl file"):
    translate.main(["--workdir", evaluated_run, "--output", str(tmp_path / "r.txt"), paths[0]])


def test_rate_norm_target_replaces_the_runs_and_is_checked(evaluated_run):
  assert audio_files.FileDecoder(evaluated_run, ("asr",)).config.eval.rate_norm_target == 0.05
  off = audio_files.FileDecoder(evaluated_run, ("asr",), rate_norm_target=0.0)
  assert off.config.eval.rate_norm_target == 0.0
  with pytest.raises(ValueError, match=r"eval.rate_norm_target=-1.0"):
    audio_files.FileDecoder(evaluated_run, ("asr",), rate_norm_target=-1.0)
