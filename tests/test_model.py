"""The whole model: sizes, subsampler arithmetic, positions, padding invariance, decoding."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import s2t_transformer_s, s2t_v2
from multiformer_jax import ModelConfig, build_model, count_params, init_cache, init_params
from multiformer_jax.model.positions import padded_positions
from multiformer_jax.model.subsampler import Conv1dSubsampler

RNG = np.random.default_rng(0)

TINY = dict(dtype="float32",      # the numpy references are float32, on every backend
            vocab_size=37, input_dim=12, d_model=32, ffn_dim=48, encoder_layers=3,
            decoder_layers=2, encoder_heads=4, decoder_heads=2, conv_channels=24,
            encoder_layout="1x(4*full) 1x(1*local(5)+1*kernel(16)+2*conv(5,2)) "
                           "1x(2*local(3,2)+2*conv(3,1,separable))",
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def tiny_model_factory(base: dict):
  """-> tiny_model(**overrides): (model, params) of ModelConfig(**base, **overrides), built
  once per set of overrides."""
  @functools.lru_cache(maxsize=None)
  def build(overrides):
    model = build_model(ModelConfig(**{**base, **dict(overrides)}))
    return model, init_params(model, jax.random.PRNGKey(0))
  return lambda **overrides: build(tuple(sorted(overrides.items())))


tiny_model = tiny_model_factory(TINY)   # a 3-layer model with every head kind


def jitted_apply(model):
  """model.apply compiled (eager op-by-op dispatch is much slower than compiling)."""
  return jax.jit(model.apply, static_argnames=("method", "deterministic"))


def test_s2t_transformer_s_has_31_072_256_parameters():
  # conv subsampler 1,721,856 + 12 encoder layers x 1,315,072 + 6 decoder layers x 1,578,752
  # + 2 final LayerNorms + embedding and output projection 2 x 8000 x 256.
  model = build_model(s2t_transformer_s.get_config())
  params = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
  assert count_params(params) == 31_072_256


def test_thesis_v2_builds_with_its_layout():
  config = s2t_v2.get_config()
  model = build_model(config)
  params = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
  layer0 = params["encoder"]["layers_0"]["self_attn"]
  # Local heads have no parameters of their own; the conv group owns its K and V convs.
  assert set(layer0) == {"q_proj", "k_proj", "v_proj", "out_proj", "group1_conv"}
  assert "bias" not in layer0["q_proj"]            # the thesis code has no q/k/v bias
  assert layer0["group1_conv"]["conv_k"]["conv"]["kernel"].shape == (5, 1, 64)


@pytest.mark.parametrize("strides", [(2, 2), (1, 1)])
def test_subsampler_lengths(strides):
  module = Conv1dSubsampler(channels=8, out_dim=6, kernels=(5, 5), strides=strides)
  params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 9, 4)), jnp.array([9]))
  for length in list(range(1, 40)) + [100, 1001, 3000]:
    x = jax.ShapeDtypeStruct((1, length, 4), jnp.float32)
    out, _ = jax.eval_shape(module.apply, params, x, jnp.array([length]))
    assert out.shape[1] == fairseq_lengths(length, strides), length
  # The lengths the module returns for a padded batch are those of each utterance alone.
  _, lengths = module.apply(params, jnp.ones((3, 40, 4)), jnp.array([40, 23, 1]))
  assert lengths.tolist() == [fairseq_lengths(n, strides) for n in (40, 23, 1)]


def fairseq_lengths(length: int, strides) -> int:
  for s in strides:
    length = (length - 1) // s + 1           # fairseq: floor((L - 1) / s) + 1 per layer
  return length


def test_subsampler_rezeroes_padding_between_convs():
  module = Conv1dSubsampler(channels=8, out_dim=6)
  x = jnp.asarray(RNG.normal(size=(2, 30, 4)), jnp.float32)
  params = module.init(jax.random.PRNGKey(0), x, jnp.array([30, 17]))
  out, lengths = module.apply(params, x, jnp.array([30, 17]))
  alone, _ = module.apply(params, x[1:, :17], jnp.array([17]))
  n = int(lengths[1])
  np.testing.assert_allclose(out[1, :n], alone[0], atol=1e-6)
  assert np.all(np.asarray(out[1, n:]) == 0)


def test_sinusoids_follow_fairseq_layout():
  dim, mask = 8, jnp.array([[True, True, True, False]])
  emb = np.asarray(padded_positions(mask, dim))
  half = dim // 2
  freqs = np.exp(np.arange(half) * -(np.log(10000) / (half - 1)))
  for t in range(3):
    angles = (t + 2) * freqs                       # fairseq position = t + padding_idx + 1
    np.testing.assert_allclose(emb[0, t], np.concatenate([np.sin(angles), np.cos(angles)]),
                               atol=1e-5)
  assert np.all(emb[0, 3] == 0)


def assert_encoder_padding_invariant(model, params):
  """Each utterance encoded in a padded batch equals it encoded alone; pads encode to 0."""
  lengths = [57, 40, 9]
  feats = jnp.asarray(RNG.normal(size=(3, 57, 12)), jnp.float32)
  apply = jitted_apply(model)
  enc, mask = apply({"params": params}, feats, jnp.array(lengths), method=model.encode)
  for b, n in enumerate(lengths):
    alone, alone_mask = apply({"params": params}, feats[b:b + 1, :n], jnp.array([n]),
                                    method=model.encode)
    m = int(alone_mask.sum())
    assert int(mask[b].sum()) == m
    np.testing.assert_allclose(enc[b, :m], alone[0, :m], atol=1e-5)
  assert np.all(np.asarray(enc)[~np.asarray(mask)] == 0)


def test_encoder_is_padding_invariant():
  assert_encoder_padding_invariant(*tiny_model())


def assert_cached_decoding_equals_teacher_forcing(model, params):
  """Step-by-step decoding from `encode` gives the teacher-forced call's logits -> the latter's
  mutable collections (the sown CTC logits of a model with a CTC head)."""
  lengths = jnp.array([33, 20])
  feats = jnp.asarray(RNG.normal(size=(2, 33, 12)), jnp.float32)
  tokens = jnp.asarray(RNG.integers(4, 37, size=(2, 7)), jnp.int32).at[:, 0].set(2)
  variables = {"params": params}
  apply = jitted_apply(model)
  forced, sown = jax.jit(functools.partial(model.apply, mutable=["ctc"]))(
      variables, feats, lengths, tokens)                                    # [2, 7, vocab]
  enc, mask = apply(variables, feats, lengths, method=model.encode)
  cross = apply(variables, enc, method=model.cross_kv)
  cache = init_cache(model, 2, 10)
  step = jax.jit(lambda tok, i, c: model.apply(variables, tok, i, c, cross, mask,
                                               method=model.decode_step))
  for i in range(7):
    logits, cache = step(tokens[:, i:i + 1], i, cache)
    np.testing.assert_allclose(logits, forced[:, i], atol=1e-4, rtol=1e-4)
  return feats, lengths, mask, sown


def test_cached_decoding_equals_teacher_forcing():
  assert_cached_decoding_equals_teacher_forcing(*tiny_model())


def test_beams_share_the_utterance_cross_attention():
  """Queries of batch*beams hypotheses against per-utterance K/V == tiling K/V per beam."""
  model, params = tiny_model()
  variables = {"params": params}
  apply = jitted_apply(model)
  feats = jnp.asarray(RNG.normal(size=(2, 25, 12)), jnp.float32)
  enc, mask = apply(variables, feats, jnp.array([25, 14]), method=model.encode)
  beams = 3
  tokens = jnp.asarray(RNG.integers(4, 37, size=(2 * beams, 1)), jnp.int32)
  cross = apply(variables, enc, method=model.cross_kv)
  shared, _ = apply(variables, tokens, 0, init_cache(model, 2 * beams, 4), cross, mask,
                    method=model.decode_step)
  tiled_enc = jnp.repeat(enc, beams, axis=0)
  tiled_cross = apply(variables, tiled_enc, method=model.cross_kv)
  tiled, _ = apply(variables, tokens, 0, init_cache(model, 2 * beams, 4), tiled_cross,
                         jnp.repeat(mask, beams, axis=0), method=model.decode_step)
  np.testing.assert_allclose(shared, tiled, atol=1e-5)


def test_decoder_padding_does_not_change_logits():
  model, params = tiny_model()
  variables = {"params": params}
  feats = jnp.asarray(RNG.normal(size=(1, 20, 12)), jnp.float32)
  tokens = jnp.array([[2, 5, 6, 7]])
  padded = jnp.array([[2, 5, 6, 7, 1, 1]])
  apply = jitted_apply(model)
  a = apply(variables, feats, jnp.array([20]), tokens)
  b = apply(variables, feats, jnp.array([20]), padded)
  np.testing.assert_allclose(a[0], b[0, :4], atol=1e-5)


def test_dropout_is_active_only_in_training():
  model, params = tiny_model(dropout=0.3, attention_dropout=0.3, activation_dropout=0.3)
  feats = jnp.asarray(RNG.normal(size=(1, 20, 12)), jnp.float32)
  tokens = jnp.array([[2, 5, 6, 7]])
  apply = jitted_apply(model)
  run = lambda det, key: apply({"params": params}, feats, jnp.array([20]), tokens,
                               deterministic=det, rngs={"dropout": jax.random.PRNGKey(key)})
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert not np.allclose(run(False, 0), run(False, 1))


def test_bfloat16_compute_keeps_float32_parameters():
  from multiformer_jax.training.loss import label_smoothed_nll
  feats = jnp.asarray(RNG.normal(size=(2, 40, 12)), jnp.float32)
  prev, targets = jnp.array([[2, 5, 6, 7], [2, 8, 9, 1]]), jnp.array([[5, 6, 7, 2], [8, 9, 2, 1]])
  losses = {}
  for dtype in ("float32", "bfloat16"):
    model, params = tiny_model(dtype=dtype)
    loss = lambda p: label_smoothed_nll(model.apply({"params": p}, feats, jnp.array([40, 30]),
                                                    prev), targets, 0.1)[0]
    losses[dtype], grads = jax.jit(jax.value_and_grad(loss))(params)
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype("float32")}
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))
  np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=0.02)
