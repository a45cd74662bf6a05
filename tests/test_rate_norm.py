"""Speaking-rate normalisation (evaluation/rate_norm.py) against numpy and plain decoding."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.evaluation import rate_norm
from multiformer_jax.evaluation.inference import make_beam_search, rate_norm_settings
from multiformer_common.token_ids import CTC_BLANK_ID
from multiformer_jax.model import S2TModel
from tests.test_ctc_prefix import tiny_model


def numpy_stretch(features, length, factor, out_frames):
  """One row resampled as numpy would: np.interp over a linspace of round(length * factor)."""
  new = max(length, int(np.floor(length * factor + 0.5)))
  positions = np.linspace(0, length - 1, new)
  out = np.zeros((out_frames, features.shape[1]), np.float32)
  for d in range(features.shape[1]):
    out[:new, d] = np.interp(positions, np.arange(length), features[:length, d])
  return out, new


def numpy_density(logits, valid):
  """Pieces of the CTC greedy path (repeats merged, blanks dropped) per valid position."""
  best = np.argmax(logits[:valid], axis=-1)
  pieces = [k for k, _ in itertools.groupby(best) if k != CTC_BLANK_ID]
  return len(pieces) / max(valid, 1)


def test_stretch_matches_numpy_interp_and_factor_one_is_exact():
  rng = np.random.default_rng(0)
  features = rng.normal(size=(4, 30, 5)).astype(np.float32)
  lengths = np.array([30, 17, 1, 9])
  factors = np.array([1.0, 1.37, 1.4, 1.15], np.float32)
  out_frames = rate_norm.stretched_frames(30, 1.4)
  assert out_frames == 42
  out, new_lengths = rate_norm.stretch_features(jnp.asarray(features), jnp.asarray(lengths),
                                                jnp.asarray(factors), out_frames)
  for b in range(4):
    expected, new = numpy_stretch(features[b], lengths[b], factors[b], out_frames)
    assert int(new_lengths[b]) == new
    np.testing.assert_allclose(np.asarray(out[b]), expected, rtol=1e-5, atol=1e-6)
  assert int(new_lengths[0]) == 30
  np.testing.assert_array_equal(np.asarray(out[0, :30]), features[0])    # bit for bit
  assert not np.asarray(out[0, 30:]).any()


def test_density_and_factors():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 12, 6)).astype(np.float32)
  logits[0, :, CTC_BLANK_ID] += 10.0                 # all blank: density 0
  valid = np.array([12, 7, 1])
  mask = np.arange(12)[None, :] < valid[:, None]
  density = np.asarray(rate_norm.greedy_density(jnp.asarray(logits), jnp.asarray(mask),
                                                CTC_BLANK_ID))
  np.testing.assert_allclose(density, [numpy_density(logits[b], valid[b]) for b in range(3)],
                             rtol=1e-6)
  assert density[0] == 0.0
  factors = rate_norm.stretch_factors(jnp.asarray([0.2, 0.6, 0.9]), 0.5, 1.4)
  np.testing.assert_allclose(np.asarray(factors), [1.0, 1.2, 1.4], rtol=1e-6)


def model_density(model, params, features, lengths):
  _, state = model.apply({"params": params}, features, lengths, True, method=model.encode,
                         mutable=["ctc"])
  logits, mask = state["ctc"]["logits"][0]
  valid = np.asarray(mask).sum(axis=1)
  return np.array([numpy_density(np.asarray(logits[b]), valid[b]) for b in range(len(valid))])


def test_search_reads_the_stretched_frames_of_the_dense_rows_only():
  model, params = tiny_model()
  rng = np.random.default_rng(2)
  features = (rng.normal(size=(4, 24, 8)) * 3).astype(np.float32)
  lengths = np.array([24, 19, 12, 7])
  density = model_density(model, params, jnp.asarray(features), jnp.asarray(lengths))
  assert density.max() > 0
  target, max_stretch = float(np.median(density[density > 0])) * 0.999, 1.3
  factors = np.clip(density / target, 1.0, max_stretch)
  assert (factors == 1.0).any() and (factors > 1.0).any()
  out_frames = rate_norm.stretched_frames(24, max_stretch)
  expected_features = np.zeros((4, out_frames, 8), np.float32)
  expected_lengths = np.zeros(4, np.int32)
  for b in range(4):
    expected_features[b], expected_lengths[b] = numpy_stretch(features[b], lengths[b],
                                                              factors[b], out_frames)
  plain = make_beam_search(model, 3, 1.0, 0.0, 6, nbest=True)
  normalised = make_beam_search(model, 3, 1.0, 0.0, 6, nbest=True, rate_norm_target=target,
                              rate_norm_max_stretch=max_stretch)
  want_tokens, want_scores = plain(params, jnp.asarray(expected_features),
                                   jnp.asarray(expected_lengths))
  tokens, scores = normalised(params, jnp.asarray(features), jnp.asarray(lengths))
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(want_tokens))
  np.testing.assert_allclose(np.asarray(scores), np.asarray(want_scores), rtol=1e-4, atol=1e-5)


def test_a_target_no_utterance_exceeds_decodes_as_without():
  model, params = tiny_model()
  rng = np.random.default_rng(4)
  features = jnp.asarray((rng.normal(size=(3, 20, 8)) * 3).astype(np.float32))
  lengths = jnp.asarray([20, 14, 9])
  plain = make_beam_search(model, 3, 1.0, 0.0, 6, nbest=True)
  # A greedy path emits at most one piece per position: density <= 1.
  normalised = make_beam_search(model, 3, 1.0, 0.0, 6, nbest=True, rate_norm_target=1.0,
                              rate_norm_max_stretch=1.4)
  (tokens, scores), (want_tokens, want_scores) = (normalised(params, features, lengths),
                                                  plain(params, features, lengths))
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(want_tokens))
  np.testing.assert_allclose(np.asarray(scores), np.asarray(want_scores), rtol=1e-4, atol=1e-5)


def test_bad_settings_name_the_value_and_what_is_valid():
  model, _ = tiny_model()
  with pytest.raises(ValueError, match=r"eval.rate_norm_target=-0.1.*positive"):
    make_beam_search(model, 2, 1.0, 0.0, 5, rate_norm_target=-0.1)
  with pytest.raises(ValueError, match=r"eval.rate_norm_max_stretch=0.5.*\[1, 4\]"):
    make_beam_search(model, 2, 1.0, 0.0, 5, rate_norm_target=0.5, rate_norm_max_stretch=0.5)
  plain = S2TModel(model.config.__class__(**{**model.config.to_dict(), "ctc_head": False}))
  with pytest.raises(ValueError, match=r"rate_norm_target=0.5.*has none"):
    make_beam_search(plain, 2, 1.0, 0.0, 5, rate_norm_target=0.5)


def test_settings_apply_to_the_listed_stages_and_are_off_by_default():
  from multiformer_jax import schema
  e = schema.base_config().eval
  assert rate_norm_settings(e, "asr")["rate_norm_target"] == 0.0      # off unless set
  e.rate_norm_target, e.rate_norm_max_stretch, e.rate_norm_stages = 0.5, 1.3, ("asr",)
  assert rate_norm_settings(e, "asr") == {"rate_norm_target": 0.5,
                                          "rate_norm_max_stretch": 1.3}
  assert rate_norm_settings(e, "st")["rate_norm_target"] == 0.0
  e.rate_norm_stages = ("nope",)
  with pytest.raises(ValueError, match="rate_norm_stages"):
    rate_norm_settings(e, "asr")
