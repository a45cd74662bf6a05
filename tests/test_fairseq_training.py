"""Training here is fairseq's, update for update: from fairseq's weights, on fairseq's batches,
this toolkit's train step, optimizer and schedule give the learning rate, loss, nll, sample
size and gradient norm of every update that fairseq 0.12.2's own Trainer logged, and its
parameters after them; the ST stage's encoder carried from the ASR model and the averaged
checkpoint are fairseq's bit for bit.

The fixture was produced by fairseq itself (tests/fixtures/make_fairseq_training_fixture.py:
the speech_to_text task, label_smoothed_cross_entropy 0.1, fairseq's Adam, inverse_sqrt with
a warm-up of 8, clip-norm 1.2, update_freq 2, a tiny s2t_transformer random in every
parameter, dropout 0). Tolerances are float32's over 30 updates of two different programs
(torch against XLA): per-update figures to 2e-6 relative, parameters to 1e-5 relative plus
1e-6 absolute, except a key projection's bias, whose gradient is zero in exact arithmetic
(the softmax does not change when every score of a query moves by the same amount), so that
what Adam makes of it is rounding noise on both sides (fairseq moves it by under 2e-4 in
30 updates); it is compared to 5e-4 absolute.

The one deliberate difference: this subsampler zeroes padded frames between its convolutions
(model.subsampler_masks_padding, on by default) where fairseq does not, so that an
utterance's output does not depend on its batch-mates. With it off every figure is fairseq's;
with it on, the updates of unpadded micro-batches still are, and those with padding are not.
"""

import json
import logging
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from multiformer_jax import build_model
from multiformer_jax.fairseq_checkpoints.checkpoint import convert_state_dict, model_config_from_fairseq
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.training import steps as steps_lib
from multiformer_jax.training import transfer
from multiformer_jax.training.optimizer import clip_grad_norm, flat_params, make_optimizer
from multiformer_jax.training.parallel import DataParallel

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "fairseq_training.npz")
RTOL_FIGURES = 2e-6
RTOL_PARAMS, ATOL_PARAMS = 1e-5, 1e-6
ZERO_GRADIENT = "k_proj/bias"          # compared to ATOL_ZERO_GRADIENT only
ATOL_ZERO_GRADIENT = 5e-4


@pytest.fixture(scope="module")
def fixture():
  return dict(np.load(FIXTURE))


def state_dict(data, prefix):
  return {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}


def model_args(flags: list, state) -> dict:
  """fairseq's model args from its command-line flags, as a checkpoint has them."""
  args = {flag[2:].replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}
  args["input_feat_per_channel"] = state["encoder.subsample.conv_layers.0.weight"].shape[1]
  return args


def our_trainer(init: dict, flags: list, masks_padding: bool, parallel: str = "jit", *,
                lr: float, warmup: int, clip_norm: float, betas, eps: float,
                label_smoothing: float):
  """This toolkit's model, TrainStep and state for fairseq's weights `init` (a state dict of
  the s2t_transformer its command-line `flags` build) under fairseq's recipe flags; the
  optimizer and schedule are the ones every stage builds (make_optimizer)."""
  config = model_config_from_fairseq(model_args(flags, init), init,
                                     subsampler_masks_padding=masks_padding)
  model = build_model(config)
  train_cfg = ml_collections.ConfigDict(dict(
      clip_norm=clip_norm, adam_b1=float(betas[0]), adam_b2=float(betas[1]), adam_eps=eps,
      selection_lr_multiplier=1.0))
  stage_cfg = ml_collections.ConfigDict(dict(
      lr=lr, lr_scheduler="inverse_sqrt", warmup_updates=warmup, max_updates=10 ** 6,
      train_only="", frozen=""))
  tx, schedule = make_optimizer(train_cfg, stage_cfg)
  dp = DataParallel(parallel)
  train_step, _ = steps_lib.make_steps(model, tx, schedule, dp, label_smoothing)
  params = jax.tree_util.tree_map(jnp.asarray, convert_state_dict(init, config))
  state = steps_lib.create_state(model, tx, jax.random.PRNGKey(0))
  state = state.replace(params=params, opt_state=tx.init(params))
  return train_step, dp, dp.replicate(state), config


def setup(data, run, masks_padding, parallel="jit", init=None):
  """our_trainer for the fixture's run `run` ('asr', 'unpadded', 'st')."""
  if init is None:
    init = state_dict(data, f"{'st' if run == 'st' else 'asr'}/init/")
  return our_trainer(init, json.loads(str(data["model_args"])), masks_padding, parallel,
                     lr=float(data["lr_st" if run == "st" else "lr_asr"]),
                     warmup=int(data["warmup_updates"]), clip_norm=float(data["clip_norm"]),
                     betas=data["adam_betas"], eps=float(data["adam_eps"]),
                     label_smoothing=float(data["label_smoothing"]))


def our_batch(batch) -> dict:
  return {"features": batch["features"], "lengths": batch["lengths"].astype(np.int32),
          "prev_tokens": batch["prev"].astype(np.int32),
          "targets": batch["target"].astype(np.int32),
          "weights": np.ones(len(batch["lengths"]), np.float32)}


def fixture_batches(data, run):
  count = len({k.split("/")[1] for k in data if k.startswith(f"{run}/batch_")})
  return [our_batch(state_dict(data, f"{run}/batch_{i}/")) for i in range(count)]


def train(data, run, masks_padding, parallel="jit", init=None, updates=None):
  """Our updates over the fixture's schedule -> (per-update figures, {update: params})."""
  train_step, dp, state, config = setup(data, run, masks_padding, parallel, init)
  rows, kept = run_updates(train_step, dp, state, fixture_batches(data, run),
                           data[f"{run}/schedule"][:updates])
  return rows, kept, config


def run_updates(train_step, dp, state, batches, schedule, keep=True):
  """Updates of `schedule` (update -> micro-batch indices) -> (per-update figures as fairseq
  logs them, {update: params} with `keep`)."""
  rows = {k: [] for k in ("lr", "loss", "nll", "sample_size", "grad_norm")}
  kept = {}
  for update, indices in enumerate(schedule, start=1):
    loss = nll = tokens = 0.0
    for i, index in enumerate(indices):
      state, sums = train_step(state, dp.shard(batches[index]),
                               apply_update=i == len(indices) - 1, first_micro=i == 0)
      loss += dp.scalar(sums["loss"])
      nll += dp.scalar(sums["nll"])
      tokens += dp.scalar(sums["tokens"])
    for key, value in (("lr", dp.scalar(sums["lr"])), ("loss", loss), ("nll", nll),
                       ("sample_size", tokens), ("grad_norm", dp.scalar(sums["grad_norm"]))):
      rows[key].append(value)
    if keep:
      kept[update] = dp.unreplicate(state).params
  return {k: np.asarray(v) for k, v in rows.items()}, kept


def fairseq_params(data, prefix, config):
  return convert_state_dict(state_dict(data, prefix), config)


def assert_params_close(ours, theirs, what):
  ours, theirs = flat_params(ours), flat_params(theirs)
  assert set(ours) == set(theirs)
  for name in ours:
    if ZERO_GRADIENT in name:
      np.testing.assert_allclose(ours[name], theirs[name], rtol=0, atol=ATOL_ZERO_GRADIENT,
                                 err_msg=f"{what}: {name}")
    else:
      np.testing.assert_allclose(ours[name], theirs[name], rtol=RTOL_PARAMS, atol=ATOL_PARAMS,
                                 err_msg=f"{what}: {name}")


def assert_figures_match(ours, data, run, updates=None):
  for key in ("lr", "loss", "nll", "sample_size", "grad_norm"):
    theirs = data[f"{run}/{key}"][:updates]
    np.testing.assert_allclose(ours[key], theirs, rtol=RTOL_FIGURES, atol=1e-12,
                               err_msg=f"{run}: {key} per update")


@pytest.fixture(scope="module")
def asr_run(fixture):
  return train(fixture, "asr", masks_padding=False)


def test_the_fixture_exercises_what_it_should(fixture):
  """Warm-up and decay, clipped and unclipped updates, micro-batches of different shapes with
  padding: otherwise matching fairseq would prove less than it claims."""
  lr, norms = fixture["asr/lr"], fixture["asr/grad_norm"]
  warmup = int(fixture["warmup_updates"])
  assert lr[0] == 0 and np.all(np.diff(lr[:warmup + 1]) > 0) and np.all(np.diff(lr[warmup:]) < 0)
  clipped = norms > float(fixture["clip_norm"])
  assert 5 <= clipped.sum() <= len(norms) - 5
  batches = fixture_batches(fixture, "asr")
  assert len({b["features"].shape for b in batches}) == len(batches)
  assert sum(b["lengths"].min() < b["features"].shape[1] for b in batches) >= 4


@pytest.mark.parametrize("parallel", ["jit", "pmap"])
def test_updates_are_fairseqs(fixture, asr_run, parallel):
  ours, kept, config = asr_run if parallel == "jit" else train(fixture, "asr", False, parallel)
  assert_figures_match(ours, fixture, "asr")
  for update in (2, 9, 28, 29, 30):
    assert_params_close(kept[update], fairseq_params(fixture, f"asr/params_{update}/", config),
                        f"after update {update} ({parallel})")


def test_the_update_does_not_depend_on_how_its_utterances_are_split(fixture):
  """One batch of an update's utterances (our default subsampler) gives the update of its two
  micro-batches: the same sums, gradient norm and parameters to float32 rounding."""
  train_step, dp, state, _ = setup(fixture, "asr", masks_padding=True)
  first, second = (fixture_batches(fixture, "asr")[i] for i in fixture["asr/schedule"][3])
  frames = max(first["features"].shape[1], second["features"].shape[1])
  tokens = max(first["targets"].shape[1], second["targets"].shape[1])

  def padded(batch):
    out = dict(batch)
    out["features"] = np.pad(batch["features"],
                             ((0, 0), (0, frames - batch["features"].shape[1]), (0, 0)))
    for key in ("prev_tokens", "targets"):
      out[key] = np.pad(batch[key], ((0, 0), (0, tokens - batch[key].shape[1])),
                        constant_values=1)
    return out
  whole = {k: np.concatenate([padded(first)[k], padded(second)[k]]) for k in first}
  initial = dp.unreplicate(state)                 # the steps donate the state they take
  split_state, split_sums = train_step(state, dp.shard(first), apply_update=False)
  split_state, last = train_step(split_state, dp.shard(second), first_micro=False)
  whole_state, whole_sums = train_step(dp.replicate(initial), dp.shard(whole))
  for key in ("loss", "nll", "tokens"):
    np.testing.assert_allclose(dp.scalar(split_sums[key]) + dp.scalar(last[key]),
                               dp.scalar(whole_sums[key]), rtol=2e-6, err_msg=key)
  np.testing.assert_allclose(dp.scalar(last["grad_norm"]), dp.scalar(whole_sums["grad_norm"]),
                             rtol=2e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                         dp.unreplicate(split_state).params, dp.unreplicate(whole_state).params)


def test_masking_the_subsampler_padding_is_the_only_difference(fixture):
  """Unpadded micro-batches: our default model trains as fairseq does. Padded ones: it does
  not (the first conv's output over the padding reaches fairseq's last valid frames), and
  with the masking off it does (test_updates_are_fairseqs)."""
  ours, kept, config = train(fixture, "unpadded", masks_padding=True)
  assert_figures_match(ours, fixture, "unpadded")
  assert_params_close(kept[4], fairseq_params(fixture, "unpadded/params_4/", config),
                      "unpadded, after update 4")
  padded, _, _ = train(fixture, "asr", masks_padding=True, updates=1)
  relative = np.abs(padded["loss"] - fixture["asr/loss"][:1]) / fixture["asr/loss"][:1]
  assert np.all(relative > 10 * RTOL_FIGURES), relative


def test_the_st_stage_is_fairseqs(fixture, asr_run):
  """fairseq's --load-pretrained-encoder-from, as carry_from_asr does it: every encoder
  tensor of the ASR run's last checkpoint, exactly; then fairseq's ST updates."""
  asr_config = asr_run[2]
  asr_final = fairseq_params(fixture, "asr/params_30/", asr_config)
  st_init = {**state_dict(fixture, "st/init/"),
             **{k: v for k, v in state_dict(fixture, "asr/params_30/").items()
                if k.startswith("encoder.")}}
  st_config = model_config_from_fairseq(
      model_args(json.loads(str(fixture["model_args"])), st_init), st_init,
                                        subsampler_masks_padding=False)
  fresh = convert_state_dict({k: v for k, v in st_init.items() if not k.startswith("encoder.")}
                             | {k: np.zeros_like(v) for k, v in st_init.items()
                                if k.startswith("encoder.")}, st_config)
  carried = transfer.carry_from_asr(fresh, asr_final, logging.getLogger("test"))
  expected = convert_state_dict(st_init, st_config)
  jax.tree_util.tree_map(np.testing.assert_array_equal, flat_params(carried),
                         flat_params(expected))

  ours, kept, config = train(fixture, "st", masks_padding=False, init=st_init)
  assert_figures_match(ours, fixture, "st")
  assert_params_close(kept[6], fairseq_params(fixture, "st/params_6/", config),
                      "ST after update 6")


def test_checkpoint_averaging_is_fairseqs(fixture, asr_run, tmp_path):
  """Our checkpoints of fairseq's parameters after updates 28-30, averaged as evaluation
  averages them (eval.average_last): fairseq's average_checkpoints.py, bit for bit."""
  config = asr_run[2]
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / "checkpoints"), keep_last=5)
  for update in fixture["avg_updates"]:
    params = fairseq_params(fixture, f"asr/params_{update}/", config)
    checkpoints.save(int(update), {"params": params}, {"dev_loss": 1.0})
  averaged, steps = checkpoints.averaged_params(3)
  assert steps == [int(u) for u in fixture["avg_updates"]]
  jax.tree_util.tree_map(np.testing.assert_array_equal, flat_params(averaged),
                         flat_params(fairseq_params(fixture, "avg/", config)))


def test_clip_norm_is_fairseqs():
  """fairseq's clip_grad_norm_: times min(1, max / (norm + 1e-6)); --clip-norm 0 is off."""
  grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.zeros((2, 2))}          # norm 5
  for max_norm, factor in ((2.0, 2.0 / (5.0 + 1e-6)), (10.0, 1.0), (0.0, 1.0)):
    transform = clip_grad_norm(max_norm)
    clipped, _ = transform.update(grads, transform.init(grads))
    np.testing.assert_allclose(clipped["a"], np.array([3.0, 4.0]) * factor, rtol=1e-7)
