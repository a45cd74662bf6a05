"""The thesis's `s2t_multiformer` checkpoints (mt-upc/fairseq, branch multiformer): its
`--arg-supremo` layouts read without running them, mapped to the layout language, and its
head reordering undone in the weights.

The thesis's MultiheadMultiAttention routes channel chunks to its attention modules in a fixed
order, whatever the order of the layout: full heads, fast heads, then each local group, then
each compressed group. Here config order is channel order, so the q/k/v rows and W_o columns
of each head are moved to the head's place in the layout as written, and head h of an imported
layout is head h of the thesis's config.
"""

from __future__ import annotations

import ast
from typing import Any

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_jax.model import layout as layout_lib

# Every architecture registered for the `s2t_multiformer` model in the thesis's fork.
THESIS_ARCHS = ("s2t_multiformer", "s2t_multiformer_s_lc", "s2t_multiformer_s",
                "s2t_multiformer_s_v1", "s2t_multiformer_s_v2", "s2t_multiformer_local_no_ds",
                "s2t_multiformer_local_ds", "s2t_conv_atention_s", "s2t_local_attention_s")
CONV_TYPES = {"normal": "standard", "depthwise": "depthwise", "separable": "separable"}
GROUP_HELP = ("('full', n), ('fast', n), ('local', n, w), ('compressed', n, k, s, type) with "
              f"type in {sorted(CONV_TYPES)}")
# The thesis's channel order of the kinds.
_KIND_RANK = {layout_lib.FullHeads: 0, layout_lib.KernelHeads: 1, layout_lib.LocalHeads: 2,
              layout_lib.ConvHeads: 3}


class ArgSupremoError(InvalidValue):
  """An --arg-supremo that is not a layout the thesis's code builds."""


def _literal(node: ast.AST, text: str) -> Any:
  """Tuples and constants, `n * tuple` and `tuple + tuple`: what the thesis's layouts use,
  evaluated without eval()."""
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
    return node.value
  if isinstance(node, ast.Tuple):
    return tuple(_literal(e, text) for e in node.elts)
  if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
    left, right = _literal(node.left, text), _literal(node.right, text)
    if isinstance(node.op, ast.Add) and isinstance(left, tuple) and isinstance(right, tuple):
      return left + right
    if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {int, tuple}:
      return left * right
  raise ArgSupremoError(
      f"--arg-supremo {text!r}: {ast.unparse(node)!r} is not a tuple, a number, n * tuple or "
      f"tuple + tuple (the thesis's code would eval() it; here nothing is run)")


def parse_arg_supremo(text: str) -> list[list[tuple]]:
  """The layers of an --arg-supremo string: per layer its groups (tuples)."""
  try:
    tree = ast.parse(text, mode="eval")
  except SyntaxError as e:
    raise ArgSupremoError(f"--arg-supremo {text!r} is not Python syntax: {e.msg}") from None
  layers = _literal(tree.body, text)
  if not isinstance(layers, tuple) or not layers or not all(
      isinstance(layer, tuple) and all(isinstance(g, tuple) and g for g in layer)
      for layer in layers):
    raise ArgSupremoError(f"--arg-supremo {text!r} must be a tuple of layers, each a tuple of "
                          f"head groups {GROUP_HELP}")
  return [list(layer) for layer in layers]


def _head_group(group: tuple, index: int, features: int | None) -> layout_lib.HeadGroup | None:
  kind, *args = group
  arity = {"full": 1, "fast": 1, "local": 2, "compressed": 4}
  if kind not in arity or len(args) != arity[kind] or not isinstance(args[0], int):
    raise ArgSupremoError(f"layer {index + 1}: head group {group!r} is not one the thesis's "
                          f"code builds; valid: {GROUP_HELP}")
  if args[0] == 0:
    return None            # the thesis's code drops groups of no heads
  if kind == "full":
    return layout_lib.HeadGroup(layout_lib.FullHeads(), args[0])
  if kind == "fast":
    return layout_lib.HeadGroup(layout_lib.KernelHeads(features or 0, thesis=True), args[0])
  if kind == "local":
    return layout_lib.HeadGroup(layout_lib.LocalHeads(int(args[1]), thesis=True), args[0])
  _, kernel, stride, conv_type = args
  if conv_type not in CONV_TYPES:
    raise ArgSupremoError(f"layer {index + 1}: compressed heads of type {conv_type!r}; the "
                          f"thesis's code knows {sorted(CONV_TYPES)}")
  return layout_lib.HeadGroup(
      layout_lib.ConvHeads(int(kernel), int(stride), CONV_TYPES[conv_type], thesis=True),
      args[0])


def thesis_layout(text: str, fast_features: dict[int, int]) -> layout_lib.Layout:
  """The layout of an --arg-supremo, in its own order; fast_features[i]: layer i's fast heads'
  feature count (the rows of the checkpoint's projection matrix)."""
  layers = []
  for index, groups in enumerate(parse_arg_supremo(text)):
    kinds = [g[0] for g in groups if g[0] in ("full", "fast") and g[1:2] != (0,)]
    for repeated in ("full", "fast"):
      if kinds.count(repeated) > 1:
        raise ArgSupremoError(f"layer {index + 1} has several {repeated!r} groups; the "
                              f"thesis's code builds the first only: write one group of "
                              f"their total")
    layer = tuple(g for g in (_head_group(group, index, fast_features.get(index))
                              for group in groups) if g is not None)
    if not layer:
      raise ArgSupremoError(f"layer {index + 1} of --arg-supremo has no heads")
    layers.append(layer)
  return tuple(layers)


def thesis_head_order(layer: layout_lib.LayerLayout) -> tuple[list[int], list[int]]:
  """(for each head of `layer` in layout order, its head index in the thesis's channel order;
  for each group of `layer`, the index of its module in the thesis's `attentions`)."""
  ranked = sorted(range(len(layer)), key=lambda g: _KIND_RANK[type(layer[g].kind)])
  module_of_group = [0] * len(layer)
  first_head = [0] * len(layer)
  head = 0
  for module, g in enumerate(ranked):
    module_of_group[g] = module
    first_head[g] = head
    head += layer[g].num_heads
  heads = [first_head[g] + i for g, group in enumerate(layer) for i in range(group.num_heads)]
  return heads, module_of_group


def head_rows(weight: np.ndarray, thesis_heads: list[int], head_dim: int,
              axis: int) -> np.ndarray:
  """`weight` with its per-head blocks along `axis` put in layout order."""
  index = np.concatenate([np.arange(h * head_dim, (h + 1) * head_dim) for h in thesis_heads])
  return np.take(weight, index, axis=axis)
