"""Attention kinds (one file each), their shared masks, and the multi-attention that routes
head groups to them."""

from multiformer_jax.model.attention.conv import ConvAttention
from multiformer_jax.model.attention.full import FullAttention, softmax_attention
from multiformer_jax.model.attention.kernel import KernelAttention, favor_attention
from multiformer_jax.model.attention.local import LocalAttention, local_attention
from multiformer_jax.model.attention.masks import lengths_to_mask
from multiformer_jax.model.attention.multi import MultiHeadMultiAttention
