"""Token contributions of Pre-LN attention blocks (Kobayashi et al. 2021, as adapted by
Alastruey et al. 2022), for every head kind of a Multiformer layer.

The block output is x_i + W_o(concat_h z_h(LN(x))) + b_O. Treating the attention weights as
constants, every head is linear in its values v_j = LN(x_j) W_V^h + b_V^h, so

    x̂_i = Σ_j F_i(x_j) + b_i,   F_i(x_j) = Σ_t B^t_ij U^t_j + δ_ij x_i,

where each "tap" t carries a token-mixing matrix B^t [n, n] and transformed values U^t [n, d]:
- full, local, kernel heads: one tap per head, B = the head's dense weights (local: zero
  outside the window; kernel: φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j'), the exact FAVOR+ weights),
  U_j = v_j W_O^h;
- conv(k, s) heads attend to compressed values v'_m = Σ_τ v_{m·s+τ-k//2} K_τ + c, so there is
  one tap per head and kernel offset τ: B^τ_ij = Σ_m A_im [m·s + τ - k//2 = j] and
  U^τ_j = v_j K_τ W_O^h; the conv bias goes to b_i = b_O + Σ_h (Σ_m A^h_im) c^h W_O^h.
The contribution of token j to output i is C_ij = ‖F_i(x_j)‖₂; the identity
Σ_j F_i(x_j) + b_i = block output is exact and tested.

Everything here is written for one layer of a bound model (see `internals.py`).
"""

import jax
import jax.numpy as jnp

from multiformer_jax.model import layout as layout_lib
from multiformer_jax.model.attention.conv import conv_padding


def conv_value_taps(conv_type: str, params):
  """The value conv of a conv head group as per-offset linear maps.

  params: the group's `conv_v` parameters. Returns (taps [k, head_dim, head_dim], bias
  [head_dim]) with compressed v'_m = Σ_τ v_{m·s+τ-pad} taps[τ] + bias.
  """
  kernel = params["conv"]["kernel"]          # [k, in / groups, out]
  bias = params["conv"]["bias"]
  if conv_type == "standard":
    taps = kernel
  else:                                      # depthwise (and the first half of separable)
    taps = jax.vmap(jnp.diag)(kernel[:, 0, :])
  if conv_type == "separable":
    pointwise = params["pointwise"]["kernel"][0]          # [hd, hd]
    taps = jnp.einsum("tce,ef->tcf", taps, pointwise)
    bias = bias @ pointwise + params["pointwise"]["bias"]
  return taps, bias


def conv_selection(length: int, compressed_len: int, kernel: int, stride: int, pad: int):
  """[kernel, compressed_len, length]: 1 where compressed position m reads frame j at offset τ
  (j = m·stride + τ - pad; frames outside [0, length) are the conv's zero padding)."""
  m = jnp.arange(compressed_len)[None, :, None]
  tau = jnp.arange(kernel)[:, None, None]
  j = jnp.arange(length)[None, None, :]
  return (m * stride + tau - pad == j).astype(jnp.float32)


def attention_taps(attn, ln_x, mask):
  """The decomposition of one bound MultiHeadMultiAttention applied to ln_x = LN(x).

  ln_x: [batch, n, d]; mask: [batch, n] bool. Returns (B [batch, taps, n, n],
  U [batch, taps, n, d], bias [batch, n, d]), all float32.
  """
  batch, length, d_model = ln_x.shape
  v = attn.split_heads(attn.v_proj, ln_x).astype(jnp.float32)          # [b, n, H, hd]
  out_params = attn.out_proj.variables["params"]
  w_o = out_params["kernel"].astype(jnp.float32).reshape(attn.num_heads, attn.head_dim,
                                                         d_model)
  bias = jnp.broadcast_to(out_params["bias"].astype(jnp.float32), (batch, length, d_model))
  weights = attn.token_weights(ln_x, mask)
  mixing, values = [], []
  for (group, module, heads), group_weights in zip(attn.head_groups(), weights):
    v_h, w_o_h = v[:, :, heads], w_o[heads]                  # [b, n, g, hd], [g, hd, d]
    group_weights = group_weights.astype(jnp.float32)        # [b, g, n, keys]
    if isinstance(group.kind, layout_lib.ConvHeads):
      kind = group.kind
      taps, conv_bias = conv_value_taps(kind.conv_type, module.conv_v.variables["params"])
      selection = conv_selection(length, group_weights.shape[-1], kind.kernel, kind.stride,
                                 conv_padding(kind.kernel, kind.stride, kind.thesis))
      if not kind.thesis:                                    # the conv sees zeroed padding
        v_h = v_h * mask[:, :, None, None]
      b_taps = jnp.einsum("bgim,tmj->bgtij", group_weights, selection)
      u_taps = jnp.einsum("bjgc,tce,ged->bgtjd", v_h, taps, w_o_h)
      mixing.append(b_taps.reshape(batch, -1, length, length))
      values.append(u_taps.reshape(batch, -1, length, d_model))
      bias = bias + jnp.einsum("bgi,gd->bid", group_weights.sum(-1),
                               jnp.einsum("c,gcd->gd", conv_bias, w_o_h))
    else:
      mixing.append(group_weights)
      values.append(jnp.einsum("bjgc,gcd->bgjd", v_h, w_o_h))
  return jnp.concatenate(mixing, axis=1), jnp.concatenate(values, axis=1), bias


def contribution_matrix(mixing, values, x, mask, residual: bool = True):
  """C_ij = ‖F_i(x_j)‖₂: [batch, n, n], zero at padded rows and columns.

  residual=False leaves out the δ_ij x_i term (only what the attention mixes: a view for
  models whose residual stream still dominates every row, e.g. after few updates).

  Forms F one utterance at a time ([n, n, d] floats), so memory is O(n² d), not O(b n² d)."""
  length = x.shape[1]
  eye = jnp.eye(length, dtype=jnp.float32)

  def one(args):
    b_taps, u_taps, x_u, m = args
    f = jnp.einsum("tij,tjd->ijd", b_taps, u_taps)
    if residual:
      f = f + eye[:, :, None] * x_u[:, None, :]
    c = jnp.sqrt(jnp.sum(f * f, axis=-1))
    return c * (m[:, None] & m[None, :])

  return jax.lax.map(one, (mixing, values, x.astype(jnp.float32), mask))


def head_output_norms(z, w_o):
  """‖z_{t,h} W_o^(h)‖₁ per position and head: z [b, n, H, hd], w_o [H*hd, d] -> [b, n, H]."""
  heads, head_dim = z.shape[2], z.shape[3]
  per_head = jnp.einsum("bnhc,hcd->bnhd", z.astype(jnp.float32),
                        w_o.astype(jnp.float32).reshape(heads, head_dim, -1))
  return jnp.sum(jnp.abs(per_head), axis=-1)
