"""Data: corpus readers, features, bad input, preparation, and the input pipeline, on a tiny
MuST-C-layout corpus built here (tones and noise, with every kind of bad input)."""

import json
import math
import os
import re

import numpy as np
import pytest

from data_prep import corpora, prepare
from data_prep.features import SpecAugment, fbank, utterance_cmvn
from multiformer_jax.data import input_pipeline as ip
from tests.conftest import write_split
from tests.kaldi_reference import kaldi_fbank

RNG = np.random.default_rng(0)


def kaldi_native_fbank(samples):
  """The same features from kaldi-native-fbank (Kaldi's C++ code, float32)."""
  import kaldi_native_fbank as knf
  opts = knf.FbankOptions()
  opts.frame_opts.dither = 0.0
  opts.frame_opts.window_type = "povey"
  opts.mel_opts.num_bins = 80
  computer = knf.OnlineFbank(opts)
  computer.accept_waveform(16000, np.asarray(samples, np.float32) * 32768.0)
  computer.input_finished()
  return np.array([computer.get_frame(i) for i in range(computer.num_frames_ready)]).reshape(-1, 80)


@pytest.mark.parametrize("n", [12345, 400, 399, 160000])
def test_fbank_matches_kaldi(n):
  x = (0.05 * RNG.normal(size=n) +
       0.3 * np.sin(np.arange(n) * 2 * np.pi * 440 / 16000)).astype(np.float32)
  ours, ref, library = fbank(x), kaldi_fbank(x), kaldi_native_fbank(x)
  assert ours.shape == ref.shape == library.shape == ((n - 400) // 160 + 1 if n >= 400 else 0,
                                                      80)
  assert ours.dtype == np.float32
  np.testing.assert_allclose(ours, ref, atol=1e-5)           # same arithmetic, float64
  np.testing.assert_allclose(ours, library, atol=2e-3)       # Kaldi's float32 arithmetic
  quiet = 1e-4 * RNG.normal(size=4000).astype(np.float32)    # near the log floor
  np.testing.assert_allclose(fbank(quiet), kaldi_native_fbank(quiet), atol=2e-3)


def test_utterance_cmvn_and_specaugment():
  x = RNG.normal(3.0, 2.0, size=(200, 80)).astype(np.float32)
  y = utterance_cmvn(x)
  np.testing.assert_allclose(y.mean(0), 0, atol=1e-4)
  np.testing.assert_allclose(y.std(0), 1, atol=1e-3)
  a = SpecAugment()(y, np.random.default_rng(5))
  b = SpecAugment()(y, np.random.default_rng(5))
  np.testing.assert_array_equal(a, b)                      # same seed, same masks
  masked = a == y.mean()
  masked_rows, masked_cols = masked.all(1), masked.all(0)
  assert 0 < masked_cols.sum() < 27 and 0 < masked_rows.sum() < 100   # F=27, T=100
  # Only whole masked rows and columns change, and they carry the spectrogram's mean.
  changed = a != y
  assert np.all(changed <= (masked_rows[:, None] | masked_cols[None, :]))


def test_specaugment_policies():
  # The SpecAugment paper's table 1 (W omitted): F, m_F, T, p, m_T.
  paper = {"lb": (27, 1, 100, 1.0, 1), "ld": (27, 2, 100, 1.0, 2),
           "sm": (15, 2, 70, 0.2, 2), "ss": (27, 2, 70, 0.2, 2)}
  for name, (f, m_f, t, p, m_t) in paper.items():
    assert SpecAugment.from_policy(name) == SpecAugment(
        freq_mask_n=m_f, freq_mask_f=f, time_mask_n=m_t, time_mask_t=t, time_mask_p=p)
  assert SpecAugment.from_policy("lb") == SpecAugment()
  assert SpecAugment.from_policy(" sm, time_mask_p=0.1,time_mask_n=1") == SpecAugment(
      freq_mask_n=2, freq_mask_f=15, time_mask_n=1, time_mask_t=70, time_mask_p=0.1)
  for bad, named in (("xl", "'xl' is not a policy"), ("sm,time_mask=3", "'time_mask=3'"),
                     ("sm,time_mask_n=two", "time_mask_n='two'"),
                     ("sm,time_mask_p=1.5", "time_mask_p=1.5"),
                     ("sm,freq_mask_f=-1", "freq_mask_f=-1")):
    with pytest.raises(ValueError, match=re.escape(named)):
      SpecAugment.from_policy(bad)
  with pytest.raises(ValueError, match="data.specaugment_policy"):
    ip.PipelineConfig(prepared_dir="unused", specaugment_policy="xl")


def test_pipeline_config_takes_the_policy_and_reads_saved_configs_without_it(tmp_path):
  from multiformer_jax import schema
  from multiformer_jax import experiment
  config = schema.base_config()
  config.data.specaugment_policy = "sm"
  assert experiment.pipeline_config(config, "asr").specaugment_policy == "sm"
  saved = json.loads(config.to_json_best_effort())
  del saved["data"]["specaugment_policy"]                 # a run's config.json without the key
  (tmp_path / "config.json").write_text(json.dumps(saved))
  older = schema.load_config(str(tmp_path))
  assert experiment.pipeline_config(older, "asr").specaugment_policy == "lb"
  assert older.data.max_frames == config.data.max_frames


def test_specaugment_time_masks_scale_with_length():
  """With p < 1 no time mask exceeds p of the utterance: max_t = min(T, floor(p * frames)),
  and a mask of t frames draws t from [0, max_t) (fairseq's SpecAugmentTransform)."""
  policy = SpecAugment.from_policy("sm,freq_mask_n=0,time_mask_n=1")
  for frames in (9, 40, 120, 400):
    x = RNG.normal(size=(frames, 80)).astype(np.float32)
    widths = []
    for seed in range(200):
      masked_rows = (policy(x, np.random.default_rng(seed)) == x.mean()).all(1)
      widths.append(int(masked_rows.sum()))
    max_t = min(70, math.floor(0.2 * frames))
    assert max(widths) == max(max_t - 1, 0)       # t is drawn below max_t; frames 9: no mask


def test_mustc_reader_round_trip(prepared):
  root, _ = prepared
  records = corpora.read_mustc(root, "en-de", "dev")
  assert len(records) == 15
  first = records[0]
  assert first.id == "dev0_0" and first.talk == "dev0" and first.speaker == "spk_dev0"
  assert first.audio_path.endswith(os.path.join("dev", "wav", "dev0.wav"))
  with open(os.path.join(root, "en-de", "data", "dev", "txt", "dev.de"), encoding="utf-8") as f:
    assert [r.target_text for r in records] == f.read().splitlines()
  assert {r.source_lang for r in records} == {"en"} and {r.domain for r in records} == {"mustc"}


def test_missing_or_mislaid_corpus_names_the_directory_and_layout(tmp_path):
  with pytest.raises(corpora.CorpusLayoutError) as info:
    corpora.read_mustc(str(tmp_path / "nowhere"), "en-de", "train")
  message = str(info.value)
  assert "nowhere" in message and "data/train/txt/train.yaml" in message
  assert "ict.fbk.eu/must-c" in message
  (tmp_path / "en-de" / "data" / "train" / "txt").mkdir(parents=True)
  with pytest.raises(corpora.CorpusLayoutError, match="missing .*train.yaml"):
    corpora.read_mustc(str(tmp_path), "en-de", "train")
  with pytest.raises(ValueError, match="unknown mustc split 'test'"):
    corpora.read_mustc(str(tmp_path), "en-de", "test")


def test_text_that_is_not_utf8_is_skipped_and_counted_naming_the_file(tmp_path, caplog):
  root = str(tmp_path / "corpus")
  write_split(root, "train", {"t0": ("wav", 4.0, [(0.2, 1.0, "one two", "eins zwei"),
                                                  (1.5, 1.0, "three", "drei"),
                                                  (2.8, 1.0, "four five", "vier fuenf")])})
  target = os.path.join(root, "en-de", "data", "train", "txt", "train.de")
  with open(target, "rb") as f:
    lines = f.read().split(b"\n")
  lines[1] = b"dr\xe4i (Latin-1, not UTF-8)"
  with open(target, "wb") as f:
    f.write(b"\n".join(lines))
  out = str(tmp_path / "prepared")
  with caplog.at_level("WARNING", logger="data_prep"):
    prepare.prepare("mustc", root, ["en-de"], out, ["train"], asr_vocab=20, st_vocab=20,
                    workers=1, progress=False)
  assert f"{target}: 1 lines are not UTF-8 (the first: line 2)" in caplog.text
  with open(os.path.join(out, "prep_report.json"), encoding="utf-8") as f:
    report = json.load(f)["train"]
  assert report["skipped"] == {"text not UTF-8": 1} and report["kept"] == 2
  assert report["skipped_examples"]["text not UTF-8"] == ["t0_1"]


def test_bad_input_is_skipped_or_repaired_with_its_reason(prepared):
  _, out = prepared
  with open(os.path.join(out, "prep_report.json"), encoding="utf-8") as f:
    report = json.load(f)["train"]
  assert report["skipped"] == {
      "empty text": 1, "fewer than 5 frames": 1, "segment past end of audio": 2,
      "unreadable audio": 2, "non-finite features": 1}
  assert report["skipped_examples"]["segment past end of audio"] == ["bad_3", "trunc_1"]
  assert report["skipped_examples"]["unreadable audio"] == ["corrupt_0", "corrupt_1"]
  assert report["repaired_talks"] == {"downmixed to mono": 1,
                                      "resampled 8000 Hz -> 16000 Hz": 1}
  assert report["kept"] == 36 + 1 + 1 + 1 + 1 == report["segments"] - 7


def test_preparation_is_resumable_and_complete(prepared, monkeypatch):
  _, out = prepared
  with open(os.path.join(out, "prepared.json"), encoding="utf-8") as f:
    summary = json.load(f)
  assert summary["splits"] == {"train": 40, "dev": 15}
  # A rerun does no work: it must not even look at the audio again.
  monkeypatch.setattr(prepare, "process_talk", lambda job: pytest.fail("redone"))
  assert prepare.prepare("mustc", "/nonexistent", ["en-de"], out) == summary
  # The talks' feature caches are gone once their shards are written.
  assert os.listdir(os.path.join(out, "features", "train")) == []
  assert summary["shards"] == {"train": 1, "dev": 1}        # one worker, a small corpus


def _pipeline(out, split="train", train=True, max_frames=1200, multiple=2, **kw):
  config = ip.PipelineConfig(out, stage="st", max_frames=max_frames, num_buckets=4, **kw)
  return ip.Batcher(ip.SplitData(config, split), train, multiple)


def test_batches_are_bounded_and_few_shapes(prepared):
  _, out = prepared
  batcher = _pipeline(out)
  shapes = set()
  for epoch in range(2):
    for bucket, indices in batcher.epoch_plan(epoch):
      batch = batcher.assemble(bucket, indices, epoch)
      b, t, _ = batch["features"].shape
      assert b * t <= 1200 and b % 2 == 0
      assert np.all(batch["lengths"][batch["weights"] > 0] <= t)
      shapes.add((b, t, batch["targets"].shape[1]))
  assert len(shapes) <= 4


def test_token_buckets_bound_target_length_and_pad_fewer_tokens(prepared):
  _, out = prepared
  padded_tokens = {}
  for k in (1, 3):
    batcher = _pipeline(out, num_token_buckets=k)
    data = batcher.data
    assert len(batcher.buckets) <= 4 * k
    seen, padded = [], 0
    for b, indices in batcher.epoch_plan(0):
      bucket, real = batcher.buckets[b], indices[indices >= 0]
      assert np.all(data.n_frames[real] <= bucket.frames)
      assert np.all(data.tokens.lengths[real] + 1 <= bucket.tokens)
      assert bucket.tokens % (8 if k == 1 else 4) == 0
      assert len(indices) == bucket.batch_size
      seen += real.tolist()
      padded += bucket.tokens * len(real)
    assert sorted(seen) == list(range(len(data)))        # every utterance once an epoch
    padded_tokens[k] = padded
    if k > 1:    # balanced: a split's batches differ by less than one padding row each
      for b, bucket in enumerate(batcher.buckets):
        members = int(np.sum(batcher.bucket_of == b))
        batches = -(-members // bucket.batch_size)
        assert batches * bucket.batch_size - members < 2 * batches
        assert bucket.batch_size <= max(2, 1200 // bucket.frames // 2 * 2)
  assert padded_tokens[3] < padded_tokens[1]
  with pytest.raises(ValueError, match=r"data.num_token_buckets=0; valid: an integer >= 1"):
    ip.PipelineConfig(out, num_token_buckets=0)


@pytest.mark.parametrize("seed", range(6))
def test_bucket_edges_minimise_padding(seed):
  """Against every choice of at most k edges among the rounded lengths (the longest is always
  one): the edges give the least padded frames."""
  import itertools
  rng = np.random.default_rng(seed)
  lengths = np.concatenate([rng.integers(1, 200, size=40), rng.integers(300, 700, size=3)])
  rounded = np.ceil(lengths / 16).astype(int) * 16
  padded = lambda edges: int(np.asarray(edges)[np.searchsorted(edges, rounded)].sum())
  values = np.unique(rounded)
  for k in (1, 2, 3, 4):
    edges = ip.bucket_boundaries(lengths, k)
    assert len(edges) <= k and edges[-1] == values[-1] and np.all(edges % 16 == 0)
    best = min(padded(list(inner) + [values[-1]])
               for size in range(k) for inner in itertools.combinations(values[:-1], size))
    assert padded(edges) == best


def test_resumed_iterator_yields_the_same_batches(prepared):
  _, out = prepared
  full = ip.TrainIterator(_pipeline(out))
  expected = [next(full) for _ in range(12)]          # crosses an epoch boundary
  first = ip.TrainIterator(_pipeline(out))
  for _ in range(5):
    next(first)
  resumed = ip.TrainIterator(_pipeline(out))
  resumed.restore(json.loads(json.dumps(first.state())))
  for want in expected[5:]:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


def test_evaluation_sees_every_utterance_once(prepared):
  _, out = prepared
  batcher = _pipeline(out, "dev", train=False, multiple=4)
  seen = []
  for batch in ip.eval_batches(batcher):
    seen += batch["index"][batch["weights"] > 0].tolist()
    assert np.all(batch["index"][batch["weights"] == 0] == -1)
  assert sorted(seen) == list(range(15))


def test_evaluation_batches_are_as_few_as_at_full_size_and_balanced(prepared):
  """Each row of an evaluation batch is a whole beam search: a bucket's batches are as many as
  its full batch size makes, but as even as they go (none mostly padding rows)."""
  _, out = prepared
  config = ip.PipelineConfig(out, stage="st", max_frames=1200, num_buckets=2)
  data = ip.SplitData(config, "dev")
  batcher = ip.Batcher(data, False, 2, 0, 1)
  for b, bucket in enumerate(batcher.buckets):
    members = int((batcher.bucket_of == b).sum())
    full = max(2, config.max_frames // bucket.frames // 2 * 2)
    batches = [i for k, i in batcher.epoch_plan(0) if k == b]
    assert len(batches) == -(-members // full) and bucket.batch_size % 2 == 0
    assert sum(int((i >= 0).sum()) for i in batches) == members
    # The smallest size (a multiple of the 2 devices) that needs no more batches.
    smaller = bucket.batch_size - 2
    assert smaller < 2 or -(-members // smaller) > len(batches), (members, bucket)


def test_processes_take_disjoint_slices_of_each_global_batch(prepared):
  _, out = prepared
  config = ip.PipelineConfig(out, stage="st", max_frames=1200, num_buckets=4)
  data = ip.SplitData(config, "train")
  batchers = [ip.Batcher(data, True, 1, p, 2) for p in range(2)]
  bucket, indices = batchers[0].epoch_plan(0)[0]
  parts = [b.assemble(bucket, indices, 0)["index"] for b in batchers]
  np.testing.assert_array_equal(np.concatenate(parts), indices)


def test_training_batches_apply_the_configured_specaugment_policy(prepared):
  _, out = prepared
  policy = "ss,time_mask_p=0.5"
  config = ip.PipelineConfig(out, stage="st", max_frames=1200, num_buckets=4,
                             specaugment_policy=policy, seed=4)
  data = ip.SplitData(config, "train")
  batcher = ip.Batcher(data, True, 1, 0, 1)
  assert batcher.spec_augment == SpecAugment.from_policy(policy)
  bucket, indices = batcher.epoch_plan(2)[0]
  batch = batcher.assemble(bucket, indices, 2)
  for row, i in enumerate(batch["index"]):
    if i < 0:
      continue
    clean = ip.apply_cmvn(data.fbank(i), config.cmvn)
    expected = SpecAugment.from_policy(policy)(clean, np.random.default_rng([4, 2, int(i)]))
    np.testing.assert_array_equal(batch["features"][row, :len(clean)], expected)
  evaluation = ip.Batcher(ip.SplitData(config, "dev"), False, 1, 0, 1)
  assert evaluation.spec_augment is None


def test_targets_are_tokens_plus_eos_and_decode_back(prepared):
  _, out = prepared
  batcher = _pipeline(out, "dev", train=False)
  batch = next(ip.eval_batches(batcher))
  row = 0
  i = batch["index"][row]
  targets, prev = batch["targets"][row], batch["prev_tokens"][row]
  n = int((targets != 1).sum())
  assert targets[n - 1] == 2 and prev[0] == 2
  np.testing.assert_array_equal(prev[1:n], targets[:n - 1])
  assert batcher.data.vocab.decode(targets[:n]) == batcher.data.references[i]
