"""Multi-Head Multi-Attention: one q/k/v projection, head groups of different kinds, one W_o.

The q/k/v projections give `heads * head_dim` channels; the head groups of the layer's layout
take consecutive channel chunks in config order (config order = channel order), each group is
routed through its own attention kind, the outputs are concatenated back in the same order and
projected by W_o. So head h of the layout owns channels [h*head_dim, (h+1)*head_dim) of q/k/v
and rows [h*head_dim, (h+1)*head_dim) of W_o.

With head selection (`selected_heads` = H > 0) the layout describes H' candidate heads of
head_dim = d_model / H; q/k/v project to H' * head_dim channels, every candidate is computed
through its own kind, and the H heads selected for each example (multiformer_jax.model.head_selection)
fill the slots of W_o (d_model x d_model).
"""

import flax.linen as nn
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue
from multiformer_jax.model import layout as layout_lib
from multiformer_jax.model.attention.conv import ConvAttention
from multiformer_jax.model.attention.full import FullAttention
from multiformer_jax.model.attention.kernel import KernelAttention
from multiformer_jax.model.attention.local import LocalAttention
from multiformer_jax.model.attention.local_thesis import ThesisLocalAttention
from multiformer_jax.model.head_selection import gather_heads
from multiformer_jax.model.initializers import (torch_default_bias, torch_default_kernel,
                                                xavier_uniform, xavier_uniform_qkv)


def head_module(kind, attention_dropout: float, kernel_redraw: str, kernel_seed: int,
                local_block_size: int, key_block_size: int, implementation: str,
                name: str, head_dim: int = 0) -> nn.Module:
  """The attention module of one head group."""
  if isinstance(kind, layout_lib.FullHeads):
    return FullAttention(attention_dropout, key_block_size, implementation, name=name)
  if isinstance(kind, layout_lib.LocalHeads) and kind.thesis:
    return ThesisLocalAttention(kind.window, attention_dropout, name=name)
  if isinstance(kind, layout_lib.LocalHeads):
    # 'xla' keeps every head kind on XLA; the GPU kernels' names leave local and kernel heads
    # on 'auto' (their CPU kernels where they apply).
    return LocalAttention(kind.window, kind.dilation, local_block_size, attention_dropout,
                          "xla" if implementation == "xla" else "auto", name=name)
  if isinstance(kind, layout_lib.KernelHeads):
    return KernelAttention(kind.features, kernel_redraw, kernel_seed,
                           "xla" if implementation == "xla" else "auto", kind.thesis, head_dim,
                           name=name)
  if isinstance(kind, layout_lib.ConvHeads):
    return ConvAttention(kind.kernel, kind.stride, kind.conv_type, attention_dropout,
                         key_block_size, implementation, kind.thesis, name=name)
  raise TypeError(f"unknown head kind {kind!r}")


def group_name(index: int, kind) -> str:
  return f"group{index}_{str(kind).split('(')[0]}"


class MultiHeadMultiAttention(nn.Module):
  """Self-attention whose heads use the attention kinds of `layer_layout`.

  x: [batch, time, d_model], mask: [batch, time] bool -> [batch, time, d_model].
  """
  d_model: int
  layer_layout: layout_lib.LayerLayout
  attention_dropout: float = 0.0
  kernel_redraw: str = "fixed"
  kernel_seed: int = 0
  local_block_size: int = 0
  qkv_bias: bool = True
  dtype: jnp.dtype = jnp.float32
  selected_heads: int = 0          # H of the layout's H' candidates; 0 = every head, no selection
  key_block_size: int = 0          # full and conv heads: blockwise softmax over this many keys
  attention_implementation: str = "xla"   # full and conv heads: auto | xla | cudnn (fused.py)
  attention_init: str = "fairseq"  # fairseq (Xavier) | pytorch (nn.Linear's: the thesis's code)

  def setup(self):
    num_heads = sum(g.num_heads for g in self.layer_layout)
    used = self.selected_heads or num_heads
    if self.d_model % used or num_heads % used:
      raise InvalidValue(f"d_model {self.d_model} must divide into {used} heads, and the "
                       f"{num_heads} candidates into {used} groups")
    self.num_heads = num_heads       # candidates when selecting
    self.head_dim = self.d_model // used

    def projection(name, kernel_init):
      return nn.Dense(num_heads * self.head_dim, use_bias=self.qkv_bias,
                      kernel_init=kernel_init, bias_init=torch_default_bias(self.d_model),
                      dtype=self.dtype, name=name)

    pytorch_init = self.attention_init == "pytorch"
    qkv_init = torch_default_kernel if pytorch_init else xavier_uniform_qkv
    self.q_proj = projection("q_proj", qkv_init)
    self.k_proj = projection("k_proj", qkv_init)
    self.v_proj = projection("v_proj", qkv_init)
    self.out_proj = nn.Dense(
        self.d_model, kernel_init=torch_default_kernel if pytorch_init else xavier_uniform,
        bias_init=torch_default_bias(num_heads * self.head_dim) if pytorch_init
        else nn.initializers.zeros, dtype=self.dtype, name="out_proj")
    self.groups = [
        head_module(g.kind, self.attention_dropout, self.kernel_redraw,
                    self.kernel_seed * 1009 + i, self.local_block_size, self.key_block_size,
                    self.attention_implementation,
                    group_name(i, g.kind), self.head_dim)
        for i, g in enumerate(self.layer_layout)]

  def split_heads(self, projection: nn.Dense, x):
    """projection(x) as [batch, time, heads, head_dim]."""
    return projection(x).reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim)

  def head_groups(self):
    """[(group layout, group module, slice of its heads)] in channel order."""
    groups, start = [], 0
    for group, module in zip(self.layer_layout, self.groups):
      groups.append((group, module, slice(start, start + group.num_heads)))
      start += group.num_heads
    return groups

  def heads_output(self, x, mask, deterministic: bool = True):
    """Per-head outputs before W_o: [batch, time, heads, head_dim] (used by the analyses)."""
    q, k, v = (self.split_heads(p, x) for p in (self.q_proj, self.k_proj, self.v_proj))
    return jnp.concatenate([module(q[:, :, h], k[:, :, h], v[:, :, h], mask, deterministic)
                            for _, module, h in self.head_groups()], axis=2)

  def token_weights(self, x, mask):
    """Per head group, the dense weights [batch, group_heads, time, keys] each output gives each
    value (keys = time, or the compressed length for conv heads). For the analyses: O(n^2)."""
    q, k = self.split_heads(self.q_proj, x), self.split_heads(self.k_proj, x)
    return [module.token_weights(q[:, :, h], k[:, :, h], mask)
            for _, module, h in self.head_groups()]

  def __call__(self, x, mask, deterministic: bool = True, selection=None):
    """selection: (indices, weights) [batch, H] of the selected candidates (head selection)."""
    z = self.heads_output(x, mask, deterministic)           # [batch, time, heads, head_dim]
    if self.selected_heads:
      z = gather_heads(z, *selection)                       # [batch, time, H, head_dim]
    return self.out_proj(z.reshape(x.shape[0], x.shape[1], self.d_model))
