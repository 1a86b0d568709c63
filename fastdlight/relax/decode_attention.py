"""Decode attention (a few query rows per K/V head against a KV cache) as the split-KV pair of
PrimFuncs of :mod:`fastdlight.analysis.decode_attention`: a chunk step that the
``decode_attention`` template runs at the bandwidth limit, and the merge of the chunks.

The form, as ``for_inference`` leaves a decode step with the cache length symbolic (the fused
attention rewrite takes static shapes only):

    keys   = concat(k_cache, k_new, axis=2)      [B, G, L + 1, D]  (or the cache alone)
    scores = matmul(q, keysᵀ) * scale            q [B * G, R, D] (reshapes of [B, G, R, D])
    P      = softmax(scores, axis=-1)            through ToMixedPrecision's casts
    out    = matmul(P, concat(v_cache, v_new))

``R`` query rows per K/V head (GQA's group times the query tokens) at most
:data:`~fastdlight.analysis.decode_attention.MAX_GROUP_ROWS` (MQA's whole group of query heads;
past 8 the chunk step takes them in blocks). K and V may be repeated per query head
by a broadcast only where it repeats nothing. The cache is read where it lies: the joined
tensors are no longer needed (unless something else reads them). Scores and probabilities must
have no other reader. The cache length must be a static size or a bare symbolic variable (the
chunk step names its variable as the model does, so ``opt_shapes`` reaches it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import relax, sym, tirx
from tvm.ir import IRModule
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.analysis.decode_attention import (
    DTYPES,
    MAX_GROUP_ROWS,
    DecodeAttentionShape,
    default_splits,
    split_fits,
)
from fastdlight.arch import CUDA
from fastdlight.relax.attention_masks import Graph, scaled_by
from fastdlight.relax.fuse_attention import SCALE_ROUNDING, Matcher
from fastdlight.relax.rewrites import call_to, matches_pass
from fastdlight.relax.split_kv import SplitKvCalls

_ANALYZER = sym.Analyzer()


def dims(expr) -> list | None:
    """``expr``'s shape (ints and expressions), or None where it is no tensor of known rank."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(v) if isinstance(v, tirx.IntImm) else v for v in ty.shape.values]


def same(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return _ANALYZER.can_prove_equal(tirx.const(a, "int64") if isinstance(a, int) else a,
                                     tirx.const(b, "int64") if isinstance(b, int) else b)


def same_dims(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


@dataclass(frozen=True)
class DecodeMatch:
    """What replaces one decode attention: the chunk step's inputs (the new token's K and V
    None without one), the cache length (an int or the model's variable), and the replaced
    value's shape and dtype."""

    shape: DecodeAttentionShape
    seq_kv: object
    q: relax.Expr
    caches: tuple[relax.Expr, relax.Expr]
    new: tuple[relax.Expr, relax.Expr] | None
    out_shape: list
    out_dtype: str


class DecodeMatcher(Matcher):
    """:class:`~.fuse_attention.Matcher`'s region bookkeeping, over shapes that may be symbolic."""

    def view_of(self, expr: relax.Expr, region: bool = True) -> relax.Expr:
        """``expr`` through float casts, reshapes of its leading axes and broadcasts that
        repeat nothing."""
        while True:
            value = self.through(expr) if region else self.graph.value(expr)
            call = call_to(value, "relax.astype", "relax.reshape", "relax.broadcast_to")
            if call is None:
                return expr
            before, after = dims(call.args[0]), dims(call)
            if before is None or after is None or len(before) < 2 or len(after) < 2:
                return expr
            if call.op.name == "relax.astype" and str(call.attrs.dtype) not in (*DTYPES, "float32"):
                return expr
            if call.op.name == "relax.broadcast_to" and not same_dims(before, after):
                return expr
            if call.op.name == "relax.reshape" and not same_dims(before[-2:], after[-2:]):
                return expr
            expr = call.args[0]

    def softmax_of(self, expr: relax.Expr) -> relax.Call | None:
        call = call_to(self.through(self.view_of(expr)), "relax.nn.softmax")
        return call if call is not None and int(call.attrs.axis) in (-1, len(dims(call) or ()) - 1) else None

    def scores_of(self, expr: relax.Expr) -> tuple[relax.Call, float] | None:
        scale = 1.0
        while True:
            expr = self.view_of(expr)
            value = self.through(expr)
            if (scaled := scaled_by(self.graph, value)) is not None:
                expr, factor = scaled
                scale *= factor
                continue
            call = call_to(value, "relax.matmul")
            return (call, scale) if call is not None else None

    def keys_of(self, expr: relax.Expr, transposed: bool):
        """``(cache, new or None)``: the ``[B, G, T, D]`` tensors ``expr`` reads (Kᵀ when
        ``transposed``), joined along T by a concat or the cache alone."""
        expr = self.view_of(expr, region=False)
        if transposed:
            perm = call_to(self.graph.value(expr), "relax.permute_dims")
            axes = None if perm is None or perm.attrs.axes is None else [int(a) for a in perm.attrs.axes]
            if axes != [0, 1, 3, 2]:
                return None
            expr = self.view_of(perm.args[0], region=False)
        joined = call_to(self.graph.value(expr), "relax.concat")
        if joined is None:
            return (expr, None) if len(dims(expr) or ()) == 4 else None
        parts = joined.args[0]
        axis = int(joined.attrs.axis) if joined.attrs.axis is not None else 0
        if not isinstance(parts, relax.Tuple) or len(parts.fields) != 2 or axis not in (2, -2):
            return None
        cache, new = parts.fields
        c, n = dims(cache), dims(new)
        if c is None or n is None or len(c) != 4 or not same_dims(c[:2] + c[3:], n[:2] + n[3:]) or n[2] != 1:
            return None
        return cache, new


def match_decode(graph: Graph, root: relax.Var, pv: relax.Call, sm_count: int) -> DecodeMatch | None:
    """The decode attention whose ``matmul(P, V)`` is ``pv``, bound to ``root``, or None."""
    matcher = DecodeMatcher(graph)
    softmax = matcher.softmax_of(pv.args[0])
    scored = None if softmax is None else matcher.scores_of(softmax.args[0])
    if scored is None:
        return None
    qk, scale = scored
    keys, values = matcher.keys_of(qk.args[1], transposed=True), matcher.keys_of(pv.args[1], transposed=False)
    if keys is None or values is None or (keys[1] is None) != (values[1] is None):
        return None
    (kc, kn), (vc, vn) = keys, values
    q, shapes = qk.args[0], [dims(e) for e in (qk.args[0], kc, vc, pv)]
    if any(s is None for s in shapes):
        return None
    qs, ks, vs, out = shapes
    b, g, seq_kv, d = ks
    if not same_dims(ks, vs) or not all(isinstance(x, int) for x in (b, g, d)) or len(qs) < 2 or qs[-1] != d:
        return None
    rows = qs[-2]
    if not isinstance(rows, int) or not all(isinstance(x, int) for x in qs[:-2]) or math.prod(qs[:-2]) != b * g \
            or not same_dims(out[-2:], [rows, d]) or math.prod(out[:-2]) != b * g:
        return None
    if not isinstance(seq_kv, (int, tirx.Var)) or not matcher.exclusive(root):
        return None
    dtype = str(kc.ty.dtype)
    if dtype not in DTYPES or str(vc.ty.dtype) != dtype or rows > MAX_GROUP_ROWS or scale <= 0:
        return None
    if abs(scale * math.sqrt(d) - 1.0) < SCALE_ROUNDING:
        scale = 1.0 / math.sqrt(d)
    try:
        shape = DecodeAttentionShape(b, g, rows, d, default_splits(b, g, sm_count, rows), kn is not None, scale, dtype)
    except ValueError:
        return None
    if not split_fits(shape):
        return None
    return DecodeMatch(shape, seq_kv, q, (kc, vc), None if kn is None else (kn, vn), out, str(pv.ty.dtype))


def find_decode(func: relax.Function, sm_count: int) -> dict[relax.Call, DecodeMatch]:
    graph = Graph(func)
    found = {}
    for var, value in graph.values.items():
        call = call_to(value, "relax.matmul")
        match = None if call is None else match_decode(graph, var, call, sm_count)
        if match is None:
            continue
        users = graph.users[var]
        cast = call_to(graph.value(users[0]), "relax.astype") if len(users) == 1 and users[0] is not None else None
        if cast is not None and str(cast.attrs.dtype) == match.shape.dtype:
            call = cast  # the fp32 product ToMixedPrecision narrows: no round trip through fp32
            match = DecodeMatch(**{**match.__dict__, "out_dtype": match.shape.dtype})
        found[call] = match
    return found


@mutator
class DecodeRewriter(PyExprMutator):
    """Each matched call as the chunk step and the merge (one pair of PrimFuncs per shape)."""

    def __init__(self, mod: IRModule, matches: dict[relax.Call, DecodeMatch]):
        super().__init__(mod)
        self.matches = matches
        self.calls = SplitKvCalls(self)

    def visit_call_(self, call):
        m = self.matches.get(call)
        if m is None:
            return super().visit_call_(call)
        out = self.calls.emit(m.shape, m.seq_kv, self.visit_expr(m.q), [self.visit_expr(e) for e in m.caches],
                              [self.visit_expr(e) for e in m.new or ()])
        out = relax.op.reshape(out, m.out_shape)
        return out if m.out_dtype == m.shape.dtype else relax.op.astype(self.builder_.emit(out), m.out_dtype)


def decode_attention(target=None) -> tvm.transform.Pass:
    """Decode attention (see the module docstring) as the split-KV pair of PrimFuncs, the
    chunks from ``target``'s SM count; a module with none is returned as it is."""
    sm_count = CUDA(target).sm_count if target is not None else 132
    return matches_pass("fastdlight.DecodeAttention", lambda func: find_decode(func, sm_count), DecodeRewriter)
