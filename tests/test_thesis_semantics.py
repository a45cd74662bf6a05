"""The thesis's Multiformer as its own code computes it: imported weights give the outputs that
mt-upc/fairseq's multiformer branch (with local-attention 1.4.3 and performer-pytorch 1.1.3)
computed for them (tests/fixtures/make_thesis_fixture.py), and each thesis form differs from
this project's default only where docs/thesis_semantics.md says it does."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import ModelConfig, build_model, format_layout, init_params, parse_layout
from multiformer_jax.fairseq_checkpoints import thesis
from multiformer_jax.fairseq_checkpoints.checkpoint import (FairseqImportError, convert_state_dict,
                                                       load_fairseq_checkpoint,
                                                       model_config_from_fairseq)
from multiformer_jax.model.attention.conv import ConvAttention
from multiformer_jax.model.attention.kernel import KernelAttention, favor_attention
from multiformer_jax.model.attention.local import LocalAttention
from multiformer_jax.model.attention.local_thesis import ThesisLocalAttention
from multiformer_jax.model.layout import ConvHeads, KernelHeads, LayoutError, LocalHeads
from multiformer_jax.model.subsampler import Conv1dSubsampler

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
NPZ = os.path.join(FIXTURES, "thesis_multiformer_tiny.npz")
PT = os.path.join(FIXTURES, "thesis_multiformer_tiny.pt")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def imported():
  data = np.load(NPZ)
  state = {k[3:]: data[k] for k in data.files if k.startswith("sd/")}
  config = model_config_from_fairseq(json.loads(str(data["args"])), state)
  return data, config, convert_state_dict(state, config)


def outputs(config, params, features, lengths, prev_tokens):
  """(encoder output, its mask, decoder logits), one compiled program (eager dispatch of the
  many small ops took ~10x longer)."""
  model = build_model(config)

  @jax.jit
  def forward(params, features, lengths, prev_tokens):
    encoded, mask = model.apply({"params": params}, features, lengths, method=model.encode)
    return encoded, mask, model.apply({"params": params}, features, lengths, prev_tokens)

  return tuple(np.asarray(x) for x in forward(params, jnp.asarray(features),
                                              jnp.asarray(lengths), jnp.asarray(prev_tokens)))


def test_the_import_reads_the_thesis_layout_in_its_own_order(imported):
  _, config, params = imported
  assert config.semantics == "thesis" and not config.qkv_bias
  assert config.encoder_layout == (
      "1x(1*conv(5,2,standard,thesis)+1*local(9,thesis)+1*kernel(16,thesis)+1*full) "
      "1x(2*local(6,thesis)+1*conv(5,2,thesis)+1*conv(7,3,separable,thesis)) "
      "1x(2*kernel(16,thesis)+2*local(9,thesis))")
  fresh = init_params(build_model(config), jax.random.PRNGKey(0))
  assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(params)


def test_batched_outputs_equal_the_thesis_codes_padding_included(imported):
  """Padding enters the thesis's fast and compressed heads and fairseq's subsampler: the batched
  outputs differ from each utterance's own, and both are reproduced."""
  data, config, params = imported
  encoded, mask, logits = outputs(config, params, data["batch_features"], data["batch_lengths"],
                                  data["batch_prev_tokens"])
  valid = mask[..., None]
  np.testing.assert_allclose(np.where(valid, encoded, 0),
                             np.where(valid, data["batch_encoder_out"], 0), atol=TOLERANCE)
  np.testing.assert_allclose(logits, data["batch_logits"], atol=TOLERANCE)
  for i, length in enumerate(data["batch_lengths"]):
    features = data["batch_features"][i:i + 1, :length]
    encoded, _, logits = outputs(config, params, features, [length],
                                 data["batch_prev_tokens"][i:i + 1])
    np.testing.assert_allclose(encoded, data[f"single{i}_encoder_out"], atol=TOLERANCE)
    np.testing.assert_allclose(logits, data[f"single{i}_logits"], atol=TOLERANCE)
    frames = encoded.shape[1]
    padding_effect = np.abs(data["batch_encoder_out"][i, :frames] - encoded[0]).max()
    assert padding_effect > 0.1 if i else padding_effect < TOLERANCE   # utterance 0: unpadded


def test_an_utterance_whose_compressed_keys_are_all_masked(imported):
  """The thesis's mask arithmetic leaves a 7-frame utterance no conv(7,3) key: its code gives
  NaN, this model 0 from those heads (finite outputs); the other utterance is unaffected."""
  data, config, params = imported
  encoded, mask, logits = outputs(config, params, data["short_features"], data["short_lengths"],
                                  data["batch_prev_tokens"][:2])
  assert np.isnan(data["short_encoder_out"][1]).all() and np.isfinite(encoded[1]).all()
  np.testing.assert_allclose(encoded[0], data["short_encoder_out"][0], atol=TOLERANCE)
  np.testing.assert_allclose(logits[0], data["short_logits"][0], atol=TOLERANCE)


def test_the_pt_checkpoint_imports_as_the_npz(imported):
  _, config, params = imported
  pt_config, pt_params, updates = load_fairseq_checkpoint(PT)
  assert pt_config == config and updates == 0
  jax.tree_util.tree_map(np.testing.assert_array_equal, pt_params, params)


def test_the_thesis_projection_is_a_weight_that_training_leaves_alone(imported):
  data, config, params = imported
  model = build_model(config)

  def loss(p):
    logits = model.apply({"params": p}, jnp.asarray(data["batch_features"]),
                         jnp.asarray(data["batch_lengths"]), jnp.asarray(data["batch_prev_tokens"]))
    return jnp.mean(logits ** 2)

  grads = jax.jit(jax.grad(loss))(params)
  projection = grads["encoder"]["layers_2"]["self_attn"]["group0_kernel"]["projection"]
  assert projection.shape == (16, 8) and not np.any(projection)
  assert np.any(grads["encoder"]["layers_2"]["self_attn"]["q_proj"]["kernel"])


# --------------------------------------------------------------- the arch and layout language

def test_every_registered_thesis_arch_maps_to_a_layout():
  """The layouts the thesis's fork registers (s2t_multiformer.py), read without eval."""
  registered = {
      "s2t_multiformer_s_lc": "12 * ((('local', 2, 64), ('compressed', 2, 5, 2, 'depthwise')),)",
      "s2t_multiformer_s": "2 * ((('compressed', 4, 5, 2, 'depthwise'),),) + 6 * ((('local', 2, "
                           "64), ('compressed', 2, 5, 2, 'depthwise')),) + 4 * ((('full', 2,), "
                           "('compressed', 2, 7, 3, 'depthwise')),)",
      "s2t_local_attention_s": "12 * ((('local', 4, 64),),)",
  }
  expected = {
      "s2t_multiformer_s_lc": "12x(2*local(64,thesis)+2*conv(5,2,thesis))",
      "s2t_multiformer_s": "2x(4*conv(5,2,thesis)) 6x(2*local(64,thesis)+2*conv(5,2,thesis)) "
                           "4x(2*full+2*conv(7,3,thesis))",
      "s2t_local_attention_s": "12x(4*local(64,thesis))",
  }
  for arch, text in registered.items():
    assert format_layout(thesis.thesis_layout(text, {})) == expected[arch]


@pytest.mark.parametrize("text, message", [
    # s2t_multiformer_s_v2's registered default: `5 (...)` calls an int, in their code too.
    ("3 * ((('local', 1, 64),),) + 5 ((('local', 3, 64),),)", "is not a tuple, a number"),
    ("__import__('os').system('touch /tmp/x')", "nothing is run"),
    ("4 * ((('fast', 4), ('com', 4, 64)),)", r"\('com', 4, 64\) is not one the thesis"),
    ("((('full', 2), ('full', 2)),)", "several 'full' groups"),
    ("((('compressed', 4, 5, 2, 'grouped'),),)", "type 'grouped'"),
])
def test_arg_supremo_that_cannot_be_mapped_is_refused_by_name(text, message):
  with pytest.raises(thesis.ArgSupremoError, match=message):
    thesis.thesis_layout(text, {})


def test_an_arch_without_what_the_import_needs_is_refused(imported):
  data, _, _ = imported
  args = json.loads(str(data["args"]))
  state = {k[3:]: data[k] for k in data.files if k.startswith("sd/")}
  with pytest.raises(FairseqImportError, match="Identity2D"):
    model_config_from_fairseq({**args, "conv_ks": "", "conv_strides": ""}, state)
  with pytest.raises(FairseqImportError, match="without 'arg_supremo'"):
    model_config_from_fairseq({**args, "arg_supremo": None}, state)
  with pytest.raises(FairseqImportError, match="describes 2 encoder layers, the checkpoint's "
                                               "weights 3"):
    model_config_from_fairseq({**args, "arg_supremo": "2 * ((('full', 4),),)"}, state)
  with pytest.raises(FairseqImportError, match="different head counts"):
    model_config_from_fairseq(
        {**args, "arg_supremo": "((('full', 4),),) + ((('full', 2),),) + ((('full', 4),),)"},
        state)


def test_thesis_forms_in_the_layout_language():
  (layer,) = parse_layout("1x(local(64,thesis)+kernel(thesis)+kernel(266,thesis)"
                          "+conv(thesis)+conv(7,3,separable,thesis))")
  assert [g.kind for g in layer] == [LocalHeads(64, 1, True), KernelHeads(0, True),
                                     KernelHeads(266, True), ConvHeads(5, 2, "depthwise", True),
                                     ConvHeads(7, 3, "separable", True)]
  text = format_layout((layer,))
  assert text == ("1x(1*local(64,thesis)+1*kernel(thesis)+1*kernel(266,thesis)"
                  "+1*conv(5,2,thesis)+1*conv(7,3,separable,thesis))")
  assert parse_layout(text) == (layer,)
  for bad, message in (("1x(full(thesis))", "full takes no arguments"),
                       ("1x(local(2,thesis))", "needs w >= 3"),
                       ("1x(local(65,2,thesis))", "local\\(w,thesis\\)")):
    with pytest.raises(LayoutError, match=message):
      parse_layout(bad)


def test_one_setting_makes_a_config_the_thesiss():
  config = ModelConfig(d_model=32, encoder_layers=2, encoder_heads=4, semantics="thesis",
                       encoder_layout="1x(2*local(65)+2*conv(5,2)) 1x(2*kernel(266)+2*full)")
  assert config.layout == parse_layout(
      "1x(2*local(65,thesis)+2*conv(5,2,thesis)) 1x(2*kernel(266,thesis)+2*full)")
  assert (config.qkv_bias, config.attention_init, config.subsampler_masks_padding) == (
      False, "pytorch", False)
  with pytest.raises(ValueError, match="kernel_redraw='step' with kernel\\(266,thesis\\)"):
    ModelConfig(d_model=32, encoder_layers=1, encoder_heads=4, semantics="thesis",
                kernel_redraw="step", encoder_layout="1x(4*kernel(266))")
  with pytest.raises(ValueError, match="model.semantics='fairseq'; valid"):
    ModelConfig(semantics="fairseq")
  with pytest.raises(LayoutError, match="no thesis form"):
    ModelConfig(d_model=32, encoder_layers=1, encoder_heads=4, semantics="thesis",
                encoder_layout="1x(4*local(5,2))")


# ------------------------------------------- where the thesis forms equal this project's kinds

def heads(rng, batch=2, length=23, heads_=2, dim=8):
  return [jnp.asarray(rng.normal(size=(batch, length, heads_, dim)), jnp.float32)
          for _ in range(3)]


def test_kernel_heads_differ_only_by_the_padding_they_count():
  """Same projection: equal with every key valid; with padding the thesis form counts the padded
  keys and values (what the reference does), the default form ignores them exactly."""
  rng = np.random.default_rng(1)
  q, k, v = heads(rng)
  module = KernelAttention(0, thesis=True, head_dim=8)
  params = module.init(jax.random.PRNGKey(0), q, k, v, jnp.ones((2, 23), bool))
  projection = params["params"]["projection"]
  full = jnp.ones((2, 23), bool)
  np.testing.assert_allclose(module.apply(params, q, k, v, full),
                             favor_attention(q, k, v, full, projection, "xla"), atol=1e-6)
  padded = full.at[1, 15:].set(False)
  thesis_out = module.apply(params, q, k, v, padded)
  assert projection.shape == (16, 8)                          # int(8 ln 8) features
  np.testing.assert_allclose(thesis_out, module.apply(params, q, k, v, full), atol=1e-6)
  exact = favor_attention(q, k, v, padded, projection, "xla")
  np.testing.assert_allclose(exact[1, :15], favor_attention(
      q[1:, :15], k[1:, :15], v[1:, :15], full[1:, :15], projection, "xla")[0], atol=1e-5)
  assert np.abs(np.asarray(thesis_out[1, :15] - exact[1, :15])).max() > 1e-3


def test_conv_heads_differ_by_padding_width_and_padded_frames():
  """conv(3,2): kernel//2 == stride//2, and 23 - 3 is a whole number of strides, so unpadded the
  two forms are one function of the same weights; padded frames enter only the thesis form."""
  rng = np.random.default_rng(2)
  q, k, v = heads(rng)
  full = jnp.ones((2, 23), bool)
  exact, thesis_module = ConvAttention(3, 2), ConvAttention(3, 2, thesis=True)
  params = exact.init(jax.random.PRNGKey(0), q, k, v, full)
  np.testing.assert_allclose(thesis_module.apply(params, q, k, v, full),
                             exact.apply(params, q, k, v, full), atol=1e-6)
  padded = full.at[1, 15:].set(False)
  difference = thesis_module.apply(params, q, k, v, padded) - exact.apply(params, q, k, v, padded)
  assert np.abs(np.asarray(difference[0])).max() < 1e-6
  assert np.abs(np.asarray(difference[1, :15])).max() > 1e-3
  # conv(5,2): padding 1 (thesis) or 2 (here) moves every compressed key.
  exact, thesis_module = ConvAttention(5, 2), ConvAttention(5, 2, thesis=True)
  params = exact.init(jax.random.PRNGKey(0), q, k, v, full)
  assert np.abs(np.asarray(thesis_module.apply(params, q, k, v, full)
                           - exact.apply(params, q, k, v, full))).max() > 1e-3


def test_blocked_and_centred_windows_agree_when_both_see_every_key():
  rng = np.random.default_rng(3)
  q, k, v = heads(rng, length=7)
  mask = jnp.ones((2, 7), bool).at[1, 5:].set(False)
  blocked = ThesisLocalAttention(24).apply({}, q, k, v, mask)      # buckets of 8 >= 7 frames
  centred = LocalAttention(15, implementation="xla").apply({}, q, k, v, mask)
  np.testing.assert_allclose(np.asarray(blocked)[0], np.asarray(centred)[0], atol=1e-6)
  np.testing.assert_allclose(np.asarray(blocked)[1, :5], np.asarray(centred)[1, :5], atol=1e-6)
  q, k, v = heads(rng, length=30)
  mask = jnp.ones((2, 30), bool)
  blocked = np.asarray(ThesisLocalAttention(9).apply({}, q, k, v, mask))   # buckets of 3
  centred = np.asarray(LocalAttention(9, implementation="xla").apply({}, q, k, v, mask))
  assert np.abs(blocked - centred).max() > 1e-3


def test_fairseqs_subsampler_equals_the_masked_one_on_an_unpadded_batch():
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(2, 21, 12)), jnp.float32)
  lengths = jnp.array([21, 21])
  masked, unmasked = Conv1dSubsampler(24, 16), Conv1dSubsampler(24, 16, masks_padding=False)
  params = masked.init(jax.random.PRNGKey(0), x, lengths)
  np.testing.assert_allclose(unmasked.apply(params, x, lengths)[0],
                             masked.apply(params, x, lengths)[0], atol=1e-6)
  short = jnp.array([21, 13])
  assert np.abs(np.asarray(unmasked.apply(params, x, short)[0][1, :4]
                           - masked.apply(params, x, short)[0][1, :4])).max() > 1e-4


def test_head_groups_of_a_thesis_layer_map_back_to_its_channel_order():
  layer = parse_layout("1x(1*conv(5,2,thesis)+1*local(9,thesis)+2*kernel(thesis)+1*full)")[0]
  heads_order, modules = thesis.thesis_head_order(layer)
  assert heads_order == [4, 3, 1, 2, 0] and modules == [3, 2, 1, 0]
