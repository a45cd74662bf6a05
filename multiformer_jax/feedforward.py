"""The position-wise feed-forward block of a pre-LN Transformer layer (without its LN)."""

import flax.linen as nn
import jax.numpy as jnp

from multiformer_jax.initializers import torch_default_bias, torch_default_kernel


class FeedForward(nn.Module):
  """fc1 -> relu -> activation dropout -> fc2 -> dropout (fairseq; PyTorch default init)."""
  d_model: int
  ffn_dim: int
  dropout: float = 0.0
  activation_dropout: float = 0.0
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    h = nn.Dense(self.ffn_dim, kernel_init=torch_default_kernel,
                 bias_init=torch_default_bias(self.d_model), dtype=self.dtype, name="fc1")(x)
    h = nn.Dropout(self.activation_dropout)(nn.relu(h), deterministic=deterministic)
    h = nn.Dense(self.d_model, kernel_init=torch_default_kernel,
                 bias_init=torch_default_bias(self.ffn_dim), dtype=self.dtype, name="fc2")(h)
    return nn.Dropout(self.dropout)(h, deterministic=deterministic)


def layer_norm(name: str) -> nn.LayerNorm:
  """torch.nn.LayerNorm(eps=1e-5) with the exact (two-pass) variance."""
  return nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name=name)
