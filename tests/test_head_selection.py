"""Head selection (Gong et al. 2022) and the adapter baseline: selection rules, gradients, the KL
term, per-example tasks, heterogeneous candidates, cached decoding."""

import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import ConfigError, ModelConfig, init_cache
from multiformer_jax.model import head_selection as hs
from multiformer_jax.model.attention.multi import MultiHeadMultiAttention
from multiformer_jax.model.layout import parse_layout
from multiformer_jax.training.loss import label_smoothed_nll
from tests.test_model import tiny_model_factory

RNG = np.random.default_rng(0)

# 2 of 4 candidates per layer, every head kind among them; 3 tasks.
TINY = dict(dtype="float32",      # the numpy references are float32, on every backend
            vocab_size=29, input_dim=8, d_model=16, ffn_dim=24, encoder_layers=2,
            decoder_layers=2, encoder_heads=2, decoder_heads=2, conv_channels=8,
            encoder_layout="2x(1*full+1*local(3)+1*conv(3,2)+1*kernel(8))",
            encoder_candidates=4, decoder_candidates=4, num_tasks=3, task_tag="source_lang",
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


tiny_model = tiny_model_factory(TINY)


def _inputs(batch=3, frames=21):
  feats = jnp.asarray(RNG.normal(size=(batch, frames, 8)), jnp.float32)
  lengths = jnp.array([frames, frames - 6, frames - 11][:batch])
  prev = jnp.asarray(RNG.integers(4, 29, size=(batch, 6)), jnp.int32).at[:, 0].set(2)
  return feats, lengths, prev


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_inference_uses_exactly_h_heads_per_layer_and_task(strategy):
  logits = jnp.asarray(RNG.normal(size=(5, 3, 8)), jnp.float32)    # [tasks, layers, H']
  indices, chosen = hs.select(logits, 4, strategy)
  indices = np.asarray(indices)
  for t in range(5):
    for l in range(3):
      picked = indices[t, l]
      assert len(set(picked.tolist())) == 4                          # H distinct heads
      if strategy == "subset":                                       # the top 4, in order
        assert picked.tolist() == sorted(np.argsort(-np.asarray(logits[t, l]))[:4].tolist())
      else:                                                          # one per strided group
        np.testing.assert_array_equal(picked % 4, np.arange(4))
        for g in range(4):
          assert picked[g] == g + 4 * int(np.argmax(np.asarray(logits[t, l, g::4])))
  np.testing.assert_array_equal(chosen, np.take_along_axis(np.asarray(logits), indices, -1))


def _mhma(layout, selected=0):
  return MultiHeadMultiAttention(16, parse_layout(layout)[0], selected_heads=selected)


def test_unselected_candidates_do_not_change_the_output():
  """Behaviourally, H heads are active: perturbing an unselected candidate's values changes
  nothing, perturbing a selected one does."""
  module = _mhma("1x(1*full+1*local(3)+1*conv(3,2)+1*full)", selected=2)
  x = jnp.asarray(RNG.normal(size=(1, 9, 16)), jnp.float32)
  mask = jnp.ones((1, 9), bool)
  params = module.init(jax.random.PRNGKey(1), x, mask, True,
                       (jnp.array([[0, 1]]), jnp.ones((1, 2))))["params"]
  selection = (jnp.array([[2, 1]]), jnp.ones((1, 2)))                 # conv and local slots
  base = module.apply({"params": params}, x, mask, True, selection)
  head_dim = 8
  for head, should_change in ((0, False), (3, False), (1, True), (2, True)):
    bumped = flax.core.unfreeze(params)
    kernel = bumped["v_proj"]["kernel"]
    bumped["v_proj"]["kernel"] = kernel.at[:, head * head_dim:(head + 1) * head_dim].add(1.0)
    out = module.apply({"params": bumped}, x, mask, True, selection)
    assert (not np.allclose(out, base, atol=1e-6)) == should_change, head


def test_heterogeneous_candidates_route_each_selected_head_through_its_own_kind():
  """Selecting (conv, local) from [full, local, conv, full] equals a plain layer with layout
  conv+local whose q/k/v channels are those two candidates' and whose W_o is the same."""
  module = _mhma("1x(1*full+1*local(3)+1*conv(3,2)+1*full)", selected=2)
  x = jnp.asarray(RNG.normal(size=(2, 11, 16)), jnp.float32)
  mask = jnp.array([[True] * 11, [True] * 7 + [False] * 4])
  selection = (jnp.array([[2, 1], [2, 1]]), jnp.ones((2, 2)))
  params = module.init(jax.random.PRNGKey(2), x, mask, True, selection)["params"]
  selected = module.apply({"params": params}, x, mask, True, selection)

  plain = _mhma("1x(1*conv(3,2)+1*local(3))")
  columns = np.r_[16:24, 8:16]                                       # candidates 2, then 1
  plain_params = {name: {"kernel": params[name]["kernel"][:, columns],
                         "bias": params[name]["bias"][columns]}
                  for name in ("q_proj", "k_proj", "v_proj")}
  plain_params["out_proj"] = params["out_proj"]
  plain_params["group0_conv"] = params["group2_conv"]
  expected = plain.apply({"params": plain_params}, x, mask, True)
  np.testing.assert_allclose(selected[0], expected[0], atol=1e-5)
  np.testing.assert_allclose(selected[1, :7], expected[1, :7], atol=1e-5)


def test_gradients_reach_the_selection_logits_in_training():
  model, params = tiny_model()
  feats, lengths, prev = _inputs()
  tasks = jnp.array([0, 1, 2])

  def loss(p):
    logits = model.apply({"params": p}, feats, lengths, prev, False, tasks, 2.0,
                         rngs={"dropout": jax.random.PRNGKey(3)}, mutable=["selection"])[0]
    return label_smoothed_nll(logits, jnp.roll(prev, -1, axis=1), 0.1)[0]

  grads = jax.jit(jax.grad(loss))(params)
  for stack in ("encoder", "decoder"):
    g = np.asarray(grads[stack]["head_selector"]["logits"])          # [tasks, layers, H']
    assert np.all(np.isfinite(g))
    for t in range(3):                          # every task in the batch gets a gradient
      assert np.abs(g[t]).sum() > 0, (stack, t)


def test_kl_term_matches_its_formula():
  samples = RNG.uniform(0.01, 0.99, size=(3, 2, 8))
  tokens = np.array([10.0, 0.0, 7.0])
  prior = 4 / 8
  expected = sum(tokens[t] * np.sum(samples[t] * (np.log(samples[t] + 1e-7) - math.log(prior)))
                 / (2 * 8) for t in range(3))
  got = hs.selection_kl(jnp.asarray(samples), jnp.asarray(tokens), prior)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # Zero exactly at s = p (up to eps) and positive above the prior.
  assert abs(float(hs.kl_per_task(jnp.full((1, 2, 8), prior), prior)[0])) < 1e-6
  assert float(hs.kl_per_task(jnp.full((1, 2, 8), 0.9), prior)[0]) > 0


@pytest.mark.parametrize("overrides", [(), (("adapter_dim", 4), ("encoder_candidates", 0),
                                            ("decoder_candidates", 0),
                                            ("encoder_layout", "2x(2*full)"))],
                         ids=["head_selection", "adapters"])
def test_a_mixed_task_batch_gives_each_example_its_single_task_output(overrides):
  model, params = tiny_model(**dict(overrides))
  if dict(overrides).get("adapter_dim"):        # adapters start as the identity: move them
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 * jnp.asarray(RNG.normal(size=x.shape), x.dtype)
        if "adapters" in jax.tree_util.keystr(path) else x, params)
  feats, lengths, prev = _inputs()
  apply = jax.jit(model.apply, static_argnums=(4,))
  tasks = jnp.array([2, 0, 1])
  mixed = apply({"params": params}, feats, lengths, prev, True, tasks)
  outputs = set()
  for b in range(3):
    alone = apply({"params": params}, feats[b:b + 1, :int(lengths[b])], lengths[b:b + 1],
                  prev[b:b + 1], True, tasks[b:b + 1])
    np.testing.assert_allclose(mixed[b], alone[0], atol=2e-5)
    other = apply({"params": params}, feats[b:b + 1, :int(lengths[b])], lengths[b:b + 1],
                  prev[b:b + 1], True, (tasks[b:b + 1] + 1) % 3)
    outputs.add(not np.allclose(alone, other, atol=1e-4))
  assert outputs == {True}                      # the task id matters


def test_training_mode_samples_per_task_and_shares_the_noise_across_the_batch():
  """In training a mixed batch equals single-task batches drawn with the same key."""
  model, params = tiny_model()
  feats, lengths, prev = _inputs()
  tasks = jnp.array([1, 1, 2])
  run = jax.jit(lambda f, l, p, t: model.apply(
      {"params": params}, f, l, p, False, t, 1.0, rngs={"dropout": jax.random.PRNGKey(5)},
      mutable=["selection"]))
  mixed, state = run(feats, lengths, prev, tasks)
  samples = state["selection"]["encoder"]["head_selector"]["samples"][0]
  assert samples.shape == (3, 2, 4) and np.all((samples > 0) & (samples < 1))
  alone, _ = run(feats[2:], lengths[2:], prev[2:], tasks[2:])
  np.testing.assert_allclose(mixed[2, :], alone[0], atol=2e-5)


def test_cached_decoding_equals_teacher_forcing_with_selected_decoder_heads():
  model, params = tiny_model(adapter_dim=4)
  feats, lengths, prev = _inputs(batch=2)
  tasks = jnp.array([2, 1])
  variables = {"params": params}
  apply = jax.jit(model.apply, static_argnames=("method", "deterministic"))
  forced = apply(variables, feats, lengths, prev, deterministic=True, tasks=tasks)
  enc, mask = apply(variables, feats, lengths, deterministic=True, tasks=tasks,
                    method=model.encode)
  cross = apply(variables, enc, method=model.cross_kv)
  cache = init_cache(model, 2, 8)
  assert cache[0]["k"].shape == (2, 8, 4, 8)                 # all H' candidates are cached
  step = jax.jit(lambda tok, i, c: model.apply(variables, tok, i, c, cross, mask, tasks,
                                               method=model.decode_step))
  for i in range(prev.shape[1]):
    logits, cache = step(prev[:, i:i + 1], i, cache)
    np.testing.assert_allclose(logits, forced[:, i], atol=1e-4, rtol=1e-4)


def test_noisy_inference_reproduces_the_reference_behaviour():
  model, params = tiny_model(selection_inference="noisy")
  feats, lengths, prev = _inputs()
  apply = jax.jit(model.apply, static_argnums=(4,))
  outputs = [apply({"params": params}, feats, lengths, prev, True, jnp.array([0, 1, 2]),
                   rngs={"selection": jax.random.PRNGKey(k)}) for k in range(6)]
  assert any(not np.allclose(outputs[0], o) for o in outputs[1:])


@pytest.mark.parametrize("overrides, message", [
    (dict(encoder_candidates=3), "multiple of model.encoder_heads"),
    (dict(selection_strategy="topk"), "valid: ('subset', 'group')"),
    (dict(task_tag="speaker"), "model.task_tag"),
    (dict(encoder_layout="2x(2*full)"), "lists the model.encoder_candidates=4 candidate"),
])
def test_bad_selection_configs_name_the_value(overrides, message):
  with pytest.raises((ConfigError, ValueError), match=message.replace("(", r"\(").replace(
      ")", r"\)")):
    ModelConfig(**{**TINY, **overrides})


def test_translate_is_deterministic_unless_noisy_inference_is_asked_for():
  from multiformer_jax.evaluation.inference import make_beam_search  # pylint: disable=import-outside-toplevel
  feats, lengths, _ = _inputs()
  tasks = jnp.array([0, 1, 2])
  hypotheses = {}
  for mode in ("deterministic", "noisy"):
    model, params = tiny_model(selection_inference=mode)
    translate = make_beam_search(model, beam=2, length_penalty=1.0, max_len_a=0.0, max_len_b=6)
    hypotheses[mode] = [np.asarray(translate(params, feats, lengths, tasks, None,
                                             jax.random.PRNGKey(k))) for k in range(4)]
  assert all(np.array_equal(h, hypotheses["deterministic"][0])
             for h in hypotheses["deterministic"])
  assert any(not np.array_equal(h, hypotheses["noisy"][0]) for h in hypotheses["noisy"][1:])


def test_the_selection_logits_can_have_a_learning_rate_of_their_own():
  import ml_collections  # pylint: disable=import-outside-toplevel
  from multiformer_jax.training import optimizer  # pylint: disable=import-outside-toplevel
  params = {"encoder": {"head_selector": {"logits": jnp.zeros((2, 3))},
                        "layers_0": {"w": jnp.zeros((3,))}}}
  grads = jax.tree_util.tree_map(jnp.ones_like, params)
  steps = {}
  for multiplier in (1.0, 20.0):
    cfg = ml_collections.ConfigDict(dict(clip_norm=1e9, adam_b1=0.9, adam_b2=0.98,
                                         adam_eps=1e-8, selection_lr_multiplier=multiplier))
    tx, _ = optimizer.make_optimizer(cfg, ml_collections.ConfigDict(
        dict(lr=1e-3, lr_scheduler="inverse_sqrt", warmup_updates=0, train_only="",
             frozen="")))
    updates, _ = tx.update(grads, tx.init(params), params)
    steps[multiplier] = updates
  np.testing.assert_allclose(steps[20.0]["encoder"]["head_selector"]["logits"],
                             20 * steps[1.0]["encoder"]["head_selector"]["logits"])
  np.testing.assert_array_equal(steps[20.0]["encoder"]["layers_0"]["w"],
                                steps[1.0]["encoder"]["layers_0"]["w"])
  assert float(jnp.abs(steps[1.0]["encoder"]["layers_0"]["w"]).max()) > 0
