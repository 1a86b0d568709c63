"""The scores of an attention read off its graph: the constants a binding holds (through casts
and layout changes), the scale that multiplies the scores, and the mask that the scores go
through before their softmax.

A mask is an additive constant (``0`` kept, ``-inf`` or at most :data:`MASKED_AT` masked) or a
``where`` on a constant condition (``masked_fill``, its fill value a constant or a variable bound
to one). It is causal where its kept entries are the bottom-right aligned lower triangle (the
top-left one when TQ = TKV), none where it keeps everything (:func:`causal_of`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import tvm
from tvm import relax

from fastdlight.relax.rewrites import call_to, static_shape

#: an additive mask entry at or below this masks its key: exp underflows to 0 in fp32 (torch's
#: ``finfo.min``, GPT-2's ``-1e4`` and ``-inf`` all are)
MASKED_AT = -1e4
#: ops that keep a tensor's last two axes and its elements' row-major order
LAYOUT_OPS = ("relax.reshape", "relax.expand_dims", "relax.squeeze")


class Graph:
    """One Relax function's bindings: what each variable is bound to, who reads it (None: the
    function's result), and which ones attention found so far replaces."""

    def __init__(self, func: relax.Function):
        self.values: dict[relax.Var, relax.Expr] = {}
        self.users: dict[relax.Var, list] = defaultdict(list)
        self.replaced: set[relax.Var] = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding):
                    self.values[binding.var] = binding.value
                for used in _vars_in(binding.value):
                    self.users[used].append(binding.var)
        for used in _vars_in(func.body.body):
            self.users[used].append(None)

    def value(self, expr: relax.Expr) -> relax.Expr:
        return self.values.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def constant(self, expr: relax.Expr) -> np.ndarray | None:
        """``expr``'s value when it is a constant, through casts and layout changes."""
        value = self.value(expr)
        if isinstance(value, tvm.ir.expr.Constant):
            try:
                return value.value.numpy()
            except Exception:  # noqa: BLE001 - a dtype numpy cannot hold (bf16 without ml_dtypes)
                return None
        call = call_to(value, "relax.astype", "relax.permute_dims", "relax.broadcast_to", *LAYOUT_OPS)
        inner = None if call is None else self.constant(call.args[0])
        shape = static_shape(value)
        if inner is None or shape is None:
            return None
        if call.op.name == "relax.permute_dims":
            axes = call.attrs.axes
            return np.transpose(inner, None if axes is None else [int(a) for a in axes])
        if call.op.name == "relax.broadcast_to":
            return np.broadcast_to(inner, shape)
        if call.op.name == "relax.astype":
            return inner.astype(str(call.attrs.dtype)) if str(call.attrs.dtype) in ("bool", "float32") else inner
        return inner.reshape(shape)

    def scalar(self, expr: relax.Expr) -> float | None:
        value = self.constant(expr)
        return float(value.reshape(())) if value is not None and value.size == 1 else None


def _vars_in(expr: relax.Expr) -> list[relax.Var]:
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def scaled_by(graph: Graph, value: relax.Expr) -> tuple[relax.Expr, float] | None:
    """``(x, c)`` where ``value`` is ``x * c``, ``c * x`` or ``x / (1 / c)`` with ``c`` a scalar constant."""
    call = call_to(value, "relax.multiply", "relax.divide")
    if call is None:
        return None
    if call.op.name == "relax.divide":
        scalar = graph.scalar(call.args[1])
        return None if not scalar else (call.args[0], 1.0 / scalar)
    for x, c in (call.args, call.args[::-1]):
        if (scalar := graph.scalar(c)) is not None and graph.constant(x) is None:
            return x, scalar
    return None


def masked_by(graph: Graph, call: relax.Call, tq: int, tkv: int) -> tuple[relax.Expr, np.ndarray] | None:
    """``(x, kept [TQ, TKV] entries)`` where ``call`` masks ``x``: ``x + mask`` or
    ``where(c, x, fill)`` / ``where(c, fill, x)`` (see the module docstring), keeping the same
    entries in every head; else None."""
    if call.op.name == "relax.add":
        masked = _additive(graph, call)
    else:
        masked = _selected(graph, call) if call.op.name == "relax.where" else None
    rows = None if masked is None else _kept_rows(masked[1], tq, tkv)
    return None if rows is None else (masked[0], rows)


def _additive(graph: Graph, add: relax.Call) -> tuple[relax.Expr, np.ndarray] | None:
    """``(x, kept entries)`` of ``x + mask``, ``mask`` a constant of 0 (kept) and masked values."""
    for x, mask in (add.args, add.args[::-1]):
        values = graph.constant(mask)
        if values is not None and graph.constant(x) is None:
            kept = values == 0
            return (x, kept) if np.all(kept | (values <= MASKED_AT)) else None
    return None


def _selected(graph: Graph, where: relax.Call) -> tuple[relax.Expr, np.ndarray] | None:
    """``(x, kept entries)`` of ``where(c, x, fill)`` or ``where(c, fill, x)``, ``c`` a
    constant and ``fill`` masked values (``masked_fill``)."""
    cond = graph.constant(where.args[0])
    shape = static_shape(where)
    if cond is None or shape is None:
        return None
    cond = np.broadcast_to(cond.astype(bool), shape)
    for x, fill, keep in ((where.args[1], where.args[2], cond), (where.args[2], where.args[1], ~cond)):
        values = graph.constant(fill)
        if values is not None and graph.constant(x) is None:
            return (x, keep) if np.all(np.broadcast_to(values, shape)[~keep] <= MASKED_AT) else None
    return None


def _kept_rows(keep: np.ndarray, tq: int, tkv: int) -> np.ndarray | None:
    """The ``[TQ, TKV]`` entries a mask keeps when it keeps the same ones in every head, else None."""
    try:
        full = np.broadcast_to(keep, (*keep.shape[:-2], tq, tkv) if keep.ndim >= 2 else (tq, tkv))
    except ValueError:
        return None
    flat = full.reshape(-1, tq, tkv)
    return flat[0] if np.all(flat == flat[0]) else None


def causal_of(keep: np.ndarray) -> bool | None:
    """Whether the kept ``[TQ, TKV]`` entries are all (False) or the bottom-right causal
    triangle (True); None for any other mask."""
    tq, tkv = keep.shape
    if keep.all():
        return False
    if tq <= tkv and np.array_equal(keep, np.tril(np.ones((tq, tkv), bool), tkv - tq)):
        return True
    return None
