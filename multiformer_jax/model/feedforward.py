"""The position-wise feed-forward block of a pre-LN Transformer layer (without its LN)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.dropout import dropout
from multiformer_jax.model.initializers import torch_default_bias, torch_default_kernel


class DenseParams(nn.Module):
  """The kernel [in, out] and bias [out] of an nn.Dense (same names, shapes and initialisers,
  so the parameters and checkpoints of both forms are interchangeable)."""
  in_features: int
  features: int

  @nn.compact
  def __call__(self):
    kernel = self.param("kernel", torch_default_kernel, (self.in_features, self.features))
    bias = self.param("bias", torch_default_bias(self.in_features), (self.features,))
    return kernel, bias


def chunked_feedforward(x, fc1, fc2, token_chunk: int, activation_dropout: float,
                        output_dropout: float, rng, dtype):
  """fc1 -> relu -> dropout -> fc2 -> dropout over chunks of `token_chunk` tokens.

  x: [batch, time, d_model] -> [batch, time, d_model]. A `lax.scan` over the chunks with a
  checkpointed body: the backward recomputes each chunk's [token_chunk, ffn_dim] hidden
  activations instead of keeping [batch * time, ffn_dim] of them per layer. (Inside a loop the
  recomputation stays in the backward; XLA:CPU merges a plain `jax.checkpoint` back into the
  forward.) Dropout masks come from fold_in(rng, chunk index), so the recomputation draws the
  forward's masks.
  """
  batch, length, d_model = x.shape
  tokens = batch * length
  num_chunks = -(-tokens // token_chunk)
  flat = jnp.pad(x.reshape(tokens, d_model), [(0, num_chunks * token_chunk - tokens), (0, 0)])
  chunks = flat.reshape(num_chunks, token_chunk, d_model)      # [chunks, token_chunk, d_model]
  (w1, b1), (w2, b2) = ((w.astype(dtype), b.astype(dtype)) for w, b in (fc1, fc2))

  @jax.checkpoint
  def chunk_output(index, chunk):
    key = jax.random.fold_in(rng, index)
    h = jax.nn.relu(chunk.astype(dtype) @ w1 + b1)             # [token_chunk, ffn_dim]
    h = dropout(h, activation_dropout, jax.random.fold_in(key, 0))
    return dropout(h @ w2 + b2, output_dropout, jax.random.fold_in(key, 1))

  _, out = lax.scan(lambda carry, xs: (carry, chunk_output(*xs)), None,
                    (jnp.arange(num_chunks), chunks))
  return out.reshape(num_chunks * token_chunk, d_model)[:tokens].reshape(batch, length, d_model)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def feedforward(x, w1, b1, w2, b2, activation_dropout: float, output_dropout: float, keys):
  """dropout(relu(x @ w1 + b1)) @ w2 + b2, then dropout: x [tokens, d_model] -> [tokens, d_model].

  keys: the (hidden, output) dropout keys; a rate of 0 draws nothing. A custom VJP whose only
  [tokens, ffn_dim] residual is the dropped hidden layer itself: relu's derivative and the
  hidden dropout mask are both read off it (an entry is > 0 exactly where the unit was active
  and kept), so the backward neither recomputes fc1 nor redraws that mask (XLA's autodiff of the
  same expression hashed the mask again in each fusion that read it); only the [tokens,
  d_model] output mask is redrawn. Gradients equal autodiff's (tests/test_blockwise.py).
  """
  return _feedforward_fwd(x, w1, b1, w2, b2, activation_dropout, output_dropout, keys)[0]


def _feedforward_fwd(x, w1, b1, w2, b2, activation_dropout, output_dropout, keys):
  hidden = dropout(jax.nn.relu(x @ w1 + b1), activation_dropout, keys[0])  # [tokens, ffn_dim]
  out = dropout(hidden @ w2 + b2, output_dropout, keys[1])
  return out, (x, hidden, w1, w2, keys)


def _feedforward_bwd(activation_dropout, output_dropout, residuals, d_out):
  x, hidden, w1, w2, keys = residuals
  d_y = dropout(d_out, output_dropout, keys[1])       # the same mask and 1 / (1 - rate)
  d_hidden = d_y @ w2.T                                # [tokens, ffn_dim]
  if activation_dropout == 1.0:
    d_pre = jnp.zeros_like(d_hidden)
  else:
    d_pre = jnp.where(hidden > 0, d_hidden / (1.0 - activation_dropout), 0).astype(d_hidden.dtype)
  return (d_pre @ w1.T, x.T @ d_pre, d_pre.sum(0), hidden.T @ d_y, d_y.sum(0), None)


feedforward.defvjp(_feedforward_fwd, _feedforward_bwd)


class _DropoutKey(nn.Module):
  """The key a flax.linen.Dropout of the same name would draw (same scope, same make_rng), so
  that the unchunked FFN keeps the masks of the Dropout_0 / Dropout_1 modules it replaced."""

  @nn.compact
  def __call__(self):
    return self.make_rng("dropout")


class FeedForward(nn.Module):
  """fc1 -> relu -> activation dropout -> fc2 -> dropout (fairseq; PyTorch default init).

  Unchunked (token_chunk 0) it is `feedforward`, whose backward keeps only the dropped hidden
  layer. token_chunk > 0 computes it `token_chunk` tokens at a time with the hidden activations
  recomputed in the backward (chunked_feedforward): same parameters and outputs, O(chunk x
  ffn_dim) activation memory instead of O(batch x time x ffn_dim), other dropout draws.
  """
  d_model: int
  ffn_dim: int
  dropout: float = 0.0
  activation_dropout: float = 0.0
  dtype: jnp.dtype = jnp.float32
  token_chunk: int = 0

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    for name, rate in (("dropout", self.dropout), ("activation_dropout", self.activation_dropout)):
      if not 0.0 <= rate <= 1.0:
        raise InvalidValue(f"FeedForward {name} must be in [0, 1], got {rate}")
    fc1 = DenseParams(self.d_model, self.ffn_dim, name="fc1")()
    fc2 = DenseParams(self.ffn_dim, self.d_model, name="fc2")()
    activation_rate = 0.0 if deterministic else self.activation_dropout
    output_rate = 0.0 if deterministic else self.dropout
    if self.token_chunk:
      training = activation_rate > 0.0 or output_rate > 0.0
      rng = self.make_rng("dropout") if training else jax.random.PRNGKey(0)
      return chunked_feedforward(x, fc1, fc2, self.token_chunk, activation_rate, output_rate,
                                 rng, self.dtype)
    keys = (_DropoutKey(name="Dropout_0")() if activation_rate else None,
            _DropoutKey(name="Dropout_1")() if output_rate else None)
    (w1, b1), (w2, b2) = ((w.astype(self.dtype), b.astype(self.dtype)) for w, b in (fc1, fc2))
    flat = x.astype(self.dtype).reshape(-1, self.d_model)            # [tokens, d_model]
    out = feedforward(flat, w1, b1, w2, b2, activation_rate, output_rate, keys)
    return out.reshape(x.shape[:-1] + (self.d_model,))


def layer_norm(name: str) -> nn.LayerNorm:
  """torch.nn.LayerNorm(eps=1e-5) with the exact (two-pass) variance."""
  return nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name=name)
