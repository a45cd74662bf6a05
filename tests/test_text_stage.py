"""The text stage (st.decoder_init="mt"): its pairs follow the ST batch's conventions, it
learns its pairs, and the ST stage starts its decoder from it."""

import json
import logging
import os

import flax
import jax
import numpy as np
import pytest

from multiformer_jax import experiment
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation.metrics import corpus_bleu
from multiformer_jax.model.stacked import text_layers_config
from multiformer_jax.training import text_stage, train
from multiformer_jax import model as model_lib
from multiformer_jax.training import optimizer
from multiformer_jax.training import transfer
from tests.test_train import tiny_config

LOG = logging.getLogger("test")


def text_config(prepared_dir, **mt):
  config = tiny_config(prepared_dir, max_updates=2, eval_every=2)
  config.st.decoder_init = "mt"
  config.st.ctc_weight = 0.3
  m = config.mt
  m.lr, m.lr_scheduler, m.warmup_updates = 3e-3, "polynomial_decay", 2
  m.max_updates, m.batch, m.eval_every, m.encoder_layers, m.dropout, m.beam = 4, 8, 2, 1, 0.0, 2
  m.update(mt)
  return config


def test_text_pairs_are_the_st_batchs_source_pieces_and_targets(prepared):
  """source = the transcript's ASR pieces + EOS (the ST batch's ctc_targets); prev and target
  = the ST batch's prev_tokens and targets, row for row."""
  _, prepared_dir = prepared
  config = text_config(prepared_dir)
  data = text_stage.split_data(config, "train")
  length = text_stage.pair_length(data, 128)
  assert length % 8 == 0
  assert length >= np.percentile(np.maximum(data.source_tokens.lengths, data.tokens.lengths), 99)
  pairs = text_stage.text_pairs(data, length)
  assert pairs.truncated == 0 and len(pairs) == len(data) > 20
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
        assert set(ours[i, width:]) <= {ip.vocab.PAD_ID}
  short = text_stage.text_pairs(data, 8)                 # sides cut to 7 pieces + EOS
  assert short.truncated == sum(max(s, t) > 7 for s, t in zip(data.source_tokens.lengths,
                                                               data.tokens.lengths))
  assert all(ip.vocab.EOS_ID in row for row in short.target)


def test_the_text_model_learns_its_pairs_and_translates_them_back(prepared):
  """Trained on the tiny corpus's training pairs, the beam search writes them back (BLEU near
  100, most sentences exactly); its dev perplexity is measured on schedule."""
  _, prepared_dir = prepared
  config = text_config(prepared_dir, max_updates=400, eval_every=200, lr=1e-2, batch=16)
  config.model.d_model, config.model.ffn_dim = 32, 64
  data = text_stage.split_data(config, "train")
  pairs = text_stage.text_pairs(data, text_stage.pair_length(data, 128))
  st_cfg = experiment.model_config_for(config, data.vocab.size, None, "st")
  trainer = text_stage.TextTrainer(
      config, text_layers_config(st_cfg, 1, 0.0), int(data.summary["vocab"]["asr"]["size"]),
      data.vocab, config.mt, beam=2)
  params, best, evaluations = text_stage.train_text_model(
      trainer, pairs, pairs, config.mt, jax.random.PRNGKey(0), 0, LOG)
  assert [e["update"] for e in evaluations] == [200, 400]
  assert best in (200, 400) and evaluations[-1]["dev_ppl"] < 1.5
  hypotheses = trainer.translations(params, pairs)
  exact = np.mean([h == r for h, r in zip(hypotheses, pairs.references)])
  assert exact >= 0.9, list(zip(hypotheses, pairs.references))[:5]
  assert corpus_bleu(hypotheses, pairs.references)["bleu"] > 90


def test_the_st_stage_starts_its_decoder_from_the_text_stage(prepared, tmp_path):
  _, prepared_dir = prepared
  config = text_config(prepared_dir)
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  summary = results["mt"]["train"]
  assert summary["updates"] == 4 and summary["best_step"] in (2, 4)
  assert summary["dev_bleu"] is not None and summary["pairs"]["train"] > 20
  with open(os.path.join(workdir, "mt", "DONE.json"), encoding="utf-8") as f:
    assert json.load(f) == summary
  with open(os.path.join(workdir, "mt", "log.jsonl"), encoding="utf-8") as f:
    assert [json.loads(line)["update"] for line in f] == [2, 4]
  with open(os.path.join(workdir, "mt", text_stage.PARAMS), "rb") as f:
    text = flax.serialization.msgpack_restore(f.read())
  # ST init: every decoder tensor is the text model's, the encoder stays as given.
  data = ip.SplitData(experiment.pipeline_config(config, "st"), "train")
  model = model_lib.S2TModel(experiment.model_config_for(config, data.vocab.size, None, "st"))
  fresh = model_lib.init_params(model, jax.random.PRNGKey(1))
  carried = transfer.carry_from_text_stage(fresh, workdir, LOG)
  flat_text = flax.traverse_util.flatten_dict(text["decoder"], sep="/")
  flat = optimizer.flat_params(carried)                                  # pylint: disable=protected-access
  assert len(flat_text) == sum(n.startswith("decoder/") for n in flat) > 10
  for name, value in flat_text.items():
    np.testing.assert_array_equal(flat[f"decoder/{name}"], value)
  for name, value in optimizer.flat_params(fresh).items():               # pylint: disable=protected-access
    if not name.startswith("decoder/"):
      np.testing.assert_array_equal(flat[name], value)
  # A rerun finds the stage done and does not train it again.
  again = text_stage.run_text_stage(config, workdir, LOG)
  assert again == summary
  # A text model of another width does not fit: refused with the tensor and both shapes.
  bigger = text_config(prepared_dir)
  bigger.model.d_model = 32
  model = model_lib.S2TModel(experiment.model_config_for(bigger, data.vocab.size, None, "st"))
  with pytest.raises(ValueError, match=r"does not fit the ST model:\n  decoder/.*text model "
                                       r"\(.*\) vs ST \(.*32"):
    transfer.carry_from_text_stage(model_lib.init_params(model, jax.random.PRNGKey(1)), workdir,
                                     LOG)
  with pytest.raises(FileNotFoundError, match="the text stage did not finish"):
    transfer.carry_from_text_stage(fresh, str(tmp_path / "elsewhere"), LOG)


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.st, "decoder_init", "text"), "st.decoder_init='text'; valid: ''"),
    (lambda c: setattr(c.mt, "max_updates", 0), "mt.max_updates=0 and mt.batch=8 must be >= 1"),
    (lambda c: setattr(c.model, "task_tag", "target_lang"), "without task-keyed stacks"),
])
def test_text_stage_settings_that_cannot_work_are_refused_before_training(prepared, tmp_path,
                                                                          change, message):
  _, prepared_dir = prepared
  config = text_config(prepared_dir)
  change(config)
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "mt")


def test_training_batches_put_each_pair_in_the_narrowest_width_that_holds_it():
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 61, 203)
  edges = text_stage.bucket_edges(lengths, 3, 64)
  assert edges[-1] == 64 and edges == sorted(edges) and all(e % 8 == 0 for e in edges)
  assert len(edges) == 3
  batches = text_stage.training_batches(lengths, edges, 16, np.random.default_rng(1))
  seen = []
  for _ in range(sum(-(-np.sum(np.searchsorted(edges, lengths) == b) // 16)
                     for b in range(3))):                 # one epoch's batches
    rows, width = next(batches)
    assert len(rows) == 16 and np.all(lengths[rows] <= width)
    narrower = [e for e in edges if e < width]
    assert not narrower or np.all(lengths[rows] > narrower[-1])
    seen += list(rows)
  assert set(seen) == set(range(203))                      # every pair once an epoch (+ fill)
  assert len(seen) - 203 < 3 * 16
