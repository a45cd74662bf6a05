"""fairseq's S2T convolutional subsampler: Conv1d + GLU layers over the fbank frames."""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue
from multiformer_jax.model.attention.masks import conv_output_lengths, lengths_to_mask
from multiformer_jax.model.initializers import torch_default_bias, torch_default_kernel


class Conv1dSubsampler(nn.Module):
  """[batch, frames, in_dim], lengths -> [batch, frames', out_dim], lengths'.

  Layer i: Conv1d(kernel k_i, stride s_i, padding k_i//2) to `channels` (the last layer to
  2*out_dim) then GLU over channels, halving them. With `masks_padding` padded frames are
  zeroed before each conv, so an utterance's output does not depend on what it is batched
  with; without, only the input's padding is zero, as in fairseq, where the first conv's
  output over the padding reaches the last valid frames through the next conv, and the output
  at padded positions is kept (the thesis's unmasked heads read it). Stride 1
  everywhere gives the thesis's no-downsampling variants.
  """
  channels: int = 1024
  out_dim: int = 256
  kernels: Sequence[int] = (5, 5)
  strides: Sequence[int] = (2, 2)
  dtype: jnp.dtype = jnp.float32
  masks_padding: bool = True

  @nn.compact
  def __call__(self, x, lengths):
    if len(self.kernels) != len(self.strides):
      raise InvalidValue(f"subsampler kernels {tuple(self.kernels)} and strides "
                       f"{tuple(self.strides)} must have the same length")
    for i, (kernel, stride) in enumerate(zip(self.kernels, self.strides)):
      if i == 0 or self.masks_padding:
        x = x * lengths_to_mask(lengths, x.shape[1])[..., None].astype(x.dtype)
      out_channels = self.channels if i < len(self.kernels) - 1 else 2 * self.out_dim
      pad = kernel // 2
      x = nn.Conv(out_channels, (kernel,), strides=(stride,), padding=[(pad, pad)],
                  kernel_init=torch_default_kernel,
                  bias_init=torch_default_bias(x.shape[-1] * kernel), dtype=self.dtype,
                  name=f"conv_layers_{i}")(x)
      x = nn.glu(x, axis=-1)                      # [batch, frames_i, out_channels // 2]
      lengths = conv_output_lengths(lengths, kernel, stride, pad)
    if self.masks_padding:
      x = x * lengths_to_mask(lengths, x.shape[1])[..., None].astype(x.dtype)
    return x, lengths
