"""The split-KV pair (:mod:`fastdlight.analysis.decode_attention`) as Relax calls: what both
attention rewrites emit for decode attention (the symbolic cache lengths of
:mod:`.decode_attention`, the static decode shapes :mod:`.fuse_attention` finds).

``FASTDLIGHT_DECODE_MERGE=step`` emits the merged form instead: one call of a chunk step whose
last CTA of each (batch, K/V head) merges the chunks, its ticket counters a constant of the
module (zeros, left zero by every call). It saves the merge kernel and the wait for it; it
has not yet been timed on a GPU against the pair, which stays the default (``kernel``).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator

from fastdlight.analysis.decode_attention import (
    TICKETS,
    DecodeAttentionShape,
    decode_combine_func,
    decode_split_func,
)
from fastdlight.measure.inputs import INPUT_VALUES
from fastdlight.relax.rewrites import add_opaque_func

#: where the chunks are merged: "kernel" (a kernel of its own) or "step" (the chunk step's last CTA)
MERGE_ENV = "FASTDLIGHT_DECODE_MERGE"


def merge_in_step() -> bool:
    """Whether :data:`MERGE_ENV` asks for the merged form."""
    value = os.environ.get(MERGE_ENV, "kernel").strip().lower() or "kernel"
    if value not in ("kernel", "step"):
        raise ValueError(f"{MERGE_ENV}={value!r}: expected 'kernel' or 'step'")
    return value == "step"


class SplitKvCalls:
    """The pair of PrimFuncs per (shape, cache length) a mutator's module gets, and their calls."""

    def __init__(self, mutator: PyExprMutator, merged: bool | None = None):
        """``merged``: emit the merged form (default: as :data:`MERGE_ENV` says)."""
        self.mutator = mutator
        self.merged = merge_in_step() if merged is None else merged
        self.funcs: dict[tuple, tuple[relax.GlobalVar, relax.GlobalVar | None]] = {}

    def functions(self, shape: DecodeAttentionShape, seq_kv) -> tuple[relax.GlobalVar, relax.GlobalVar | None]:
        """The chunk step and the merge (None for a merged shape); a symbolic ``seq_kv`` gives
        the step a variable of the model's name (so ``opt_shapes`` reaches it)."""
        length = seq_kv if isinstance(seq_kv, int) else str(seq_kv.name)
        key = (shape, length)
        if key not in self.funcs:
            var = seq_kv if isinstance(seq_kv, int) else tirx.Var(length, "int64")
            builder = self.mutator.builder_
            step = decode_split_func(shape, var)
            if shape.merged:  # the tickets start at zero (a tuning run's inputs too)
                step = step.with_attr(INPUT_VALUES, {TICKETS: 0.0})
            self.funcs[key] = (add_opaque_func(builder, step, "decode_attention"),
                               None if shape.merged else add_opaque_func(builder, decode_combine_func(shape),
                                                                         "decode_combine"))
        return self.funcs[key]

    def emit(self, shape: DecodeAttentionShape, seq_kv, q: relax.Expr, caches, new=()) -> relax.Expr:
        """``[B, G, R, D]`` attention of ``q`` (any shape of those elements, cast to the shape's
        dtype) over the K and V ``caches`` and, where appended, the ``new`` token's K and V (all
        visited already)."""
        builder = self.mutator.builder_
        shape = dataclasses.replace(shape, merged=self.merged)
        split, combine = self.functions(shape, seq_kv)
        if str(q.ty.dtype) != shape.dtype:
            q = builder.emit(relax.op.astype(q, shape.dtype))
        q = builder.emit(relax.op.reshape(q, shape.input_shapes(1)[0]))
        partials = [relax.TensorType(p, "float32") for p in shape.partial_shapes]
        if shape.merged:
            tickets = relax.const(np.zeros(shape.tickets_shape, "int32"))
            out = relax.TensorType(shape.out_shape, shape.dtype)
            both = builder.emit(relax.call_tir(split, [q, *caches, *new, tickets], [*partials, out]))
            return builder.emit(relax.TupleGetItem(both, 3))
        parts = builder.emit(relax.call_tir(split, [q, *caches, *new], partials))
        merged = [builder.emit(relax.TupleGetItem(parts, i)) for i in range(3)]
        return builder.emit(relax.call_tir(combine, merged, relax.TensorType(shape.out_shape, shape.dtype)))
