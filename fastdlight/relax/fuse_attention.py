"""Attention, in the forms models reach Relax in, as one call of the attention PrimFunc
(:func:`fastdlight.analysis.attention.attention_func`), the function the fused Hopper template
takes.

Forms, as ``for_inference`` leaves them (``ToMixedPrecision``'s casts included):

- ``matmul(P, V)`` with ``P = [astype](softmax(S))`` and ``S`` the scores ``matmul(Q, Kᵀ)``
  through casts, multiplications or divisions by a scalar constant (the scale; torch's SDPA
  splits it as ``sqrt(scale)`` on both Q and Kᵀ) and at most a mask: an additive constant
  (``0`` kept, ``-inf`` or at most :data:`.attention_masks.MASKED_AT` masked) or a ``where`` on
  a constant condition (``masked_fill``; :mod:`.attention_masks` reads masks and scales off the
  graph). A mask is causal where its kept entries are the bottom-right
  aligned lower triangle (the top-left one when TQ = TKV), none where it keeps everything;
  other masks are data the fused function does not take (T5's and Swin's position biases).
  This covers ``scaled_dot_product_attention`` as ``torch.export`` decomposes it (with the
  causal mask computed to a constant by :mod:`.constants`, and SDPA's guard against rows
  masked whole, which no such mask leaves, read through) and the hand-written form.
- Q, K and V found through reshapes of their leading axes, transposes of their last two and
  casts; K and V repeated over the query heads (Hugging Face's ``repeat_kv``:
  ``expand_dims`` + ``broadcast_to`` + ``reshape``) are passed un-repeated (GQA).
- ``R.nn.attention(q, k, v)`` (layout ``[B, S, H, D]``), permuted to ``[B, H, S, D]`` around
  the call.

A mask computed from a model input (BERT given its ``attention_mask``) is no constant: such
attention is left as it is. So is attention whose scores or probabilities another value
reads, and any shape :func:`fused_fits` rejects for the target: there the naive PrimFunc
would run as several kernels, slower than the unfused graph.

A decode-sized attention (one query token a head, up to
:data:`~fastdlight.analysis.decode_attention.MAX_GROUP_ROWS` query heads a K/V head, or a few
tokens of a small group without a causal mask, at most
:data:`~fastdlight.analysis.decode_attention.MAX_ROWS` rows; K and V as ``[B, G, T, D]``)
becomes the split-KV pair of :mod:`.split_kv` instead: the fused template's 64-row tiles would
compute mostly padding and leave SMs idle at small batches.

The PrimFunc is marked opaque (``op_pattern``), so FuseOps leaves it a function of its own:
fused with its neighbours, FuseTIR would make a new function without the
:data:`~fastdlight.analysis.attention.ATTR` attribute the template looks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax
from tvm.ir import IRModule
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.analysis.attention import AttentionShape, attention_func, fused_fits
from fastdlight.analysis.decode_attention import DecodeAttentionShape, decode_of
from fastdlight.arch import CUDA
from fastdlight.policies.attention import attention_configs
from fastdlight.relax.attention import GUARD_STEPS
from fastdlight.relax.attention_layouts import unsplit
from fastdlight.relax.attention_masks import (
    LAYOUT_OPS,
    Graph,
    causal_of,
    masked_by,
    scaled_by,
)
from fastdlight.relax.rewrites import (
    add_opaque_func,
    call_to,
    matches_pass,
    static_shape,
)
from fastdlight.relax.split_kv import SplitKvCalls

#: a scale this close (relative) to 1/sqrt(D) is 1/sqrt(D), rounded where the exporter split it
#: into two fp16 factors
SCALE_ROUNDING = 2.0**-9
DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class PeeledOperand:
    """Q, K or V as the matmul reads it: ``base`` (an expression of the original function),
    its last two axes ``swapped`` relative to the matmul operand, each of its leading
    (flattened) rows read ``repeat`` times in a row, times ``scale``."""

    base: relax.Expr
    swapped: bool = False
    repeat: int = 1
    scale: float = 1.0


@dataclass(frozen=True)
class Match:
    """What replaces one attention: Q, K and V as ``(base, axes)`` (``base`` permuted by
    ``axes`` where given, then cast and reshaped to the PrimFunc's layout), and the replaced
    value's layout: the output permuted by ``out_axes`` and reshaped to ``out_shape``."""

    shape: AttentionShape
    q: tuple[relax.Expr, tuple[int, ...] | None]
    k: tuple[relax.Expr, tuple[int, ...] | None]
    v: tuple[relax.Expr, tuple[int, ...] | None]
    out_shape: tuple[int, ...]
    out_dtype: str
    out_axes: tuple[int, ...] | None = None
    #: the one tensor holding Q, K and V where ``shape.layout`` is "packed"
    packed: relax.Expr | None = None


def _last_two_kept(call: relax.Call) -> bool:
    before, after = static_shape(call.args[0]), static_shape(call)
    return before is not None and after is not None and len(before) >= 2 and len(after) >= 2 \
        and before[-2:] == after[-2:]


def operand(graph: Graph, expr: relax.Expr) -> PeeledOperand:
    """``expr`` (a matmul operand) peeled down to the tensor it re-lays: see :class:`PeeledOperand`."""
    swapped, repeat, scale = False, 1, 1.0
    # an attention's output that another one reads (the next layer's) is read as replaced, not
    # through the cast the replacement takes the place of
    while expr not in graph.replaced:
        value = graph.value(expr)
        call = call_to(value, "relax.astype", "relax.permute_dims", "relax.broadcast_to", *LAYOUT_OPS)
        if (scaled := scaled_by(graph, value)) is not None:
            expr, factor = scaled
            scale *= factor
        elif call is None:
            break
        elif _keeps_values(call):
            expr = call.args[0]
        elif call.op.name == "relax.permute_dims" and _swaps_last_two(call):
            expr, swapped = call.args[0], not swapped
        elif call.op.name == "relax.broadcast_to" and (times := _repeats(call)):
            expr, repeat = call.args[0], repeat * times
        else:
            break
    return PeeledOperand(expr, swapped, repeat, scale)


def _keeps_values(call: relax.Call) -> bool:
    """A float cast, or a layout op that keeps the last two axes (and the rows' order)."""
    if call.op.name == "relax.astype":
        return str(call.attrs.dtype) in (*DTYPES, "float32")
    return call.op.name in LAYOUT_OPS and _last_two_kept(call)


def _swaps_last_two(call: relax.Call) -> bool:
    axes = call.attrs.axes
    n = len(static_shape(call) or ())
    return axes is not None and n >= 2 and [int(a) for a in axes] == [*range(n - 2), n - 1, n - 2]


def _repeats(call: relax.Call) -> int:
    """How many times ``broadcast_to`` repeats each row of its input: only axis -3 (the last
    leading one) broadcast, so output row ``n`` reads input row ``n // repeat``; else 0."""
    before, after = static_shape(call.args[0]), static_shape(call)
    if before is None or after is None or len(before) != len(after) or len(after) < 3:
        return 0
    same = all(a == b for i, (a, b) in enumerate(zip(before, after)) if i != len(after) - 3)
    return after[-3] if same and before[-3] == 1 else 0


def _swap(ndim: int) -> tuple[int, ...]:
    return (*range(ndim - 2), ndim - 1, ndim - 2)


def _lead(shape: list[int]) -> list[int]:
    """The leading axes (all but the last two), leading 1s dropped."""
    lead = list(shape[:-2])
    while lead and lead[0] == 1:
        lead.pop(0)
    return lead


class Matcher:
    """Attention ending in one ``matmul(P, V)``. :attr:`region` collects the variables the
    rewrite replaces (scores, probabilities, SDPA's guard), which no other value may read."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.region: list[relax.Var] = []

    def through(self, expr: relax.Expr) -> relax.Expr:
        """``expr``'s value, ``expr`` counted into the region."""
        if isinstance(expr, relax.Var):
            self.region.append(expr)
        return self.graph.value(expr)

    def exclusive(self, root: relax.Var) -> bool:
        inside = {*self.region, root}
        return all(u is not None and u in inside for var in self.region if not var.same_as(root)
                   for u in self.graph.users[var])

    def probabilities(self, expr: relax.Expr) -> tuple[relax.Call, list[relax.Expr]] | None:
        """The softmax that ``expr`` (P) is through casts and reshapes, and the conditions of
        SDPA's guards (``where(all masked, 0, softmax)``) around it."""
        guards = []
        while True:
            call = call_to(self.through(expr), "relax.astype", "relax.reshape", "relax.where", "relax.nn.softmax")
            if call is None or (call.op.name == "relax.reshape" and not _last_two_kept(call)):
                return None
            if call.op.name == "relax.nn.softmax":
                ndim = len(static_shape(call) or ())
                return (call, guards) if int(call.attrs.axis) in (-1, ndim - 1) else None
            if call.op.name == "relax.where":
                cond, zeros, expr = call.args
                if not self.is_zero(zeros):
                    return None
                guards.append(cond)
            else:
                expr = call.args[0]

    def is_zero(self, expr: relax.Expr) -> bool:
        value = self.through(expr)
        fill = call_to(value, "relax.full_like", "relax.full")
        constant = self.graph.constant(fill.args[1] if fill is not None else expr)
        return constant is not None and not np.any(constant)

    def guards(self, cond: relax.Expr, scores: relax.Expr) -> bool:
        """``cond`` reduces ``equal(scores, -inf)`` (up to reshapes): true of no row where the
        mask leaves every row a key, the scores being finite products."""
        while (step := call_to(self.through(cond), *GUARD_STEPS)) is not None:
            cond = step.args[0]
        equal = call_to(self.graph.value(cond), "relax.equal")
        if equal is None or self.graph.scalar(equal.args[1]) != -math.inf:
            return False
        x = equal.args[0]
        while (reshape := call_to(self.through(x), "relax.reshape")) is not None:
            x = reshape.args[0]
        return x.same_as(scores)

    def scores(self, expr: relax.Expr, tq: int, tkv: int) -> tuple[relax.Call, float, np.ndarray] | None:
        """The ``matmul(Q, Kᵀ)`` that ``expr`` scales and masks, the scale, and the
        ``[TQ, TKV]`` entries the masks keep."""
        scale, keep = 1.0, np.ones((tq, tkv), bool)
        while True:
            value = self.through(expr)
            if (scaled := scaled_by(self.graph, value)) is not None:
                expr, factor = scaled
                scale *= factor
                continue
            call = call_to(value, "relax.matmul", "relax.astype", "relax.reshape", "relax.add", "relax.where")
            if call is None:
                return None
            if call.op.name == "relax.matmul":
                return call, scale, keep
            if call.op.name in ("relax.astype", "relax.reshape"):
                if not _keeps_values(call):
                    return None
                expr = call.args[0]
                continue
            if (masked := masked_by(self.graph, call, tq, tkv)) is None:
                return None
            expr, keep = masked[0], keep & masked[1]


def match_decomposed(graph: Graph, root: relax.Var, pv: relax.Call) -> Match | None:
    """The attention whose ``matmul(P, V)`` is ``pv``, bound to ``root``, or None."""
    matcher = Matcher(graph)
    found = matcher.probabilities(pv.args[0])
    shape = None if found is None else static_shape(found[0])
    if shape is None or len(shape) < 2:
        return None
    softmax, guards = found
    scored = matcher.scores(softmax.args[0], *shape[-2:])
    if scored is None or not all(matcher.guards(c, softmax.args[0]) for c in guards):
        return None
    qk, scale, keep = scored
    is_causal = causal_of(keep)
    if is_causal is None or not matcher.exclusive(root):
        return None
    q, k, v = operand(graph, qk.args[0]), operand(graph, qk.args[1]), operand(graph, pv.args[1])
    return _decomposed_match(qk, pv, (q, k, v), scale * q.scale * k.scale, is_causal)


def _decomposed_match(qk: relax.Call, pv: relax.Call, operands: tuple[PeeledOperand, ...], scale: float,
                      causal: bool) -> Match | None:
    """The :class:`Match` of ``pv(softmax(qk))`` with these operands, if its shapes are one attention's."""
    q, k, v = operands
    shapes = [static_shape(e) for e in (qk.args[0], qk.args[1], pv.args[0], pv.args[1], pv, q.base, k.base, v.base)]
    dtype = str(qk.args[0].ty.dtype)
    if any(s is None or len(s) < 2 for s in shapes) or dtype not in DTYPES or scale <= 0 \
            or {str(qk.args[1].ty.dtype), str(pv.args[1].ty.dtype)} != {dtype}:
        return None
    qs, ks, ps, vs, out, qb, kb, vb = shapes
    (tq, d), tkv = qs[-2:], ks[-1]
    if ks[-2:] != [d, tkv] or ps[-2:] != [tq, tkv] or vs[-2:] != [tkv, d] or out[-2:] != [tq, d]:
        return None
    # a scaled V would scale the output, which the PrimFunc does not
    if any(_lead(s) != _lead(qs) for s in (ks, ps, vs, out)) or q.repeat != 1 or k.repeat != v.repeat \
            or v.scale != 1.0:
        return None
    rows, group = math.prod(qs[:-2]), k.repeat
    if math.prod(qb[:-2]) != rows or rows % group or math.prod(kb[:-2]) * group != rows \
            or math.prod(vb[:-2]) * group != rows:
        return None
    batch = qb[0] if len(qb) == 4 and (rows // group) % qb[0] == 0 else 1
    if abs(scale * math.sqrt(d) - 1.0) < SCALE_ROUNDING:
        scale = 1.0 / math.sqrt(d)
    try:
        shape = AttentionShape(batch, rows // batch, tq, tkv, d, rows // group // batch, causal, scale, dtype)
    except ValueError:
        return None
    return Match(shape, (q.base, _swap(len(qb)) if q.swapped else None),
                 (k.base, None if k.swapped else _swap(len(kb))), (v.base, _swap(len(vb)) if v.swapped else None),
                 tuple(out), str(pv.ty.dtype))


def match_nn_attention(call: relax.Call) -> Match | None:
    """``R.nn.attention(q, k, v)`` (``[B, S, H, D]``, no bias, no window) as a :class:`Match`."""
    shapes = [static_shape(e) for e in call.args[:3]]
    dtype = str(call.args[0].ty.dtype)
    if len(call.args) != 3 or any(s is None or len(s) != 4 for s in shapes) or call.attrs.window_size is not None \
            or {str(e.ty.dtype) for e in call.args} != {dtype}:
        return None
    (b, tq, h, d), (_, tkv, g, _), _ = shapes
    mask = call.attrs.causal_mask
    if mask not in (None, "TopLeft", "BottomRight") or (mask == "TopLeft" and tq != tkv):
        return None
    scale = 0.0 if call.attrs.scale is None else float(call.attrs.scale)
    if shapes[1] != [b, tkv, g, d] or shapes[2] != [b, tkv, g, d]:
        return None
    try:
        shape = AttentionShape(b, h, tq, tkv, d, g, mask is not None, scale, dtype)
    except ValueError:
        return None
    heads_first = (0, 2, 1, 3)
    q, k, v = ((e, heads_first) for e in call.args)
    return Match(shape, q, k, v, (b, tq, h, d), str(call.ty.dtype), heads_first)


def find_matches(func: relax.Function, fits) -> dict[relax.Call, Match]:
    """The attentions of ``func`` whose shapes ``fits`` takes, by the call each one replaces."""
    graph = Graph(func)
    found = {}
    for var, value in graph.values.items():
        if (call := call_to(value, "relax.nn.attention")) is not None:
            match = match_nn_attention(call)
        elif (call := call_to(value, "relax.matmul")) is not None:
            match = match_decomposed(graph, var, call)
        else:
            continue
        if match is not None and fits(match.shape):
            key, match = _replaced(graph, var, call, _unsplit_heads(graph, match))
            found[key] = match
            graph.replaced.update([var, *graph.users[var]])
    return found


def _unsplit_heads(graph: Graph, match: Match) -> Match:
    """``match`` reading Q, K and V before the model splits their heads where it can (see
    :mod:`.attention_layouts`)."""
    if any(axes is not None for _, axes in (match.q, match.k, match.v)):
        return match
    s = match.shape
    found = unsplit(graph, (match.q[0], match.k[0], match.v[0]), s.heads, s.kv_heads, s.head_dim)
    if found.packed is not None:
        return replace(match, shape=replace(s, layout="packed"), packed=found.packed)
    q, k, v = ((t, None) for t in found.tensors)
    return replace(match, shape=replace(s, layout=found.layout), q=q, k=k, v=v)


def _replaced(graph: Graph, var: relax.Var, call: relax.Call, match: Match) -> tuple[relax.Call, Match]:
    """The call the attention replaces: the matmul's cast to the attention's dtype where that is
    its one reader (the fp32 product ToMixedPrecision narrows), so no round trip through fp32
    is left; else the matmul itself."""
    users = graph.users[var]
    cast = call_to(graph.value(users[0]), "relax.astype") if len(users) == 1 and users[0] is not None else None
    if match.out_axes is None and cast is not None and str(cast.attrs.dtype) == match.shape.dtype:
        return cast, replace(match, out_dtype=match.shape.dtype)
    return call, match


@mutator
class Rewriter(PyExprMutator):
    """Each matched call as a ``call_tir`` of the attention PrimFunc (one per shape)."""

    def __init__(self, mod: IRModule, matches: dict[relax.Call, Match], sm_count: int = 132):
        super().__init__(mod)
        self.matches = matches
        self.funcs: dict[AttentionShape, relax.GlobalVar] = {}
        self.split_kv, self.sm_count = SplitKvCalls(self), sm_count

    def visit_call_(self, call):
        match = self.matches.get(call)
        return super().visit_call_(call) if match is None else self.attention(match)

    def function(self, shape: AttentionShape) -> relax.GlobalVar:
        if shape not in self.funcs:
            self.funcs[shape] = add_opaque_func(self.builder_, attention_func(shape), "attention")
        return self.funcs[shape]

    def load(self, base: relax.Expr, axes: tuple[int, ...] | None, shape: tuple[int, ...], dtype: str):
        x = self.visit_expr(base)
        if str(x.ty.dtype) != dtype:
            x = self.builder_.emit(relax.op.astype(x, dtype))
        if axes is not None:
            x = self.builder_.emit(relax.op.permute_dims(x, list(axes)))
        if static_shape(x) != list(shape):
            x = self.builder_.emit(relax.op.reshape(x, shape))
        return x

    def decode_shape(self, m: Match) -> DecodeAttentionShape | None:
        """The split-KV shape of a decode-sized attention (a few query rows per K/V head, the
        cache as ``[B, G, T, D]``), which the split-KV pair streams faster than the fused
        template's 64-row tiles (H200, B16 H32 TKV4096: 4.49 against 4.24 TB/s); else None."""
        s = m.shape
        _, k_layout, v_layout = s.operand_layouts
        if m.packed is not None or (k_layout, v_layout) != ("bhtd", "bhtd") \
                or (s.seq_q > 1 and s.operand_layouts[0] != "bhtd"):
            return None
        return decode_of(s.batch, s.kv_heads, s.group, s.seq_q, s.head_dim, s.causal, s.scale, s.dtype, self.sm_count)

    def attention(self, m: Match) -> relax.Expr:
        s = m.shape
        inputs = [(m.packed, None)] if m.packed is not None else [m.q, m.k, m.v]
        args = [self.load(base, axes, shape, s.dtype) for (base, axes), shape in zip(inputs, s.input_shapes)]
        decode = self.decode_shape(m)
        if decode is not None:
            out = relax.op.reshape(self.split_kv.emit(decode, s.seq_kv, args[0], args[1:]), s.out_shape)
        else:
            out = relax.call_tir(self.function(s), args, relax.TensorType(s.out_shape, s.dtype))
        shape = s.out_shape
        if m.out_axes is not None:
            out, shape = relax.op.permute_dims(self.builder_.emit(out), list(m.out_axes)), tuple(shape[a] for a in m.out_axes)
        if tuple(m.out_shape) != shape:
            out = relax.op.reshape(self.builder_.emit(out), m.out_shape)
        if m.out_dtype != s.dtype:
            out = relax.op.astype(self.builder_.emit(out), m.out_dtype)
        return out


def _fits(target) -> callable:
    """Whether the fused template takes a shape on ``target``: where the attention policy has a
    config for it (None: a wgmma target, as the other Hopper rewrites take it)."""
    if target is None:
        return lambda shape: fused_fits(shape, 90)
    arch = CUDA(target)
    return lambda shape: bool(attention_configs(shape, arch, 1))


def fused_attention(target=None) -> tvm.transform.Pass:
    """Attention (see the module docstring for its forms) as one call of the attention PrimFunc,
    where the fused template takes its shape on ``target``; a module with none is returned as
    it is."""
    fits = _fits(target)
    sm_count = CUDA(target).sm_count if target is not None else 132
    return matches_pass("fastdlight.FusedAttention", lambda func: find_matches(func, fits),
                        lambda mod, matches: Rewriter(mod, matches, sm_count))
