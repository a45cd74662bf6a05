"""The head-layout language: which attention kind each encoder head uses, per layer.

Layouts are written the way the Multiformer thesis writes them::

    6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2))

A layout is a sequence of layer groups ``N x ( head_group + head_group ... )``, separated by
spaces (or ``+``). A head group is ``n*kind`` or ``n*kind(args)``; ``n*`` may be left out for one
head. Kinds and their arguments:

    full                        softmax attention over every valid key
    local(w[,d])                exact centred window of odd size w: keys j = i + d*m, |m| <= w//2
    kernel[(m)]                 Performer FAVOR+ with m positive orthogonal random features (256)
    conv[(k,s[,type])]          keys/values compressed in time by a Conv1d of kernel k, stride s
                                (type: depthwise [default], standard, separable; default 5,2)

Each of local, kernel and conv also takes the word ``thesis`` as its last argument: the head then
computes what the thesis's code (mt-upc/fairseq, branch multiformer) computes, quirks included
(docs/thesis_semantics.md): ``local(64,thesis)`` blocked windows of buckets w//3 (local-attention
1.4.3), ``kernel(thesis)`` / ``kernel(m,thesis)`` performer-pytorch's FastAttention (int(hd ln hd)
features when m is not given, a projection matrix held as a weight, no padding mask),
``conv(5,2,thesis)`` its ConvAttention (padding s//2, padded frames fed in, its mask arithmetic).

Config order is channel order: the first group gets the first ``n * head_dim`` channels of the
q/k/v projections and the first rows of W_o, so analyses map heads one to one.

This module is the only place a layout is parsed or validated.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Union

from multiformer_common.errors import InvalidValue

CONV_TYPES = ("depthwise", "standard", "separable")
KINDS_HELP = ("full, local(w[,d]), kernel[(m)], conv[(k,s[,type])]; local, kernel and conv "
              "also take a last argument 'thesis'")


class LayoutError(InvalidValue):
  """A head layout that cannot be used, with the offending token and what is valid."""


@dataclasses.dataclass(frozen=True)
class FullHeads:
  def __str__(self):
    return "full"


THESIS = "thesis"          # the argument that selects a kind's thesis-code semantics


def _args_text(name: str, args: list, thesis: bool) -> str:
  args = [str(a) for a in args] + ([THESIS] if thesis else [])
  return f"{name}({','.join(args)})" if args else name


@dataclasses.dataclass(frozen=True)
class LocalHeads:
  """Exact centred window of odd size `window` (every `dilation`-th key); with `thesis`, the
  thesis's blocked window: buckets of window//3 positions, each query seeing its own bucket and
  the ones before and after it (model/attention/local_thesis.py)."""
  window: int
  dilation: int = 1
  thesis: bool = False

  def __str__(self):
    return _args_text("local", [self.window] + ([self.dilation] if self.dilation != 1 else []),
                      self.thesis)


@dataclasses.dataclass(frozen=True)
class KernelHeads:
  """FAVOR+ with `features` random features; with `thesis`, performer-pytorch's FastAttention as
  the thesis used it (features 0 = its default int(hd ln hd))."""
  features: int = 256
  thesis: bool = False

  def __str__(self):
    return _args_text("kernel", [self.features] if self.features else [], self.thesis)


@dataclasses.dataclass(frozen=True)
class ConvHeads:
  kernel: int = 5
  stride: int = 2
  conv_type: str = "depthwise"
  thesis: bool = False

  def __str__(self):
    args = [self.kernel, self.stride] + ([self.conv_type] if self.conv_type != "depthwise" else [])
    return _args_text("conv", args, self.thesis)


HeadKind = Union[FullHeads, LocalHeads, KernelHeads, ConvHeads]


@dataclasses.dataclass(frozen=True)
class HeadGroup:
  kind: HeadKind
  num_heads: int

  def __str__(self):
    return f"{self.num_heads}*{self.kind}"


LayerLayout = tuple[HeadGroup, ...]   # one encoder layer, groups in channel order
Layout = tuple[LayerLayout, ...]      # one entry per encoder layer


def layer_head_kinds(layer: LayerLayout) -> tuple[HeadKind, ...]:
  """The kind of every head of a layer, in channel order."""
  return tuple(g.kind for g in layer for _ in range(g.num_heads))


# ----------------------------------------------------------------------------- parsing

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(.))")


class _Parser:
  """Recursive descent over the layout string; errors quote the text and the position."""

  def __init__(self, text: str):
    self.text = text
    self.tokens = []  # (kind, value, position)
    for m in _TOKEN.finditer(text):
      if m.group(1) is not None:
        self.tokens.append(("int", int(m.group(1)), m.start(1)))
      elif m.group(2) is not None:
        self.tokens.append(("name", m.group(2), m.start(2)))
      elif m.group(3) is not None:
        self.tokens.append(("sym", m.group(3), m.start(3)))
    self.i = 0

  def error(self, message: str, position: int | None = None) -> LayoutError:
    if position is None:
      position = self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text)
    pointer = " " * position + "^"
    return LayoutError(f"{message}\n  {self.text}\n  {pointer}")

  def peek(self):
    return self.tokens[self.i] if self.i < len(self.tokens) else ("end", None, len(self.text))

  def take(self):
    token = self.peek()
    self.i += 1
    return token

  def expect_sym(self, symbol: str, what: str):
    kind, value, pos = self.take()
    if kind != "sym" or value != symbol:
      shown = "end of layout" if kind == "end" else repr(str(value))
      raise self.error(f"expected {symbol!r} {what}, found {shown}", pos)

  def layout(self) -> Layout:
    layers: list[LayerLayout] = []
    while self.peek()[0] != "end":
      if layers and self.peek() == ("sym", "+", self.peek()[2]):
        self.take()
      repeat, layer = self.layer_group()
      layers.extend([layer] * repeat)
    if not layers:
      raise self.error("empty head layout; write e.g. 12x(4*full)")
    return tuple(layers)

  def layer_group(self) -> tuple[int, LayerLayout]:
    kind, value, pos = self.peek()
    repeat = 1
    if kind == "int":
      self.take()
      repeat = value
      if repeat < 1:
        raise self.error(f"layer count must be >= 1, got {repeat}", pos)
      k2, v2, p2 = self.take()
      if not (k2 == "name" and v2 == "x") and not (k2 == "sym" and v2 == "\u00d7"):
        raise self.error(f"expected 'x' after the layer count {repeat}, found {v2!r}", p2)
    self.expect_sym("(", "to open the heads of a layer group, e.g. 6x(2*local(65)+2*conv(5,2))")
    groups = [self.head_group()]
    while self.peek()[0] == "sym" and self.peek()[1] == "+":
      self.take()
      groups.append(self.head_group())
    self.expect_sym(")", "to close the layer group")
    return repeat, tuple(groups)

  def head_group(self) -> HeadGroup:
    kind, value, pos = self.peek()
    count = 1
    if kind == "int":
      self.take()
      count = value
      if count < 1:
        raise self.error(f"head count must be >= 1, got {count}", pos)
      self.expect_sym("*", f"between the head count {count} and the head kind")
    kind, name, pos = self.take()
    if kind != "name":
      raise self.error(f"expected a head kind ({KINDS_HELP}), found {name!r}", pos)
    args: list = []
    if self.peek()[0] == "sym" and self.peek()[1] == "(":
      self.take()
      while True:
        k, v, p = self.take()
        if k not in ("int", "name"):
          raise self.error(f"expected an argument of {name}, found {v!r}", p)
        args.append(v)
        k, v, p = self.take()
        if k == "sym" and v == ")":
          break
        if not (k == "sym" and v == ","):
          raise self.error(f"expected ',' or ')' in the arguments of {name}, found {v!r}", p)
    return HeadGroup(_make_kind(name, args, lambda msg: self.error(msg, pos)), count)


def _make_kind(name: str, args: list, error) -> HeadKind:
  lowered = name.lower()
  thesis = bool(args) and isinstance(args[-1], str) and args[-1].lower() == THESIS
  if thesis:
    if lowered == "full":
      raise error("full takes no arguments: its thesis semantics are its own (a softmax over "
                  "every valid key)")
    args = args[:-1]

  def ints(lo: int, hi: int, usage: str) -> list[int]:
    if not lo <= len(args) <= hi or not all(isinstance(a, int) for a in args[:hi]):
      raise error(f"bad arguments {args} for {name}; usage: {usage}")
    return args

  if lowered == "full":
    if args:
      raise error(f"full takes no arguments, got {args}")
    return FullHeads()
  if lowered == "local":
    if not args:
      raise error("local needs a window size: local(w) or local(w,d) with w odd, e.g. "
                  "local(65) for the thesis's Local(64) (64/2 tokens on each side)")
    window, *rest = ints(1, 1 if thesis else 2,
                         "local(w,thesis)" if thesis else "local(w) or local(w,d)")
    dilation = rest[0] if rest else 1
    if thesis:
      if window < 3:
        raise error(f"local(w,thesis) needs w >= 3 (buckets of w//3 positions), got {window}")
      return LocalHeads(window, 1, thesis=True)
    if window < 1 or window % 2 == 0:
      raise error(f"local window must be an odd number >= 1 (exact centred window "
                  f"|i-j| <= w//2), got {window}; use {max(1, window - 1)} or {window + 1} (the "
                  f"thesis's Local(64), 32 tokens on each side, is local(65); its code's "
                  f"blocked window is local({window},thesis))")
    if dilation < 1:
      raise error(f"local dilation must be >= 1, got {dilation}")
    return LocalHeads(window, dilation)
  if lowered in ("kernel", "fast", "performer"):
    (features,) = ints(0, 1, "kernel, kernel(m), kernel(thesis) or kernel(m,thesis)") or [
        0 if thesis else 256]
    if features < 1 and not (thesis and features == 0):
      raise error(f"kernel feature count must be >= 1, got {features}")
    return KernelHeads(features, thesis)
  if lowered == "conv":
    conv_type = "depthwise"
    if len(args) == 3 and isinstance(args[2], str):
      conv_type = args[2].lower()
      args = args[:2]
      if conv_type not in CONV_TYPES:
        raise error(f"unknown conv type {conv_type!r}; valid: {', '.join(CONV_TYPES)}")
    kernel, stride = ints(0, 2, "conv, conv(k,s), conv(k,s,type) or conv(k,s[,type],thesis)") or [
        5, 2]
    if kernel < 1 or stride < 1:
      raise error(f"conv kernel and stride must be >= 1, got kernel {kernel}, stride {stride}")
    if stride > kernel:
      raise error(f"conv stride {stride} is larger than its kernel {kernel}: frames would be "
                  f"skipped; use a stride <= kernel")
    return ConvHeads(kernel, stride, conv_type, thesis)
  raise error(f"unknown head kind {name!r}; valid kinds: {KINDS_HELP}")


def thesis_kind(kind: HeadKind) -> HeadKind:
  """The kind as the thesis's code computes it (full heads are the same)."""
  if isinstance(kind, FullHeads) or kind.thesis:
    return kind
  if isinstance(kind, LocalHeads):
    if kind.dilation != 1:
      raise LayoutError(f"{kind} has no thesis form: the thesis's local heads are not dilated")
    return LocalHeads(kind.window, 1, thesis=True)
  return dataclasses.replace(kind, thesis=True)


def thesis_layout(layout: Layout) -> Layout:
  """Every local, kernel and conv head of `layout` in its thesis form (model.semantics)."""
  return tuple(tuple(HeadGroup(thesis_kind(g.kind), g.num_heads) for g in layer)
               for layer in layout)


def parse_layout(text: str, num_layers: int | None = None, num_heads: int | None = None,
                 d_model: int | None = None) -> Layout:
  """Parses and validates a layout; returns one tuple of head groups per encoder layer.

  Raises LayoutError naming the bad token, and what would be valid, when the text does not
  parse, when a layer's heads do not sum to `num_heads`, when the layer counts do not sum to
  `num_layers`, or when `d_model` is not divisible into `num_heads` heads.
  """
  if not isinstance(text, str):
    raise LayoutError(f"a head layout must be a string like '12x(4*full)', got {text!r}")
  layout = _Parser(text).layout()
  if num_heads is not None:
    if d_model is not None and (num_heads < 1 or d_model % num_heads):
      raise LayoutError(f"d_model {d_model} is not divisible by {num_heads} heads: head_dim "
                        f"must be an integer; use a head count that divides {d_model}")
    for index, layer in enumerate(layout):
      total = sum(g.num_heads for g in layer)
      if total != num_heads:
        raise LayoutError(
            f"layer {index + 1} of layout {text!r} has {total} heads "
            f"({'+'.join(str(g) for g in layer)}) but the encoder has {num_heads} heads per "
            f"layer; make each layer's head counts sum to {num_heads}")
  if num_layers is not None and len(layout) != num_layers:
    raise LayoutError(f"layout {text!r} describes {len(layout)} layers but the encoder has "
                      f"{num_layers}; make the layer counts sum to {num_layers}")
  return layout


def format_layout(layout: Layout) -> str:
  """The canonical text of a layout; `parse_layout(format_layout(x)) == x`."""
  parts = []
  i = 0
  while i < len(layout):
    j = i
    while j < len(layout) and layout[j] == layout[i]:
      j += 1
    parts.append(f"{j - i}x(" + "+".join(str(g) for g in layout[i]) + ")")
    i = j
  return " ".join(parts)
