"""Q, K and V read as the model holds them before it splits heads, so the head-split copies
(a transpose kernel each, and the split of a fused QKV projection) leave the model.

Models split heads as ``permute_dims(reshape(x, [B, T, heads, D]), [0, 2, 1, 3])``; the fused
attention kernel reads ``[B, T, heads, D]`` directly through a 4-D tensor map (layout
``"bthd"`` of :class:`~fastdlight.analysis.attention.AttentionShape`), and where Q, K and V are
the three parts of one ``split`` of a fused projection's ``[B, T, (H + 2G) * D]`` output
(GPT-2's ``c_attn``, torchvision's ``in_proj``), the whole tensor as ``[B, T, H + 2G, D]``
(``"packed"``). An input read otherwise (LLaMA's Q and K come out of the rotary embedding
already split) keeps ``"bhtd"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from fastdlight.relax.attention_masks import Graph
from fastdlight.relax.rewrites import call_to, static_shape

#: the permutation that splits heads: [B, T, heads, D] -> [B, heads, T, D]
HEADS_FIRST = [0, 2, 1, 3]


@dataclass(frozen=True)
class Unsplit:
    """The tensors the attention call reads and their layout: Q, K and V (each ``[B, H, T, D]``
    or ``[B, T, H, D]``), or ``packed``, the one ``[B, T, H + 2G, D]`` tensor holding them."""

    layout: str
    tensors: tuple[relax.Expr, ...]
    packed: relax.Expr | None = None


def before_split(graph: Graph, expr: relax.Expr) -> relax.Expr | None:
    """The ``[B, T, heads, D]`` tensor ``expr`` (``[B, heads, T, D]``) permutes, or None."""
    call = call_to(graph.value(expr), "relax.permute_dims")
    if call is None or call.attrs.axes is None or [int(a) for a in call.attrs.axes] != HEADS_FIRST:
        return None
    return call.args[0] if len(static_shape(call.args[0]) or ()) == 4 else None


def split_part(graph: Graph, expr: relax.Expr) -> tuple[relax.Expr, int, relax.Call] | None:
    """``(x, part, the split)`` where ``expr`` is ``reshape(split(x, axis=-1)[part], [B, T,
    heads, D])``, else None."""
    reshape = call_to(graph.value(expr), "relax.reshape")
    item = None if reshape is None else graph.value(reshape.args[0])
    if not isinstance(item, relax.TupleGetItem):
        return None
    split = call_to(graph.value(item.tuple_value), "relax.split")
    rank = 0 if split is None else len(static_shape(split.args[0]) or ())
    if not rank or int(split.attrs.axis) not in (-1, rank - 1):
        return None
    return split.args[0], int(item.index), split


def packed_source(graph: Graph, parts: list[relax.Expr], heads: int, kv_heads: int,
                  head_dim: int) -> relax.Expr | None:
    """The fused projection's output that Q, K and V (``[B, T, heads, D]`` each) are parts 0, 1
    and 2 of, split at ``H * D`` and ``(H + G) * D`` along its last axis; else None."""
    found = [split_part(graph, p) for p in parts]
    if any(f is None for f in found) or len({id(f[2]) for f in found}) != 1 or [f[1] for f in found] != [0, 1, 2]:
        return None
    source, _, split = found[0]
    sections = split.attrs.indices_or_sections
    if isinstance(sections, (int, tvm.tirx.IntImm)):
        fits = int(sections) == 3 and heads == kv_heads
    else:
        fits = [int(x) for x in sections] == [heads * head_dim, (heads + kv_heads) * head_dim]
    shape = static_shape(source)
    return source if fits and shape is not None and shape[-1] == (heads + 2 * kv_heads) * head_dim else None


def unsplit(graph: Graph, operands: tuple[relax.Expr, relax.Expr, relax.Expr], heads: int, kv_heads: int,
            head_dim: int) -> Unsplit:
    """How the attention call reads Q, K and V (each ``[B, heads, T, D]`` as ``operands``)."""
    befores = [before_split(graph, e) for e in operands]
    if all(b is not None for b in befores):
        source = packed_source(graph, befores, heads, kv_heads, head_dim)
        if source is not None:
            return Unsplit("packed", (), source)
    tensors = tuple(b if b is not None else e for b, e in zip(befores, operands))
    layouts = ["bthd" if b is not None else "bhtd" for b in befores]
    return Unsplit(layouts[0] if len(set(layouts)) == 1 else ",".join(layouts), tensors)
