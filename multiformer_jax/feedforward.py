"""The position-wise feed-forward block of a pre-LN Transformer layer (without its LN)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from multiformer_jax.dropout import Dropout, dropout
from multiformer_jax.initializers import torch_default_bias, torch_default_kernel


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


class FeedForward(nn.Module):
  """fc1 -> relu -> activation dropout -> fc2 -> dropout (fairseq; PyTorch default init).

  token_chunk > 0 computes it `token_chunk` tokens at a time with the hidden activations
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
    if self.token_chunk:
      fc1 = DenseParams(self.d_model, self.ffn_dim, name="fc1")()
      fc2 = DenseParams(self.ffn_dim, self.d_model, name="fc2")()
      training = not deterministic and (self.dropout > 0.0 or self.activation_dropout > 0.0)
      rng = self.make_rng("dropout") if training else jax.random.PRNGKey(0)
      return chunked_feedforward(x, fc1, fc2, self.token_chunk,
                                 0.0 if deterministic else self.activation_dropout,
                                 0.0 if deterministic else self.dropout, rng, self.dtype)
    h = nn.Dense(self.ffn_dim, kernel_init=torch_default_kernel,
                 bias_init=torch_default_bias(self.d_model), dtype=self.dtype, name="fc1")(x)
    h = Dropout(self.activation_dropout)(nn.relu(h), deterministic=deterministic)
    h = nn.Dense(self.d_model, kernel_init=torch_default_kernel,
                 bias_init=torch_default_bias(self.ffn_dim), dtype=self.dtype, name="fc2")(h)
    return Dropout(self.dropout)(h, deterministic=deterministic)


def layer_norm(name: str) -> nn.LayerNorm:
  """torch.nn.LayerNorm(eps=1e-5) with the exact (two-pass) variance."""
  return nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name=name)
