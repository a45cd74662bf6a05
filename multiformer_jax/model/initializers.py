"""fairseq / PyTorch parameter initialisation, so that a model trained here starts where a
fairseq model starts (REFERENCE §1)."""

import jax
import jax.numpy as jnp
from flax import linen as nn

# PyTorch's default Linear/Conv init: kaiming_uniform(a=sqrt(5)) == U(+-1/sqrt(fan_in)).
torch_default_kernel = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
# fairseq MultiheadAttention: xavier_uniform with gain 1/sqrt(2) for q/k/v, gain 1 for out_proj.
xavier_uniform_qkv = nn.initializers.variance_scaling(0.5, "fan_avg", "uniform")
xavier_uniform = nn.initializers.xavier_uniform()


def torch_default_bias(fan_in: int):
  """PyTorch's default bias init for a layer with `fan_in` inputs: U(+-1/sqrt(fan_in))."""
  bound = fan_in ** -0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def embedding_normal(dim: int, pad_id: int):
  """fairseq Embedding: N(0, dim^-1/2) with the padding row zero."""
  def init(key, shape, dtype=jnp.float32):
    table = jax.random.normal(key, shape, dtype) * dim ** -0.5
    return table.at[pad_id].set(0.0)
  return init
