"""Attention kinds (one file each), their shared masks, and the multi-attention that routes
head groups to them."""

from multiformer_jax.attention.conv import ConvAttention
from multiformer_jax.attention.full import FullAttention, softmax_attention
from multiformer_jax.attention.kernel import KernelAttention, favor_attention
from multiformer_jax.attention.local import LocalAttention, local_attention
from multiformer_jax.attention.masks import lengths_to_mask
from multiformer_jax.attention.multi import MultiHeadMultiAttention
