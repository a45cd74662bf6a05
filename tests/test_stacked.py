"""The text encoder stacked on the speech encoder (model/stacked.py, st.text_encoder="mt"): fed a
one-hot CTC distribution it is the MT model's encoder, the stacked model keeps padding
invariance and cached decoding, and the ST stage starts it from the MT stage."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import ConfigError, ModelConfig, experiment
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.model.stacked import StackedTextEncoder, text_layers_config
from multiformer_jax.model.mt_model import MTModel
from multiformer_jax.training import train
from multiformer_jax import model as model_lib
from multiformer_jax.training import optimizer
from multiformer_jax.training import transfer
from tests.test_model import (TINY, assert_cached_decoding_equals_teacher_forcing,
                              assert_encoder_padding_invariant, tiny_model_factory)
from tests.test_mt_stage import LOG, mt_config

RNG = np.random.default_rng(3)
PIECES = 11                                # the source (ASR) vocabulary; id 0 is CTC's blank
STACKED = dict(ctc_head=True, ctc_vocab_size=PIECES, text_encoder_layers=2)
tiny_model = tiny_model_factory(TINY)


def stacked_model():
  """The tiny model with a stacked text encoder whose projection of the speech encoder's output
  is not zero (at its start it is, which would hide that path)."""
  model, params = tiny_model(**STACKED)
  params = flax.core.unfreeze(params)
  kernel = params["text_encoder"]["acoustic"]["kernel"]
  params["text_encoder"]["acoustic"]["kernel"] = jnp.asarray(
      RNG.normal(scale=0.2, size=kernel.shape), kernel.dtype)
  return model, params


def test_fed_a_one_hot_distribution_it_is_the_text_models_encoder():
  config = ModelConfig(**{**TINY, **STACKED})
  source = jnp.asarray([[5, 7, 3, 9, 2], [4, 8, 2, 1, 1]], jnp.int32)    # EOS 2, PAD 1
  mask = source != 1
  text = MTModel(text_layers_config(config, 2, 0.0), PIECES)
  text_params = text.init(jax.random.PRNGKey(1), source, source)["params"]
  expected, _ = text.apply({"params": text_params}, source, method=text.encode)
  stacked = StackedTextEncoder(config)
  encoded = jnp.asarray(RNG.normal(size=(2, 5, config.d_model)), jnp.float32)
  params = stacked.init(jax.random.PRNGKey(2), encoded, jnp.zeros((2, 5, PIECES)), mask)["params"]
  params = {**{k: v for k, v in text_params.items() if k != "decoder"},
            "acoustic": params["acoustic"]}         # its start: zero, the speech output unused
  one_hot = 1e4 * jax.nn.one_hot(source, PIECES)   # softmax: exactly one-hot in float32
  got = stacked.apply({"params": params}, encoded, one_hot, mask)
  np.testing.assert_allclose(np.asarray(got)[np.asarray(mask)],
                             np.asarray(expected)[np.asarray(mask)], atol=1e-5)
  assert np.all(np.asarray(got)[~np.asarray(mask)] == 0)


def test_the_stacked_model_is_padding_invariant():
  assert_encoder_padding_invariant(*stacked_model())


def test_the_stacked_models_cached_decoding_equals_teacher_forcing_and_ctc_reads_speech():
  """Also checks that `encode` (decoding) and the training call stack alike."""
  model, params = stacked_model()
  feats, lengths, mask, sown = assert_cached_decoding_equals_teacher_forcing(model, params)
  # The CTC head spells the source from the speech encoder's output, not from the stack's.
  variables = {"params": params}
  speech, _ = model.apply(variables, feats, lengths, method=lambda m, f, n: m.encoder(f, n))
  ctc_logits, ctc_mask = sown["ctc"]["logits"][0]
  assert ctc_logits.shape[-1] == PIECES
  np.testing.assert_allclose(ctc_logits, model.apply(
      variables, speech, method=lambda m, x: m.ctc_proj(x)), atol=1e-5)
  np.testing.assert_array_equal(ctc_mask, mask)


def test_a_stacked_text_encoder_needs_a_ctc_head():
  with pytest.raises(ConfigError, match="model.text_encoder_layers=2: .* only with a CTC head"):
    ModelConfig(**{**TINY, "text_encoder_layers": 2})


def test_the_st_stage_starts_the_stack_from_the_mt_stages_encoder(prepared, tmp_path):
  _, prepared_dir = prepared
  config = mt_config(prepared_dir)
  config.st.text_encoder = "mt"
  config.st.max_updates = 2
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  assert results["st"]["train"]["updates"] == 2
  text, _ = transfer.read_mt_params(workdir)
  data = ip.SplitData(experiment.pipeline_config(config, "st"), "train")
  model = model_lib.S2TModel(experiment.model_config_for(config, data.vocab.size, None, "st"))
  assert model.config.text_encoder_layers == config.mt.encoder_layers == 1
  fresh = model_lib.init_params(model, jax.random.PRNGKey(1))
  carried = optimizer.flat_params(transfer.carry_from_mt_stage(       # pylint: disable=protected-access
      fresh, workdir, LOG, decoder=True, encoder=True))
  flat_text = flax.traverse_util.flatten_dict(text, sep="/")
  for name, value in flat_text.items():
    target = name if name.startswith("decoder/") else f"text_encoder/{name}"
    np.testing.assert_array_equal(carried[target], value)
  assert not np.any(carried["text_encoder/acoustic/kernel"])
  for name, value in optimizer.flat_params(fresh).items():          # pylint: disable=protected-access
    if not name.startswith(("decoder/", "text_encoder/")):
      np.testing.assert_array_equal(carried[name], value)


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.st, "text_encoder", "bert"), "st.text_encoder='bert'; valid: ''"),
    (lambda c: setattr(c.st, "ctc_weight", 0.0), "set st.ctc_weight > 0"),
])
def test_stacked_settings_that_cannot_work_are_refused_before_training(prepared, tmp_path,
                                                                       change, message):
  _, prepared_dir = prepared
  config = mt_config(prepared_dir)
  config.st.text_encoder = "mt"
  change(config)
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path))
