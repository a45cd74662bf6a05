"""Joint CTC/attention decoding: the CTC prefix scores against a transcription of ESPnet's
`CTCPrefixScore` and a brute-force sum over alignments, and the beam search that uses them."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from multiformer_jax.evaluation import ctc_prefix
from multiformer_jax.evaluation.decode import beam_search
from multiformer_jax.evaluation.inference import make_beam_search
from multiformer_jax.model import S2TModel, init_params
from multiformer_jax.model.model_config import ModelConfig

BLANK, PAD, EOS = 0, 1, 2


class EspnetCTCPrefixScore:
  """espnet/nets/ctc_prefix_score.py `CTCPrefixScore` (numpy, one hypothesis), transcribed."""

  def __init__(self, x, blank, eos):
    self.logzero = -10000000000.0
    self.blank, self.eos = blank, eos
    self.input_length = len(x)
    self.x = x

  def initial_state(self):
    r = np.full((self.input_length, 2), self.logzero, dtype=np.float32)
    r[0, 1] = self.x[0, self.blank]
    for i in range(1, self.input_length):
      r[i, 1] = r[i - 1, 1] + self.x[i, self.blank]
    return r

  def __call__(self, y, cs, r_prev):
    output_length = len(y) - 1  # ignore sos
    r = np.ndarray((self.input_length, 2, len(cs)), dtype=np.float32)
    xs = self.x[:, cs]
    if output_length == 0:
      r[0, 0] = xs[0]
      r[0, 1] = self.logzero
    else:
      r[output_length - 1] = self.logzero
    r_sum = np.logaddexp(r_prev[:, 0], r_prev[:, 1])
    last = y[-1]
    if output_length > 0 and last in cs:
      log_phi = np.ndarray((self.input_length, len(cs)), dtype=np.float32)
      for i in range(len(cs)):
        log_phi[:, i] = r_sum if cs[i] != last else r_prev[:, 1]
    else:
      log_phi = r_sum[:, None]
    start = max(output_length, 1)
    log_psi = r[start - 1, 0]
    for t in range(start, self.input_length):
      r[t, 0] = np.logaddexp(r[t - 1, 0], log_phi[t - 1]) + xs[t]
      r[t, 1] = np.logaddexp(r[t - 1, 0], r[t - 1, 1]) + self.x[t, self.blank]
      log_psi = np.logaddexp(log_psi, log_phi[t - 1] + xs[t])
    eos_pos = np.where(cs == self.eos)[0]
    if len(eos_pos) > 0:
      log_psi[eos_pos] = r_sum[-1]
    blank_pos = np.where(cs == self.blank)[0]
    if len(blank_pos) > 0:
      log_psi[blank_pos] = self.logzero
    return log_psi, np.rollaxis(r, 2)


def random_log_probs(rng, batch, frames, vocab):
  logits = rng.normal(size=(batch, frames, vocab)).astype(np.float32) * 2
  return np.asarray(jax.nn.log_softmax(logits))


def test_prefix_scores_match_espnet_step_by_step_with_padding():
  rng = np.random.default_rng(0)
  frames, vocab = 9, 6
  lengths = np.array([9, 6])                         # the second utterance is padded by 3
  log_probs = random_log_probs(rng, 2, frames, vocab)
  paths = [[3, 3, 4, 5], [4, 5, 5, 3]]               # repeats exercise the blank-only rule
  x, r = ctc_prefix.initial_state(jnp.asarray(log_probs), jnp.asarray(lengths), BLANK)
  r = r[:, None]                                       # k = 1 hypothesis per utterance
  cs = np.arange(vocab)
  refs = [EspnetCTCPrefixScore(log_probs[b, :lengths[b]], BLANK, EOS) for b in range(2)]
  ref_r = [ref.initial_state() for ref in refs]
  for step in range(len(paths[0])):
    last = jnp.asarray([[paths[b][step - 1] if step else EOS] for b in range(2)])
    ids = jnp.broadcast_to(jnp.asarray(cs), (2, 1, vocab))
    psi, r_all = ctc_prefix.extend(x, r, last, step, ids, BLANK, EOS)
    for b in range(2):
      y = [EOS] + paths[b][:step]
      ref_psi, ref_r_all = refs[b](y, cs, ref_r[b])
      ours = np.asarray(psi[b, 0])
      finite = ref_psi > -1e9
      np.testing.assert_array_equal(np.isfinite(ours), finite)
      np.testing.assert_allclose(ours[finite], ref_psi[finite], rtol=1e-5, atol=1e-4)
      token = paths[b][step]
      # Forward variables of the chosen extension, on the utterance's own frames from the
      # first frame ESPnet defines (it leaves the rows before max(step, 1) - 1 unset).
      ours_r = np.asarray(r_all[b, 0, token, :lengths[b]])
      theirs = ref_r_all[token]
      rows = slice(max(step, 1) - 1, None)
      both = np.maximum(ours_r[rows], -1e9)
      np.testing.assert_allclose(both, np.maximum(theirs[rows], -1e9), rtol=1e-5, atol=1e-4)
      ref_r[b] = theirs
    r = jnp.stack([r_all[b, 0, paths[b][step]] for b in range(2)])[:, None]


def collapse(path):
  out = []
  for i, token in enumerate(path):
    if token != BLANK and (i == 0 or token != path[i - 1]):
      out.append(token)
  return tuple(out)


def test_prefix_scores_are_sums_over_alignments_and_eos_gives_the_ctc_likelihood():
  rng = np.random.default_rng(1)
  frames, vocab = 5, 5
  log_probs = random_log_probs(rng, 1, frames, vocab)[0]
  prefix_mass, exact_mass = {}, {}
  for path in itertools.product(range(vocab), repeat=frames):
    p = np.exp(sum(log_probs[t, s] for t, s in enumerate(path)))
    labels = collapse(path)
    exact_mass[labels] = exact_mass.get(labels, 0.0) + p
    for n in range(len(labels) + 1):
      prefix_mass[labels[:n]] = prefix_mass.get(labels[:n], 0.0) + p
  x, r = ctc_prefix.initial_state(jnp.asarray(log_probs[None]), jnp.asarray([frames]), BLANK)
  r = r[:, None]
  ids = jnp.arange(vocab)[None, None]
  for h in [(), (3,), (3, 3), (3, 4), (4, 3, 4)]:
    r_h = r
    for n, token in enumerate(h):                        # walk the prefix up
      _, r_all = ctc_prefix.extend(x, r_h, jnp.asarray([[h[n - 1] if n else EOS]]), n, ids,
                                   BLANK, EOS)
      r_h = r_all[:, :, token]
    last = jnp.asarray([[h[-1] if h else EOS]])
    psi = np.asarray(ctc_prefix.extend(x, r_h, last, len(h), ids, BLANK, EOS)[0][0, 0])
    for c in range(vocab):
      if c == BLANK:
        assert psi[c] == -np.inf
      elif c == EOS:         # EOS: the hypothesis h as a whole
        np.testing.assert_allclose(np.exp(psi[c]), exact_mass.get(h, 0.0), rtol=1e-5)
      else:
        np.testing.assert_allclose(np.exp(psi[c]), prefix_mass.get(h + (c,), 0.0), rtol=1e-5,
                                   atol=1e-12)
    if h:                    # and EOS's score is optax's CTC log-likelihood of h
      labels = jnp.asarray([list(h)])
      nll = optax.ctc_loss(jnp.asarray(log_probs[None]), jnp.zeros((1, frames)), labels,
                           jnp.zeros((1, len(h))), blank_id=BLANK)
      np.testing.assert_allclose(psi[EOS], -float(nll[0]), rtol=1e-5)


def constant_decoder(log_probs):
  """step_fn whose log-probs are the same at every step: a decoder that ignores the audio."""
  logits = jnp.log(jnp.asarray(log_probs, jnp.float32))

  def step_fn(tokens, i, cache):
    return jnp.broadcast_to(logits, (tokens.shape[0], logits.shape[0])), cache
  return step_fn


def test_ctc_removes_the_attention_decoders_repetitions():
  # The attention decoder babbles token 3 forever; the CTC head hears "3 4" in 6 frames.
  vocab, beam, steps = 6, 2, 8
  att = np.array([1e-6, 1e-6, 0.05, 0.6, 0.3, 0.05])
  frames = [3, 3, BLANK, 4, BLANK, BLANK]
  ctc_probs = np.full((1, 6, vocab), 0.01)
  for t, s in enumerate(frames):
    ctc_probs[0, t, s] = 1.0 - 0.01 * (vocab - 1)
  ctc = (jnp.log(jnp.asarray(ctc_probs, jnp.float32)), jnp.asarray([6]), 0.5, BLANK)

  def search(ctc):
    tokens, _ = jax.jit(lambda: beam_search(
        constant_decoder(att), jnp.zeros((beam, 1)), 1, beam, steps, jnp.asarray([steps - 1]),
        vocab, EOS, PAD, BLANK, 1.0, ctc=ctc))()
    return [int(t) for t in np.asarray(tokens[0]) if t != PAD]
  assert search(None) == [3] * (steps - 1)
  assert search(ctc) == [3, 4]
  with pytest.raises(ValueError, match="ctc weight 1.5"):
    search(ctc[:2] + (1.5, BLANK))


def tiny_model():
  cfg = ModelConfig(dtype="float32", vocab_size=12, input_dim=8, d_model=16, ffn_dim=32,
                    encoder_layers=1, decoder_layers=1, encoder_layout="1x(4*full)",
                    conv_kernels=(3,), conv_strides=(2,), conv_channels=16, dropout=0.0,
                    attention_dropout=0.0, activation_dropout=0.0, max_target_positions=32,
                    ctc_head=True)
  model = S2TModel(cfg)
  return model, init_params(model, jax.random.PRNGKey(3))


def test_joint_score_is_the_weighted_attention_and_ctc_likelihoods_and_padding_free():
  model, params = tiny_model()
  weight, beam = 0.4, 3
  rng = np.random.default_rng(2)
  features = rng.normal(size=(2, 20, 8)).astype(np.float32) * 3
  lengths = np.array([20, 13])
  translate = make_beam_search(model, beam, 1.0, 0.0, 6, nbest=True, ctc_weight=weight)
  tokens, scores = translate(params, jnp.asarray(features), jnp.asarray(lengths))
  for b in range(2):
    alone_tokens, alone_scores = translate(params, jnp.asarray(features[b:b + 1, :lengths[b]]),
                                           jnp.asarray(lengths[b:b + 1]))
    np.testing.assert_array_equal(np.asarray(alone_tokens[0]), np.asarray(tokens[b]))
    np.testing.assert_allclose(np.asarray(alone_scores[0]), np.asarray(scores[b]), rtol=1e-4)
    for k in range(beam):
      hyp = [int(t) for t in np.asarray(tokens[b, k]) if t != PAD]
      target = jnp.asarray([hyp + [EOS]])
      prev = jnp.asarray([[EOS] + hyp])
      feats, lens = jnp.asarray(features[b:b + 1, :lengths[b]]), jnp.asarray(lengths[b:b + 1])
      logits = model.apply({"params": params}, feats, lens, prev)
      att = float(jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), target[..., None],
                                              axis=-1)))
      encoded, mask = model.apply({"params": params}, feats, lens, method=model.encode)
      ctc_logp = model.apply({"params": params}, encoded, method=model.ctc_log_probs)
      nll = optax.ctc_loss(ctc_logp, 1.0 - mask.astype(jnp.float32), jnp.asarray([hyp]),
                           jnp.zeros((1, len(hyp))), blank_id=BLANK)
      expected = ((1 - weight) * att - weight * float(nll[0])) / (len(hyp) + 1)
      np.testing.assert_allclose(float(scores[b, k]), expected, rtol=1e-4, atol=1e-4)


def test_a_model_without_a_ctc_head_decodes_with_attention_alone():
  model, params = tiny_model()
  plain = S2TModel(model.config.__class__(**{**model.config.to_dict(), "ctc_head": False}))
  features, lengths = jnp.ones((1, 12, 8)), jnp.asarray([12])
  with_weight = make_beam_search(plain, 2, 1.0, 0.0, 5, ctc_weight=0.3)
  without = make_beam_search(plain, 2, 1.0, 0.0, 5)
  np.testing.assert_array_equal(np.asarray(with_weight(params, features, lengths)),
                                np.asarray(without(params, features, lengths)))
  with pytest.raises(ValueError, match="eval.ctc_weight=1.2"):
    make_beam_search(model, 2, 1.0, 0.0, 5, ctc_weight=1.2)
