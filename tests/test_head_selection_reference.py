"""Head selection as fairseq's own examples/attention_head_selection computes it: a
head_selection_s2t_transformer imported here, with the reference's Gumbel noise fed in, selects
the same heads and gives the same outputs, loss and KL term, in training and in the reference's
noisy inference (tests/fixtures/make_head_selection_fixture.py made the fixture with fairseq's
code)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import build_model, init_params
from multiformer_jax.fairseq_checkpoints.checkpoint import (FairseqImportError, convert_state_dict,
                                                       head_selection_tasks,
                                                       model_config_from_fairseq)
from multiformer_jax.model import head_selection
from multiformer_jax.training.loss import label_smoothed_nll

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "head_selection_tiny.npz")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def fixture():
  data = np.load(FIXTURE)
  state = {k[3:]: data[k] for k in data.files if k.startswith("sd/")}
  return data, state, json.loads(str(data["args"]))


def imported(args, state, strategy, **overrides):
  # fairseq's subsampler (no re-zeroing of padded frames): the fixture's batch is padded.
  config = model_config_from_fairseq({**args, "attn_head_select_strategy": strategy}, state,
                                     subsampler_masks_padding=False, **overrides)
  return config, build_model(config), convert_state_dict(state, config)


def fed_noise(data, prefix):
  return {side: {"head_selector": {"logistic": jnp.asarray(data[f"{prefix}{side}_noise"])}}
          for side in ("encoder", "decoder")}


def forward(model, params, data, noise, tasks, deterministic):
  """(encoder output, mask, logits, sown samples) with the given noise."""
  variables = {"params": params, "selection_noise": noise}
  inputs = (jnp.asarray(data["features"]), jnp.asarray(data["lengths"]))
  rngs = {"dropout": jax.random.PRNGKey(0)}
  encoded, mask = model.apply(variables, *inputs, deterministic, tasks, method=model.encode,
                              rngs=rngs)
  logits, sown = model.apply(variables, *inputs, jnp.asarray(data["prev_tokens"]), deterministic,
                             tasks, rngs=rngs, mutable=["selection"])
  return np.asarray(encoded), np.asarray(mask), np.asarray(logits), sown.get("selection", {})


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_training_selects_and_computes_as_the_reference(fixture, strategy):
  data, state, args = fixture
  config, model, params = imported(args, state, strategy)
  assert (config.encoder_candidates, config.decoder_candidates, config.encoder_heads) == (4, 4, 2)
  fresh = init_params(model, jax.random.PRNGKey(0))
  assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(params)
  prefix = f"{strategy}_train_"
  tasks = jnp.asarray(data["train_tasks"])
  encoded, mask, logits, sown = forward(model, params, data, fed_noise(data, prefix), tasks,
                                        deterministic=False)
  for side in ("encoder", "decoder"):
    samples = sown[side]["head_selector"]["samples"][0]
    np.testing.assert_allclose(samples, data[f"{prefix}{side}_samples"], atol=1e-7)
    heads, chosen = head_selection.select(samples, 2, strategy, config.selection_subset_order)
    np.testing.assert_array_equal(heads, data[f"{prefix}{side}_heads"])
    np.testing.assert_allclose(head_selection.straight_through(chosen),
                               data[f"{prefix}{side}_weights"], atol=1e-7)
  valid = mask[..., None]
  np.testing.assert_allclose(np.where(valid, encoded, 0),
                             np.where(valid, data[f"{prefix}encoder_out"], 0), atol=TOLERANCE)
  np.testing.assert_allclose(logits, data[f"{prefix}logits"], atol=TOLERANCE)

  ce, nll, _ = label_smoothed_nll(jnp.asarray(logits), jnp.asarray(data["targets"]), 0.1)
  np.testing.assert_allclose([ce, nll], [data[f"{prefix}ce"], data[f"{prefix}nll"]], rtol=1e-6)
  tokens = jnp.zeros(2).at[tasks].add(jnp.sum(jnp.asarray(data["targets"]) != 1, axis=1))
  for side in ("encoder", "decoder"):
    kl = head_selection.selection_kl(sown[side]["head_selector"]["samples"][0], tokens, 2 / 4)
    np.testing.assert_allclose(kl, data[f"{prefix}{side}_kl"], rtol=1e-5)


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_noisy_inference_computes_as_the_reference(fixture, strategy):
  """The reference samples noise at inference and gives the whole batch its first example's
  task; model.selection_inference=noisy and the first task for every example reproduce it."""
  data, state, args = fixture
  _, model, params = imported(args, state, strategy, selection_inference="noisy")
  prefix = f"{strategy}_infer_"
  tasks = jnp.full(data["lengths"].shape, data["train_tasks"][0])
  encoded, mask, logits, _ = forward(model, params, data, fed_noise(data, prefix), tasks,
                                     deterministic=True)
  valid = mask[..., None]
  np.testing.assert_allclose(np.where(valid, encoded, 0),
                             np.where(valid, data[f"{prefix}encoder_out"], 0), atol=TOLERANCE)
  np.testing.assert_allclose(logits, data[f"{prefix}logits"], atol=TOLERANCE)


def test_subset_slots_follow_the_scores_as_the_reference_orders_them(fixture):
  """The reference fills W_o's slots in score order; candidate order (this toolkit's default
  for its own models) computes another function of the same weights."""
  data, state, args = fixture
  prefix = "subset_train_"
  assert (np.diff(data[f"{prefix}encoder_heads"], axis=-1) < 0).any()    # not sorted
  _, model, params = imported(args, state, "subset", selection_subset_order="candidate")
  _, _, logits, _ = forward(model, params, data, fed_noise(data, prefix),
                            jnp.asarray(data["train_tasks"]), deterministic=False)
  assert np.abs(logits - data[f"{prefix}logits"]).max() > 1e-3


def test_what_is_not_implemented_is_refused(fixture):
  _, state, args = fixture
  with pytest.raises(FairseqImportError, match="encoder attention is not implemented"):
    model_config_from_fairseq({**args, "dec_enc_attn_head_select": True}, state)
  state = {k: v for k, v in state.items() if "attn_head_selector" not in k}
  with pytest.raises(FairseqImportError, match="no encoder head_logits"):
    model_config_from_fairseq(args, state)
  with pytest.raises(FairseqImportError, match="--task-type 'speaker'; .* lang, domain"):
    model_config_from_fairseq({**args, "task_type": "speaker"}, state)


def test_task_ids_are_numbered_as_the_reference_task_numbers_them(fixture):
  """speech_to_text_head_selection.map_task_to_id: sorted languages (lang) or domains of the
  train_SRC_TGT_DOMAIN subsets; each stack keyed by the tag this model reads them from."""
  _, state, args = fixture
  subsets = "train_es_es_tedx,train_de_de_cv,train_es_es_ep,train_de_de_tedx"
  by_domain = {**args, "task_type": "domain", "train_subset": subsets}
  assert head_selection_tasks(by_domain) == {"encoder": ("cv", "ep", "tedx"),
                                             "decoder": ("cv", "ep", "tedx")}
  config = model_config_from_fairseq(by_domain, state)
  assert (config.encoder_task_tag, config.decoder_task_tag) == ("domain", "domain")
  assert head_selection_tasks({**args, "train_subset": subsets}) == {
      "encoder": ("de", "es"), "decoder": ("de", "es")}          # task_type lang, the default
  assert head_selection_tasks(args) is None                     # subsets not recorded
  with pytest.raises(FairseqImportError, match="'train_en_de' is not split_src_tgt_domain"):
    head_selection_tasks({**args, "train_subset": "train_en_de"})
