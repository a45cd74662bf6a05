"""The MT stage (st.decoder_init="mt"): its pairs follow the ST batch's conventions, its
batches the speech Batcher's interface, it trains through the common loop (checkpoints, DONE,
resume), learns its pairs, and the ST stage starts its decoder from it."""

import json
import logging
import os

import flax
import jax
import numpy as np
import pytest

from multiformer_jax import experiment
from multiformer_jax import model as model_lib
from data_prep import vocab
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.data import text_pairs as tp
from multiformer_jax.evaluation.metrics import corpus_bleu
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import faults
from multiformer_jax.training import mt_stage, optimizer, train, transfer
from multiformer_jax.training.parallel import DataParallel
from multiformer_jax.training.steps import params_checksum
from tests.test_train import tiny_config

LOG = logging.getLogger("test")


def mt_config(prepared_dir, **mt):
  config = tiny_config(prepared_dir, max_updates=2, eval_every=2)
  config.st.decoder_init = "mt"
  config.st.ctc_weight = 0.3
  m = config.mt
  m.lr, m.lr_scheduler, m.warmup_updates = 3e-3, "polynomial_decay", 2
  m.max_updates, m.batch, m.eval_every, m.encoder_layers, m.dropout, m.beam = 4, 8, 2, 1, 0.0, 2
  m.keep_last = 2
  m.update(mt)
  return config


def test_text_pairs_are_the_st_batchs_source_pieces_and_targets(prepared):
  """source = the transcript's ASR pieces + EOS (the ST batch's ctc_targets); prev and target
  = the ST batch's prev_tokens and targets, row for row."""
  _, prepared_dir = prepared
  config = mt_config(prepared_dir)
  data = mt_stage.split_data(config, "train")
  length = tp.pair_length(data, 128)
  assert length % 8 == 0
  assert length >= np.percentile(np.maximum(data.source_tokens.lengths, data.tokens.lengths), 99)
  pairs = tp.text_pairs(data, length)
  assert pairs.truncated == 0 and len(pairs) == len(data) > 20
  assert list(pairs.ids) == [str(i) for i in data.ids]
  batcher = ip.Batcher(data, train=False)
  for bucket, indices in batcher.epoch_plan(0):
    batch = batcher.assemble(bucket, indices, 0)
    for row, i in enumerate(batch["index"]):
      if i < 0:
        continue
      for ours, theirs in ((pairs.source, "ctc_targets"), (pairs.prev, "prev_tokens"),
                           (pairs.target, "targets")):
        width = min(length, batch[theirs].shape[1])
        np.testing.assert_array_equal(ours[i, :width], batch[theirs][row, :width])
        assert set(ours[i, width:]) <= {vocab.PAD_ID}
  short = tp.text_pairs(data, 8)                          # sides cut to 7 pieces + EOS
  assert short.truncated == sum(max(s, t) > 7 for s, t in zip(data.source_tokens.lengths,
                                                               data.tokens.lengths))
  assert all(vocab.EOS_ID in row for row in short.target)


def random_pairs(n=203, width=64, seed=0) -> tp.TextPairs:
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, width - 3, n)
  source = np.full((n, width), vocab.PAD_ID, np.int32)
  target = source.copy()
  for i, length in enumerate(lengths):
    source[i, :length] = rng.integers(4, 30, length)
    target[i, :length - 1] = rng.integers(4, 30, length - 1)
    source[i, length - 1] = target[i, length - 1] = vocab.EOS_ID
  return tp.TextPairs(source, target.copy(), target, None, [""] * n,
                      np.arange(n).astype(str), 0)


def test_pair_batches_put_each_pair_once_an_epoch_in_the_narrowest_width_that_holds_it():
  pairs = random_pairs()
  lengths = pairs.lengths
  batcher = tp.TextPairBatcher(pairs, True, 16, 3, seed=5)
  edges = batcher.edges
  assert edges[-1] == 64 and edges == sorted(edges) and all(e % 8 == 0 for e in edges)
  assert len(edges) == 3 and batcher.shapes == [(16, e) for e in edges]
  plan = batcher.epoch_plan(0)
  seen = []
  for bucket, indices in plan:
    width, real = edges[bucket], indices[indices >= 0]
    assert len(indices) == 16 and np.all(lengths[real] <= width)
    narrower = [e for e in edges if e < width]
    assert not narrower or np.all(lengths[real] > narrower[-1])
    batch = batcher.assemble(bucket, indices, 0)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == batcher.layout(bucket)
    np.testing.assert_array_equal(batch["weights"], indices >= 0)
    np.testing.assert_array_equal(batch["source"][indices >= 0], pairs.source[real, :width])
    np.testing.assert_array_equal(batch["targets"][indices >= 0], pairs.target[real, :width])
    assert np.all(batch["targets"][indices < 0] == vocab.PAD_ID)
    seen += list(real)
  assert sorted(seen) == list(range(203))                 # every pair once an epoch
  # A function of (seed, epoch): the same plan again, another one the next epoch.
  again = tp.TextPairBatcher(pairs, True, 16, 3, seed=5).epoch_plan(0)
  assert all(a == c and np.array_equal(b, d) for (a, b), (c, d) in zip(plan, again))
  assert any(not np.array_equal(b, d) for (_, b), (_, d) in zip(plan, batcher.epoch_plan(1)))
  with pytest.raises(ValueError, match=r"mt.batch=10 pairs do not split evenly over 4 "
                                       r"device\(s\); valid: a multiple of 4"):
    tp.TextPairBatcher(pairs, True, 10, 3, seed=5, global_batch_multiple=4)


def test_the_mt_model_learns_its_pairs_and_translates_them_back(prepared, tmp_path):
  """Trained through the stage loop on the tiny corpus's training pairs, the beam search writes
  them back (BLEU near 100, most sentences exactly); the dev loss and BLEU are measured on
  schedule and the best checkpoint is kept."""
  _, prepared_dir = prepared
  config = mt_config(prepared_dir, max_updates=400, eval_every=200, lr=1e-2, batch=16)
  config.model.d_model, config.model.ffn_dim = 32, 64
  config.data.dev_split = "train"                          # dev = the pairs it learns
  summary = train.run_stage(config, "mt", str(tmp_path), DataParallel("pmap"))
  assert summary["updates"] == 400 and summary["best_step"] in (200, 400)
  assert summary["best_dev_bleu"] > 90
  with open(tmp_path / "mt" / "log.jsonl", encoding="utf-8") as f:
    evaluations = [r for r in map(json.loads, f) if "dev_loss" in r]
  assert [e["step"] for e in evaluations] == [200, 400] and evaluations[-1]["dev_ppl"] < 1.5
  train_pairs, _, data = mt_stage.stage_pairs(config, LOG)
  params, which = transfer.read_mt_params(str(tmp_path))
  assert which == f"best (step {summary['best_step']})"
  translate = mt_stage.MTTranslator(mt_stage.mt_model(config, data), data.vocab, 2, 1.0)
  hypotheses = translate(params, train_pairs)
  exact = np.mean([h == r for h, r in zip(hypotheses, train_pairs.references)])
  assert exact >= 0.9, list(zip(hypotheses, train_pairs.references))[:5]
  assert corpus_bleu(hypotheses, train_pairs.references)["bleu"] > 90


def test_a_stopped_mt_stage_resumes_where_it_stopped(prepared, tmp_path, monkeypatch):
  """Killed after update 3 (its checkpoint of update 2 kept), the rerun continues from update
  2 with the batch it would have seen next: the parameters equal an unbroken run's."""
  _, prepared_dir = prepared
  config = mt_config(prepared_dir, max_updates=6, dropout=0.1)
  dp = DataParallel("pmap")
  train.run_stage(config, "mt", str(tmp_path / "straight"), dp)

  class Killed(Exception):
    pass

  killed = []

  def kill_at_3(name, step):                  # once: the rerun passes update 3
    if (name, step) == ("mt.update", 3) and not killed:
      killed.append(step)
      raise Killed
  monkeypatch.setattr(faults, "fault_point", kill_at_3)
  with pytest.raises(Killed):
    train.run_stage(config, "mt", str(tmp_path / "broken"), dp)
  assert not (tmp_path / "broken" / "mt" / "DONE.json").exists()
  summary = train.run_stage(config, "mt", str(tmp_path / "broken"), dp)
  assert summary["updates"] == 6
  checksum = lambda run: params_checksum(ckpt_lib.StageCheckpoints(
      str(tmp_path / run / "mt" / "checkpoints")).params(6))
  assert checksum("broken") == checksum("straight")


def test_the_st_stage_starts_its_decoder_from_the_mt_stage(prepared, tmp_path):
  _, prepared_dir = prepared
  config = mt_config(prepared_dir)
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  assert list(results) == ["asr", "mt", "st"]
  summary = results["mt"]["train"]
  assert summary["updates"] == 4 and summary["best_step"] in (2, 4)
  assert 0 <= summary["best_dev_bleu"] <= 100
  with open(os.path.join(workdir, "mt", "DONE.json"), encoding="utf-8") as f:
    assert json.load(f) == summary
  mt, _ = transfer.read_mt_params(workdir)
  # ST init: every decoder tensor is the MT model's, the encoder stays as given.
  data = ip.SplitData(experiment.pipeline_config(config, "st"), "train")
  model = model_lib.S2TModel(experiment.model_config_for(config, data.vocab.size, None, "st"))
  fresh = model_lib.init_params(model, jax.random.PRNGKey(1))
  carried = transfer.carry_from_mt_stage(fresh, workdir, LOG)
  flat_mt = flax.traverse_util.flatten_dict(mt["decoder"], sep="/")
  flat = optimizer.flat_params(carried)
  assert len(flat_mt) == sum(n.startswith("decoder/") for n in flat) > 10
  for name, value in flat_mt.items():
    np.testing.assert_array_equal(flat[f"decoder/{name}"], value)
  for name, value in optimizer.flat_params(fresh).items():
    if not name.startswith("decoder/"):
      np.testing.assert_array_equal(flat[name], value)
  # A rerun finds the stage done and does not train it again.
  assert train.run_stage(config, "mt", workdir, DataParallel("pmap")) == summary
  # An MT model of another width does not fit: refused with the tensor and both shapes.
  bigger = mt_config(prepared_dir)
  bigger.model.d_model = 32
  model = model_lib.S2TModel(experiment.model_config_for(bigger, data.vocab.size, None, "st"))
  with pytest.raises(ValueError, match=r"does not fit the ST model:\n  decoder/.*MT model "
                                       r"\(.*\) vs ST \(.*32"):
    transfer.carry_from_mt_stage(model_lib.init_params(model, jax.random.PRNGKey(1)), workdir,
                                 LOG)
  with pytest.raises(FileNotFoundError, match="the MT stage did not finish"):
    transfer.carry_from_mt_stage(fresh, str(tmp_path / "elsewhere"), LOG)


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.st, "decoder_init", "text"), r"st.decoder_init='text'; valid: '' \| "
                                                      r"'mt'"),
    (lambda c: setattr(c.mt, "max_updates", 0), "st.decoder_init='mt' trains an MT stage: "
                                                "mt.max_updates=0 must be >= 1"),
    (lambda c: setattr(c.mt, "pairs", "en-fr"), r"mt.pairs='en-fr'; valid:  \(it trains on "
                                                r"the ST stage's pairs"),
    (lambda c: setattr(c.mt, "ctc_weight", 0.3), "mt.ctc_weight=0.3; valid: 0"),
    (lambda c: setattr(c.mt, "eval_every", 0), "mt.eval_every=0; valid"),
    (lambda c: setattr(c.model, "task_tag", "target_lang"), "without task-keyed stacks"),
])
def test_mt_stage_settings_that_cannot_work_are_refused_before_training(prepared, tmp_path,
                                                                        change, message):
  _, prepared_dir = prepared
  config = mt_config(prepared_dir)
  change(config)
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "mt")
