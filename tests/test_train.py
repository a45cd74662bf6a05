"""Training: the two stages end to end, exact resumption, the loss, the schedule, pmap == jit."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import flax
import jax
import ml_collections
import numpy as np
import pytest

from multiformer_jax import schema
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax import experiment
from multiformer_jax.training import train
from multiformer_jax.training import stage as stage_lib
from multiformer_jax import model as model_lib
from multiformer_jax.training import optimizer
from multiformer_jax.training import steps
from multiformer_common import token_ids
from multiformer_jax.training import transfer
from multiformer_jax.evaluation.metrics import corpus_wer, normalize_for_wer
from multiformer_jax.training.loss import label_smoothed_nll
from multiformer_jax.evaluation import inference
from multiformer_jax.evaluation import results as eval_results


def tiny_config(prepared_dir, **stage):
  config = schema.base_config()
  config.name = "tiny"
  m = config.model
  m.d_model, m.ffn_dim, m.conv_channels = 16, 32, 16
  m.encoder_layers, m.decoder_layers, m.decoder_heads = 2, 1, 2
  m.encoder_layout = "1x(2*local(5)+2*conv(3,2)) 1x(2*full+2*kernel(8))"
  d = config.data
  d.prepared_dir, d.test_split = prepared_dir, "dev"
  d.max_frames, d.num_buckets = 3000, 1
  for s in (config.asr, config.st):
    s.lr, s.warmup_updates, s.max_updates, s.eval_every, s.keep_last = 3e-3, 3, 8, 4, 2
    s.update_freq = 1
    s.update(stage)
  config.train.log_every = 2
  config.st.encoder_init = "latest"
  config.eval.beam, config.eval.max_len_b, config.eval.checkpoint = 2, 8, "latest"
  return config


def losses(stage_dir):
  with open(os.path.join(stage_dir, "log.jsonl"), encoding="utf-8") as f:
    return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def test_two_stage_run_end_to_end(prepared, tmp_path):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  config.st.eval_every = 1            # a checkpoint after ST update 1, whose lr is 0
  config.st.keep_last = 10
  config.eval.after_training = True
  config.eval.score_dev, config.eval.score_dev_beam = True, config.eval.beam
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  for stage in ("asr", "st"):
    curve = losses(os.path.join(workdir, stage))
    assert curve[-1] < curve[0], (stage, curve)
  # The dev score logged at the last evaluation is the evaluation's score of the last
  # checkpoint on the same split with the same search (other batch shapes: the search's
  # output does not depend on batching).
  from multiformer_jax.training import curves
  for stage, metric in (("asr", "wer"), ("st", "bleu")):
    _, dev_rows = curves.read_log(os.path.join(workdir, stage))
    assert all(f"dev_{metric}" in row for row in dev_rows)
    assert dev_rows[-1][f"dev_{metric}"] == results[stage]["eval"][metric]
    assert curves.dev_score_series(dev_rows)[0] == f"dev {metric.upper()}"
  assert set(results["asr"]["eval"]) >= {"wer", "edits", "words"}
  for stage in ("asr", "st"):   # each stage compiled its own steps, inside its wall time
    summary = results[stage]["train"]
    assert 0 < summary["compile_s"] <= summary["wall_s"]
    # DONE.json rounds both times to 0.1 s and the fraction (of the unrounded times) to 0.001:
    # the fraction lies between the ratios the rounding allows.
    compile_s, wall_s = summary["compile_s"], summary["wall_s"]
    assert ((compile_s - 0.05) / (wall_s + 0.05) - 5e-4 <= summary["compile_fraction"]
            <= (compile_s + 0.05) / (wall_s - 0.05) + 5e-4)
    assert set(summary["compile_phases_s"]) == {"trace", "lower", "compile"}
    assert summary["compile_s"] <= sum(summary["compile_phases_s"].values()) + 0.2
  assert "BLEU" in results["st"]["eval"]["detail"] and "signature" in results["st"]["eval"]
  assert os.path.exists(os.path.join(results["st"]["eval"]["directory"], "hyp.txt"))
  # fairseq's schedule gives update 1 a learning rate of 0, so the ST checkpoint of step 1
  # holds the initial ST parameters: its encoder is the ASR encoder, exactly.
  asr = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"))
  st = ckpt_lib.StageCheckpoints(os.path.join(workdir, "st", "checkpoints"))
  asr_encoder = asr.params(asr.latest())["encoder"]
  st_encoder = st.params(1)["encoder"]
  jax.tree_util.tree_map(np.testing.assert_array_equal, asr_encoder, st_encoder)
  # The results table of run.py / ablate.
  from multiformer_jax.training import results_table
  row = results_table.collect_row(workdir, "tiny")
  assert row["asr_wer"] == results["asr"]["eval"]["wer"]
  assert row["st_bleu"] == results["st"]["eval"]["bleu"] and row["status"] == "done"
  md_path, csv_path = results_table.write_table([row], workdir)
  with open(md_path, encoding="utf-8") as f:
    table = f.read()
  assert f"`{config.model.encoder_layout}`" in table
  assert row["reported_bleu"] == "" and " | — | — | " in table     # no paper figure: a dash
  # What a person sees: a learning curve per stage and examples of both stages side by side.
  for stage in ("asr", "st"):
    with open(os.path.join(workdir, stage, "learning_curve.png"), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  shown = curves.examples(workdir, "dev", config, 5)
  st_eval = eval_results.directory(workdir, "st", "dev",
                                   eval_results.search_settings(config, "st"))
  assert eval_results.find(workdir, "st", "dev", config) == st_eval
  with open(os.path.join(st_eval, "hyp.txt"), encoding="utf-8") as f:
    st_hyps = f.read().split("\n")[:-1]
  with open(os.path.join(st_eval, "ids.txt"), encoding="utf-8") as f:
    ids = f.read().split("\n")[:-1]
  assert len(shown) == 5 and len(ids) == len(st_hyps) == 15
  for example in shown:
    assert set(example) == {"id", "asr_ref", "asr_hyp", "st_ref", "st_hyp"}
    assert example["st_hyp"] == st_hyps[ids.index(example["id"])]
  assert shown[0]["id"] in curves.format_examples(shown)
  # n-best rescoring with a word LM at a negligible weight keeps the search's best hypotheses.
  from multiformer_jax.evaluation import scoring
  with open(os.path.join(results["asr"]["eval"]["directory"], "hyp.txt"),
            encoding="utf-8") as f:
    searched = f.read()
  rescored = scoring.evaluate_stage(config, workdir, "asr", "dev", progress=False,
                                     lm_weight=1e-9)
  assert rescored["lm"] == {"weight": 1e-9, "order": 3, "unigram": "wordfreq"}
  assert "word 3-gram LM" in rescored["search"]
  # Kept beside the first evaluation (other search settings), which stays the run's own.
  assert rescored["directory"] != results["asr"]["eval"]["directory"]
  assert eval_results.find(workdir, "asr", "dev", config) == \
      results["asr"]["eval"]["directory"]
  with open(os.path.join(rescored["directory"], "hyp.txt"), encoding="utf-8") as f:
    assert f.read() == searched
  with open(csv_path, encoding="utf-8") as f:
    assert f.read().startswith(",".join(results_table.COLUMNS))
  # Rerunning the command skips the finished stages.
  again = train.train_and_evaluate(tiny_config(prepared_dir), workdir)
  assert again["st"]["train"] == results["st"]["train"]


def test_interrupted_run_resumes_to_the_same_parameters(prepared, tmp_path):
  _, prepared_dir = prepared
  whole = tiny_config(prepared_dir, max_updates=6, eval_every=3)
  whole.train.stages = ("asr",)
  train.train_and_evaluate(whole, str(tmp_path / "whole"))
  cut = tiny_config(prepared_dir, max_updates=3, eval_every=3)
  cut.train.stages = ("asr",)
  train.train_and_evaluate(cut, str(tmp_path / "cut"))
  os.remove(tmp_path / "cut" / "asr" / train.DONE)     # as if killed after the checkpoint
  train.train_and_evaluate(whole, str(tmp_path / "cut"))
  a = ckpt_lib.StageCheckpoints(str(tmp_path / "whole" / "asr" / "checkpoints"))
  b = ckpt_lib.StageCheckpoints(str(tmp_path / "cut" / "asr" / "checkpoints"))
  state_a, meta_a = a.restore(6)
  state_b, meta_b = b.restore(6)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state_a, state_b)
  assert meta_a["iterator"] == meta_b["iterator"]


def test_label_smoothing_matches_the_formula():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
  targets = np.array([[4, 5, 1], [2, 1, 1]])
  eps = 0.1
  loss, nll, tokens = label_smoothed_nll(logits, targets, eps, pad_id=1)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected_loss = expected_nll = 0.0
  for b, u in [(0, 0), (0, 1), (1, 0)]:
    t = targets[b, u]
    eps_i = eps / (7 - 1)
    expected_nll += -logp[b, u, t]
    expected_loss += (1 - eps - eps_i) * -logp[b, u, t] + eps_i * -logp[b, u].sum()
  np.testing.assert_allclose([loss, nll, tokens], [expected_loss, expected_nll, 3], rtol=1e-5)


def test_inverse_sqrt_schedule():
  schedule = optimizer.inverse_sqrt_schedule(2e-3, 100)
  np.testing.assert_allclose([schedule(0), schedule(50), schedule(100), schedule(400)],
                             [0.0, 1e-3, 2e-3, 1e-3], rtol=1e-6)


def test_around_best_keeps_its_own_checkpoints_whatever_keep_last(tmp_path):
  """The stage keeps that many around the best, whatever keep_last, where evaluation or (for
  the ASR stage) the ST encoder init selects by it."""
  config = tiny_config(str(tmp_path / "unprepared"))
  config.eval.checkpoint, config.st.encoder_init = "latest", "around_best"
  config.eval.average_around_best = 5
  schema.check(config)
  assert stage_lib.kept_around_best(config, "asr") == 5 and stage_lib.kept_around_best(config, "st") == 1
  config.eval.checkpoint = "around_best"
  assert stage_lib.kept_around_best(config, "st") == 5


def test_repeat_blocking_applies_to_the_stages_named():
  config = tiny_config("unused")
  config.eval.no_repeat_ngram_size, config.eval.no_repeat_ngram_stages = 4, ("st",)
  assert [inference.no_repeat_ngram_size(config.eval, s) for s in ("asr", "st")] == [0, 4]


def test_polynomial_decay_schedule_is_fairseqs():
  """Against fairseq's PolynomialDecayLRSchedule.step_update, transcribed."""
  def fairseq_lr(num_updates, lr=3e-3, warmup=100, total=1000, power=1.0, end=0.0):
    if warmup > 0 and num_updates <= warmup:
      return num_updates / float(warmup) * lr
    if num_updates >= total:
      return end
    pct_remaining = 1 - (num_updates - warmup) / (total - warmup)
    return (lr - end) * pct_remaining ** power + end
  schedule = optimizer.polynomial_decay_schedule(3e-3, 100, 1000)
  for u in (0, 1, 50, 100, 101, 550, 999, 1000, 1500):
    np.testing.assert_allclose(schedule(u), fairseq_lr(u), rtol=1e-4, atol=1e-12)  # float32
  stage = {"lr": 3e-3, "warmup_updates": 100, "max_updates": 1000, "lr_scheduler": "cosine"}
  with pytest.raises(ValueError, match="valid: inverse_sqrt, polynomial_decay"):
    optimizer.make_schedule(ml_collections.ConfigDict(stage))


def test_wer_normalisation():
  assert normalize_for_wer("Hello, World! -- It's  fine.") == ["hello", "world", "it's", "fine"]
  result = corpus_wer(["hello world", "a b c", ""], ["Hello, world!", "a x c d", "two words"])
  assert (result["edits"], result["words"]) == (0 + 2 + 2, 2 + 4 + 2)
  assert result["wer"] == 50.0


def test_evaluating_without_a_saved_config_says_what_to_do(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json not found.*--workdir"):
    schema.load_config(str(tmp_path))


def devices_flag(count):
  """XLA_FLAGS for `count` CPU devices, keeping the flags the suite runs with (conftest.py)."""
  return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"


PMAP_VS_JIT = textwrap.dedent("""
    import os, re, sys
    sys.path.insert(0, os.getcwd())
    import jax, jax.numpy as jnp, numpy as np
    from multiformer_jax.training import optimizer, steps
    from multiformer_jax.training.parallel import DataParallel
    from tests.test_train import tiny_update_setup
    config, model, batch = tiny_update_setup()
    tx, schedule = optimizer.make_optimizer(config.train, config.asr)
    compiled = []                  # XLA compilations (or persistent-cache reads) from here on
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, **__: compiled.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    results = {}
    for mode in ("pmap", "jit"):
      dp = DataParallel(mode)
      state = steps.create_state(model, tx, jax.random.PRNGKey(0))
      initial = jax.device_get(state.params)                       # the step donates state
      step, _ = steps.make_steps(model, tx, schedule, dp, 0.1)
      before = len(compiled)
      new = dp.replicate(state)
      assert len(compiled) == before, (mode, compiled[before:])     # copies, no program
      for leaf, value in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(state)):
        copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        if mode == "pmap":                  # one copy per device on a leading device axis
          assert leaf.shape == (2,) + value.shape and len(copies) == 2
          copies = [c[0] for c in copies]
        assert all(np.array_equal(c, np.asarray(value)) for c in copies)
      for _ in range(2):
        new, metrics = step(new, dp.shard(batch), True, True)
      results[mode] = dp.unreplicate(new.params)
      print(mode, dp.scalar(metrics["loss"]), flush=True)
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b: float(np.abs(a - b).max()), results["pmap"], results["jit"]))
    moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b: float(np.abs(a - b).max()), results["pmap"], initial))
    print("devices", jax.device_count(), "max diff", max(diffs), "moved", max(moved))
    assert jax.device_count() == 2 and max(diffs) < 1e-6 and max(moved) > 1e-5

    # Updates of two micro-batches of different shapes: each device accumulates its own
    # gradients (jit: an accumulator sharded over the devices), all-reduced once, in apply.
    second = {k: v[[1, 2, 3, 1]] for k, v in batch.items()}
    second["features"] = second["features"][:, :17]
    second["weights"] = np.array([1, 1, 0, 1], np.float32)
    accumulated, reduced = {}, {}
    for mode in ("pmap", "jit"):
      dp = DataParallel(mode)
      step, _ = steps.make_steps(model, tx, schedule, dp, 0.1)
      state = dp.replicate(steps.create_state(model, tx, jax.random.PRNGKey(0)))
      for _ in range(2):
        state, _ = step(state, dp.shard(batch), False, True)
        state, metrics = step(state, dp.shard(second), True, False)
      accumulated[mode] = dp.unreplicate(state.params)
      assert dp.scalar(state.step) == 2
      programs = step.programs([dp.batch_spec({k: (v.shape, v.dtype) for k, v in
                                                batch.items()})], 2, state.params)
      texts = {p.name: p.function.lower(state, *specs).compile().as_text()
               for p, specs in programs}
      # The all-reduces of each program and the most elements one of them reduces.
      sizes = {name: [max([1] + [int(np.prod([int(d) for d in dims.split(",") if d]))
                                 for dims in re.findall(r"\[([\d,]*)\]", line.split("=")[1]
                                                        .split("all-reduce")[0])])
                      for line in text.splitlines() if " all-reduce(" in line]
               for name, text in texts.items()}
      reduced[mode] = {name: max(s, default=0) for name, s in sizes.items()}
    print("accumulated", reduced)
    diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b: float(np.abs(a - b).max()), accumulated["pmap"], accumulated["jit"]))
    assert max(diffs) < 1e-6, max(diffs)
    biggest = max(np.size(x) for x in jax.tree_util.tree_leaves(accumulated["jit"]))
    for mode, largest in reduced.items():
      assert largest["accumulate"] <= 16, (mode, largest)     # scalar sums only, no gradients
      assert largest["apply"] == biggest, (mode, largest)     # the gradients, once per update
""")


def test_pmap_and_jit_give_the_same_update_on_two_devices():
  """One micro-batch per update and two: the same parameters under pmap and jit; with two,
  the gradients are all-reduced only in the update's last program (apply), never per
  micro-batch. Replicating the state copies it onto each device and compiles nothing."""
  result = subprocess.run([sys.executable, "-c", PMAP_VS_JIT], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          env={**os.environ, "XLA_FLAGS": devices_flag(2)}, timeout=600,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert "devices 2" in result.stdout


def tiny_update_setup():
  """(config, model, batch) of a one-layer model with every head kind, dropout off, and a batch
  of 4 (the last row weighted 0); warmup 1, so the 2nd update has the peak learning rate."""
  from multiformer_jax import build_model
  config = schema.base_config()
  m = config.model
  m.vocab_size, m.input_dim, m.d_model, m.ffn_dim, m.conv_channels = 11, 8, 16, 24, 8
  m.encoder_layers, m.decoder_layers, m.decoder_heads = 1, 1, 2
  m.encoder_layout = "1x(1*full+1*local(3)+1*conv(3,2)+1*kernel(8))"
  m.dropout = m.attention_dropout = m.activation_dropout = 0.0
  config.asr.warmup_updates = 1
  rng = np.random.default_rng(0)
  batch = {"features": rng.normal(size=(4, 20, 8)).astype(np.float32),
           "lengths": np.array([20, 13, 17, 6], np.int32),
           "prev_tokens": rng.integers(3, 11, size=(4, 5)).astype(np.int32),
           "targets": rng.integers(3, 11, size=(4, 5)).astype(np.int32),
           "weights": np.array([1, 1, 1, 0], np.float32)}
  return config, build_model(config), batch


def test_frozen_parameters_stay_fixed_and_their_backward_is_not_computed():
  """{stage}.frozen=encoder/subsample: the subsampler keeps its values, the rest gets the update
  it gets when the subsampler's gradients are computed and thrown away, and the step no longer
  holds the subsampler's backward convolutions (two kernels and one input gradient)."""
  from multiformer_jax.training.parallel import DataParallel
  config, model, batch = tiny_update_setup()
  config.asr.frozen = "encoder/subsample"
  tx, schedule = optimizer.make_optimizer(config.train, config.asr)    # zeroes their gradients
  flat = lambda params: flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  initial = flat(steps.create_state(model, tx, jax.random.PRNGKey(0)).params)
  after, convolutions = {}, {}
  for name, trained in (("computed", None), ("skipped", optimizer.trained_predicate(config.asr))):
    step, _ = steps.make_steps(model, tx, schedule, DataParallel("jit"), 0.1, trained=trained)
    state = steps.create_state(model, tx, jax.random.PRNGKey(0))
    convolutions[name] = step.single.function.lower(state, batch).as_text().count(
        "stablehlo.convolution")
    for _ in range(2):
      state, _ = step(state, batch, True, True)
    after[name] = flat(state.params)
  subsampler = [n for n in initial if n.startswith("encoder/subsample/")]
  assert len(subsampler) == 4 and len(config.model.conv_kernels) == 2
  for name, value in initial.items():
    for run in after.values():
      if name in subsampler:
        np.testing.assert_array_equal(run[name], value, err_msg=name)
    np.testing.assert_allclose(after["skipped"][name], after["computed"][name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
  assert max(float(np.abs(after["skipped"][n] - initial[n]).max())
             for n in initial if n not in subsampler) > 1e-4
  assert convolutions == {"computed": 5, "skipped": 2}, convolutions
  assert not optimizer.trained_predicate(config.asr)("encoder/subsample/conv_layers_0/kernel")
  assert optimizer.trained_predicate(config.asr)("encoder/layers_0/fc1/kernel")


def test_frozen_must_name_a_parameter_and_leave_one_to_train():
  config, model, _ = tiny_update_setup()
  params = model_lib.init_params(model, jax.random.PRNGKey(0))
  config.asr.frozen = "encoder/subsampler"
  with pytest.raises(ValueError, match=r"asr.frozen='encoder/subsampler' names no parameter of "
                                       r"this model; its parameters are under: .*encoder/subsample"):
    optimizer.trained_values(params, config.asr, "asr")
  config.asr.frozen = "encoder,decoder,ctc"
  with pytest.raises(ValueError, match=r"leave no parameter to train"):
    optimizer.trained_values(params, config.asr, "asr")
  config.asr.frozen = "encoder/subsample"
  trained, total = optimizer.trained_values(params, config.asr, "asr")
  subsampler = sum(v.size for v in jax.tree_util.tree_leaves(params["encoder"]["subsample"]))
  assert trained == total - subsampler


def test_accumulated_micro_batches_give_the_update_of_their_union():
  """update_freq 2 (the first micro-batch, then the last) sums the gradients of one update on
  both halves at once; starting an update with first_micro skips reading the zero accumulator
  and gives the slow path's update bit for bit. Under pmap, whose accumulator is the state's
  grad_acc (jit's lives outside the state: test_pmap_and_jit_give_the_same_update_on_two_devices
  holds it to pmap's)."""
  from multiformer_jax.training.parallel import DataParallel
  config, model, batch = tiny_update_setup()
  tx, schedule = optimizer.make_optimizer(config.train, config.asr)
  dp = DataParallel("pmap")
  step, _ = steps.make_steps(model, tx, schedule, dp, 0.1)
  initial = steps.create_state(model, tx, jax.random.PRNGKey(0))
  initial_params = jax.device_get(initial.params)
  initial, _ = step(dp.replicate(initial), dp.shard(batch), True, True)   # lr 0: moments only
  start = dp.unreplicate(initial)
  fresh = lambda: dp.replicate(start)                  # the step donates the state
  run = lambda state, b, apply_update, first: step(state, dp.shard(b), apply_update, first)[0]
  halves = [{k: v[rows] for k, v in batch.items()} for rows in (slice(0, 2), slice(2, 4))]
  tokens = lambda b: float(np.sum((b["targets"] != token_ids.PAD_ID) & (b["weights"][:, None] > 0)))

  whole_sums = dp.unreplicate(run(fresh(), batch, False, True))
  split_sums = run(fresh(), halves[0], False, True)
  assert float(dp.unreplicate(split_sums).acc_tokens) == tokens(halves[0])
  split_sums = dp.unreplicate(run(split_sums, halves[1], False, False))
  assert float(split_sums.acc_tokens) == float(whole_sums.acc_tokens) == tokens(batch)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         split_sums.grad_acc, whole_sums.grad_acc)

  whole = dp.unreplicate(run(fresh(), batch, True, True))
  slow = dp.unreplicate(run(fresh(), batch, True, False))     # reads and re-zeroes grad_acc
  split = dp.unreplicate(run(run(fresh(), halves[0], False, True), halves[1], True, False))
  for got in (whole, slow, split):
    assert int(got.step) == 2 and float(got.acc_tokens) == 0.0
    jax.tree_util.tree_map(lambda a: np.testing.assert_array_equal(a, 0.0), got.grad_acc)
  jax.tree_util.tree_map(np.testing.assert_array_equal, slow.params, whole.params)
  jax.tree_util.tree_map(np.testing.assert_array_equal, slow.opt_state, whole.opt_state)
  # Adam's moments are the gradients' running (squared) means, so the split update consumed the
  # summed gradients iff its moments match (its parameters amplify rounding: Adam scales a
  # near-zero gradient's step up to about the learning rate).
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8),
                         split.opt_state, whole.opt_state)
  lr = config.asr.lr
  moved = max(float(np.abs(a - b).max()) for a, b in zip(
      jax.tree_util.tree_leaves(whole.params), jax.tree_util.tree_leaves(initial_params)))
  assert moved > 0.5 * lr


def _brute_force_ctc(log_probs, labels, blank=0):
  """-log of the summed probability of every frame labelling that collapses to `labels`."""
  import itertools
  frames, vocab = log_probs.shape
  total = 0.0
  for path in itertools.product(range(vocab), repeat=frames):
    collapsed = [t for i, t in enumerate(path) if t != blank and (i == 0 or path[i - 1] != t)]
    if collapsed == list(labels):
      total += np.exp(sum(log_probs[i, t] for i, t in enumerate(path)))
  return -np.log(total)


def test_ctc_loss_is_the_sum_over_alignments():
  import jax.numpy as jnp
  from multiformer_jax.training.loss import ctc_loss_sum
  rng = np.random.default_rng(7)
  vocab, frames = 5, 5
  logits = rng.normal(size=(3, frames, vocab)).astype(np.float32)
  # targets: tokens + EOS (2), pad (1) after; blank = <s> (0); a repeat in the second
  targets = np.array([[4, 3, 2, 1], [3, 3, 2, 1], [4, 3, 4, 2]])
  lengths = np.array([5, 4, 5])
  mask = np.arange(frames)[None, :] < lengths[:, None]
  weights = np.array([1.0, 1.0, 0.0])                  # the third is a padding example
  loss, counted = ctc_loss_sum(jnp.asarray(logits), jnp.asarray(mask), jnp.asarray(targets),
                               jnp.asarray(weights))
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected = _brute_force_ctc(log_probs[0, :5], [4, 3]) + \
      _brute_force_ctc(log_probs[1, :4], [3, 3])
  np.testing.assert_allclose(float(loss), expected, rtol=1e-4)
  assert float(counted) == 2
  # Too few frames for the labels (3 3 needs 3 frames with the blank between): not counted.
  short = np.arange(frames)[None, :] < np.array([[5], [2], [5]])
  _, counted = ctc_loss_sum(jnp.asarray(logits), jnp.asarray(short[:, :]), jnp.asarray(targets),
                            jnp.asarray(weights))
  assert float(counted) == 1


def test_hybrid_ctc_loss_trains_a_ctc_head_of_the_stage_that_sets_its_weight():
  from multiformer_jax.training.parallel import DataParallel
  config, model, batch = tiny_update_setup()
  config.asr.ctc_weight = 0.3
  ctc_model = model_lib.S2TModel(experiment.model_config_for(config, model.config.vocab_size,
                                                    stage="asr"))
  assert ctc_model.config.ctc_head and ctc_model.config.ctc_scores_output
  assert not experiment.model_config_for(config, model.config.vocab_size, stage="st").ctc_head
  tx, schedule = optimizer.make_optimizer(config.train, config.asr)
  dp = DataParallel("jit")
  step, _ = steps.make_steps(ctc_model, tx, schedule, dp, 0.1, config.train, 0.3)
  state = steps.create_state(ctc_model, tx, jax.random.PRNGKey(0))
  assert "ctc_proj" in state.params
  state, metrics = step(state, dp.shard(batch), True, True)
  assert np.isfinite(float(metrics["ctc"])) and float(metrics["ctc"]) > 0
  config.st.ctc_weight = 1.0
  with pytest.raises(ValueError, match="st.ctc_weight=1.0; valid: 0 <= weight < 1"):
    experiment.model_config_for(config, 40, stage="st")


def test_st_stage_ctc_spells_the_source_transcript_in_the_asr_vocabulary(prepared, tmp_path):
  """st.ctc_weight: ST batches carry the source transcript's ASR pieces; the CTC head has the
  ASR vocabulary's size, starts from the ASR stage's head, is trained on those pieces (not on
  the translation) and never joins the translation's beam search."""
  from data_prep import index_io, vocab
  from multiformer_jax import experiment
  from multiformer_jax.evaluation import inference
  from multiformer_jax.training.loss import ctc_loss_sum
  from multiformer_jax.training.parallel import DataParallel
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, max_updates=2, eval_every=2)
  config.asr.ctc_weight = config.st.ctc_weight = 0.3
  config.eval.ctc_weight, config.eval.after_training = 0.2, True
  with open(os.path.join(prepared_dir, "prepared.json"), encoding="utf-8") as f:
    sizes = {task: v["size"] for task, v in json.load(f)["vocab"].items()}
  st_cfg = experiment.model_config_for(config, sizes["st"], stage="st")
  assert st_cfg.ctc_head and st_cfg.ctc_size == st_cfg.ctc_vocab_size == sizes["asr"]
  assert not st_cfg.ctc_scores_output
  assert inference.joint_ctc_weight(model_lib.S2TModel(st_cfg), config.eval) == 0.0

  # The batch: targets are the translation, ctc_targets the transcript's ASR pieces + EOS.
  data = ip.SplitData(experiment.pipeline_config(config, "st"), "train")
  asr_vocab = vocab.Vocabulary(os.path.join(prepared_dir, "spm_asr.model"))
  batcher = ip.Batcher(data, train=False)
  bucket, indices = batcher.epoch_plan(0)[0]
  batch = batcher.assemble(bucket, indices, 0)
  index = index_io.load(os.path.join(prepared_dir, "index", "train.npz"))
  for row, i in enumerate(batch["index"]):
    if i < 0:
      continue
    pieces = asr_vocab.encode(str(index["source_text"][data.rows[i]])) + [vocab.EOS_ID]
    assert list(batch["ctc_targets"][row, :len(pieces)]) == pieces
    assert set(batch["ctc_targets"][row, len(pieces):]) <= {vocab.PAD_ID}
  assert "ctc_targets" not in ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr"),
                                                      "train"), train=False).assemble(
      bucket, indices, 0)

  # The loss is the CTC of the transcript pieces.
  model = model_lib.S2TModel(st_cfg)
  tx, schedule = optimizer.make_optimizer(config.train, config.st)
  dp = DataParallel("jit")
  _, eval_step = steps.make_steps(model, tx, schedule, dp, 0.1, config.train, 0.3)
  state = steps.create_state(model, tx, jax.random.PRNGKey(0))
  sums = eval_step(state, dp.shard(batch))
  _, sown = model.apply({"params": state.params}, batch["features"], batch["lengths"],
                        batch["prev_tokens"], True, mutable=["ctc"])
  logits, mask = sown["ctc"]["logits"][0]
  expected, _ = ctc_loss_sum(logits, mask, batch["ctc_targets"], batch["weights"])
  np.testing.assert_allclose(float(sums["ctc"]), float(expected), rtol=1e-5)

  # Both stages train and evaluate; the ST head starts as the ASR stage's.
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  assert "bleu" in results["st"]["eval"]
  with open(os.path.join(workdir, "st", "log.jsonl"), encoding="utf-8") as f:
    assert any("ctc" in json.loads(line) for line in f)
  asr_params = ckpt_lib.StageCheckpoints(os.path.join(workdir, "asr", "checkpoints"))
  asr_params = asr_params.params(asr_params.latest())
  fresh = model_lib.init_params(model, jax.random.PRNGKey(1))
  carried = transfer.carry_from_asr(fresh, asr_params, logging.getLogger("test"))
  np.testing.assert_array_equal(carried["ctc_proj"]["kernel"], asr_params["ctc_proj"]["kernel"])
  no_head = {k: v for k, v in asr_params.items() if k != "ctc_proj"}
  carried = transfer.carry_from_asr(fresh, no_head, logging.getLogger("test"))
  np.testing.assert_array_equal(carried["ctc_proj"]["kernel"], fresh["ctc_proj"]["kernel"])


def test_early_stopping_ends_a_stage_after_patience_evaluations(prepared, tmp_path):
  """lr 0: the dev loss never improves on the first evaluation's (update 2), so patience 1
  stops the stage at the next evaluation (update 4) of 8; the summary says so."""
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, lr=0.0, max_updates=8, eval_every=2, keep_last=4)
  config.train.stages = ("asr",)
  config.train.early_stop_patience = 1
  summary = train.train_and_evaluate(config, str(tmp_path))["asr"]["train"]
  assert (summary["updates"], summary["early_stopped"], summary["best_step"]) == (4, True, 2)
  config.train.early_stop_patience = 0                 # off: to max_updates
  summary = train.train_and_evaluate(config, str(tmp_path / "off"))["asr"]["train"]
  assert (summary["updates"], summary["early_stopped"]) == (8, False)


def test_eval_every_minus_one_evaluates_once_per_epoch(prepared):
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir)
  batcher = ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr"), "train"), True)
  batches = len(batcher.epoch_plan(0))
  config.asr.eval_every, config.asr.update_freq = -1, 2
  assert train.resolved_eval_every(config.asr, batcher, 2) == max(1, batches // 2)
  config.asr.eval_every = 0
  with pytest.raises(ValueError, match=r"eval_every=0; valid: a number of updates >= 1, or -1"):
    train.train_and_evaluate(config, "/nonexistent/run")


def test_two_step_training_freezes_all_but_the_named_parameters(prepared, tmp_path):
  """The adapter baseline's second step: a trained run's parameters initialise a model with
  adapters, and only the adapters train (the rest stay bit-equal to the first run's)."""
  _, prepared_dir = prepared
  first = tiny_config(prepared_dir, max_updates=4, eval_every=4)
  first.train.stages = ("asr",)
  train.train_and_evaluate(first, str(tmp_path / "first"))
  second = tiny_config(prepared_dir, max_updates=4, eval_every=4,
                       init_from=str(tmp_path / "first"), train_only="adapters_")
  second.train.stages = ("asr",)
  second.model.adapter_dim = 4
  train.train_and_evaluate(second, str(tmp_path / "second"))
  import flax  # pylint: disable=import-outside-toplevel
  flat = lambda run: flax.traverse_util.flatten_dict(dict(ckpt_lib.StageCheckpoints(
      str(tmp_path / run / "asr" / "checkpoints")).params(4)), sep="/")
  before, after = flat("first"), flat("second")
  adapters = [n for n in after if "adapters_" in n]
  assert adapters and set(after) - set(adapters) == set(before)
  for name, value in before.items():
    np.testing.assert_array_equal(after[name], value, err_msg=name)
  assert all(np.abs(after[n]).sum() > 0 for n in adapters if n.endswith("/up"))  # from zeros
  second.asr.train_only = "adaptor"
  with pytest.raises(ValueError, match=r"asr.train_only='adaptor' names no parameter of this "
                                       r"model; its parameters are under: .*encoder/adapters_0"):
    train.train_and_evaluate(second, str(tmp_path / "third"))
  second.asr.init_from = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="asr.init_from=.*nowhere.*no .*asr/checkpoints"):
    train.train_and_evaluate(second, str(tmp_path / "fourth"))


@pytest.mark.parametrize("parallel", ["pmap", "jit"])
def test_every_program_is_compiled_before_the_first_update(prepared, tmp_path, caplog,
                                                           parallel):
  """An update of two micro-batches: each training batch shape's accumulate, one apply (and
  under jit the accumulator's zeros) and each dev shape's loss, compiled ahead and counted;
  no call compiles one on first use."""
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, max_updates=3, eval_every=3, update_freq=2)
  config.train.stages = ("asr",)
  config.train.parallel = parallel
  config.data.num_buckets = 2
  train_batcher = ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr"), "train"),
                             True)
  dev_batcher = ip.Batcher(ip.SplitData(experiment.pipeline_config(config, "asr", "dev"),
                                        "dev"), False)
  expected = len(train_batcher.buckets) + 1 + len(dev_batcher.buckets) + (parallel == "jit")
  log = logging.getLogger("multiformer_jax")      # it does not propagate (train_log.py)
  log.addHandler(caplog.handler)
  try:
    with caplog.at_level(logging.INFO, logger="multiformer_jax"):
      train.train_and_evaluate(config, str(tmp_path))
  finally:
    log.removeHandler(caplog.handler)
  assert f"compiling {expected} programs before the first update" in caplog.text
  assert f"{expected} programs compiled in" in caplog.text
  assert "not compiled ahead" not in caplog.text
