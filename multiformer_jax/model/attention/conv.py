"""`conv(k,s[,type])` heads: keys and values compressed along time by a Conv1d.

Per head group, one Conv1d for K and one for V over the head_dim channels, shared by the heads
of the group (heads are folded into the batch, as the thesis code does). Queries are not
compressed. Padded frames are zeroed before the conv (the thesis code fed them in), the conv
pads k//2 zeros on each side, and compressed position o is a valid key iff it exists when the
utterance is convolved on its own: o < (len + 2*(k//2) - k)//s + 1. So an utterance's output
never depends on its padding. `conv(1,1)` with an identity kernel is exactly `full`.

`conv(k,s,thesis)` heads compute the thesis code's ConvAttention: K and V (padded frames
included, not zeroed) right-padded with zeros to k + s*ceil((T - k)/s) frames (T the batch's
length; k if T <= k), convolved with padding s//2, and compressed key o valid iff
o < (len + 2*(s//2) - k)//s + 1 for the utterance's own length. A short utterance can have no
valid compressed key: the reference's softmax gives NaN there, these heads give 0.
"""

import math

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from multiformer_jax.model.attention.full import attention_weights, key_masked_attention
from multiformer_jax.model.attention.masks import conv_output_lengths, lengths_to_mask
from multiformer_jax.model.dropout import Dropout
from multiformer_jax.model.initializers import torch_default_bias, torch_default_kernel


def depthwise_conv1d(x, kernel, bias, stride: int, pad: int):
  """A depthwise Conv1d as a sum over its taps: x [n, time, channels], kernel [taps, 1, channels]
  (nn.Conv's layout with one input channel per group), bias [channels] ->
  [n, (time + 2 pad - taps) // stride + 1, channels].

  The same function as nn.Conv(feature_group_count=channels), without a grouped convolution,
  which XLA:CPU runs slowly at these shapes (docs/notes/benchmarks-lab-notebook.md); a tap is a strided
  slice, so forward and backward are elementwise passes."""
  taps = kernel.shape[0]
  out_len = conv_output_lengths(x.shape[1], taps, stride, pad)
  x = jnp.pad(x, [(0, 0), (pad, pad), (0, 0)])
  out = bias
  for t in range(taps):
    tap = lax.slice_in_dim(x, t, t + stride * (out_len - 1) + 1, stride, axis=1)
    out = out + tap * kernel[t, 0]
  return out                                               # [n, out_len, channels]


class DepthwiseConv1d(nn.Module):
  """nn.Conv(channels, (kernel,), strides, padding, feature_group_count=channels)'s
  parameters ('kernel' [kernel, 1, channels], 'bias' [channels], the same initialisation), and
  its function through depthwise_conv1d."""
  kernel: int
  stride: int
  pad: int = -1                  # -1: kernel // 2

  @nn.compact
  def __call__(self, x):
    channels = x.shape[-1]
    kernel = self.param("kernel", torch_default_kernel, (self.kernel, 1, channels))
    bias = self.param("bias", torch_default_bias(self.kernel), (channels,))
    return depthwise_conv1d(x, kernel, bias, self.stride,
                            self.kernel // 2 if self.pad < 0 else self.pad)


class TimeCompression(nn.Module):
  """[n, time, channels] -> [n, compressed_time, channels]."""
  kernel: int
  stride: int
  conv_type: str = "depthwise"   # depthwise | standard | separable
  pad: int = -1                  # zeros on each side; -1: kernel // 2

  @nn.compact
  def __call__(self, x):
    channels = x.shape[-1]
    pad = self.kernel // 2 if self.pad < 0 else self.pad
    if self.conv_type == "standard":
      x = nn.Conv(channels, (self.kernel,), strides=(self.stride,), padding=[(pad, pad)],
                  kernel_init=torch_default_kernel,
                  bias_init=torch_default_bias(channels * self.kernel), name="conv")(x)
    else:
      x = DepthwiseConv1d(self.kernel, self.stride, pad, name="conv")(x)
    if self.conv_type == "separable":
      x = nn.Conv(channels, (1,), kernel_init=torch_default_kernel,
                  bias_init=torch_default_bias(channels), name="pointwise")(x)
    return x


def conv_padding(kernel: int, stride: int, thesis: bool = False) -> int:
  """The zeros a conv head's K/V conv adds on each side: kernel // 2, or the thesis code's
  stride // 2."""
  return stride // 2 if thesis else kernel // 2


def compressed_key_mask(key_mask, kernel: int, stride: int, compressed_len: int, pad: int):
  """[batch, time] prefix mask -> [batch, compressed_len] mask of compressed keys (a length
  <= 0 masks every key)."""
  lengths = conv_output_lengths(jnp.sum(key_mask, axis=1), kernel, stride, pad)
  return lengths_to_mask(lengths, compressed_len)


def thesis_pre_conv_length(length: int, kernel: int, stride: int) -> int:
  """The thesis code's right-padded length before its conv: k + s*ceil((T - k)/s), or k."""
  return kernel + stride * math.ceil((length - kernel) / stride) if length > kernel else kernel


class ConvAttention(nn.Module):
  kernel: int = 5
  stride: int = 2
  conv_type: str = "depthwise"
  attention_dropout: float = 0.0
  key_block_size: int = 0     # > 0: exact blockwise softmax over the compressed keys
  implementation: str = "xla"  # auto | xla | cudnn (fused.py)
  thesis: bool = False         # the thesis code's padding and mask (module docstring)

  def setup(self):
    self.pad = conv_padding(self.kernel, self.stride, self.thesis)
    self.conv_k = TimeCompression(self.kernel, self.stride, self.conv_type, self.pad)
    self.conv_v = TimeCompression(self.kernel, self.stride, self.conv_type, self.pad)
    self.dropout = Dropout(self.attention_dropout)

  def compress(self, compression: TimeCompression, x, key_mask):
    """[batch, time, heads, head_dim] -> [batch, compressed, heads, head_dim]."""
    batch, length, heads, head_dim = x.shape
    if self.thesis:
      extra = thesis_pre_conv_length(length, self.kernel, self.stride) - length
      x = jnp.pad(x, [(0, 0), (0, extra), (0, 0), (0, 0)])
      length += extra
    else:
      x = x * key_mask[:, :, None, None].astype(x.dtype)
    x = jnp.swapaxes(x, 1, 2).reshape(batch * heads, length, head_dim)
    x = compression(x).reshape(batch, heads, -1, head_dim)
    return jnp.swapaxes(x, 1, 2)

  def compressed_mask(self, key_mask, compressed_len: int):
    return compressed_key_mask(key_mask, self.kernel, self.stride, compressed_len, self.pad)

  def __call__(self, q, k, v, key_mask, deterministic: bool = True):
    k_c = self.compress(self.conv_k, k, key_mask)
    v_c = self.compress(self.conv_v, v, key_mask)
    mask_c = self.compressed_mask(key_mask, k_c.shape[1])
    return key_masked_attention(self, q, k_c, v_c, mask_c, self.key_block_size,
                                self.dropout, deterministic, self.implementation)

  def token_weights(self, q, k, key_mask):
    """[batch, heads, q_len, compressed_len]: weights over the *compressed* values; the
    analyses map them back to frames through the value conv's taps."""
    k_c = self.compress(self.conv_k, k, key_mask)
    return attention_weights(q, k_c, self.compressed_mask(key_mask, k_c.shape[1])[:, None, None])
