"""The split-KV pair (:mod:`fastdlight.analysis.decode_attention`) as Relax calls: what both
attention rewrites emit for decode attention (the symbolic cache lengths of
:mod:`.decode_attention`, the static decode shapes :mod:`.fuse_attention` finds).

Where the chunks are merged (``FASTDLIGHT_DECODE_MERGE``): ``auto`` (the default) emits the
merged form, one call of a chunk step whose last CTA of each (batch, K/V head) merges the chunks
(its ticket counters a constant of the module: zeros, left zero by every call), where that CTA
folds at most :data:`STEP_MERGE_ROWS` chunk rows (the chunks times the query rows a CTA holds),
and the pair (a merge kernel of its own) where it would fold more; ``step`` and ``kernel`` ask
for one form always. On an H200 (2026-11-30, fixed configs against torch SDPA in CUDA graphs)
the merged step was 0.6-2.5% faster at B1 H32 with 17 chunks of one row and 0.6% with one chunk
(B16, where it writes the output itself); with the 4 rows of B1 with 8 K/V heads the pair was
faster at 17, 33 and 66 chunks (by 11%, 17% and 25%: the last CTA merges alone, after every
other CTA, and its work grows with the rows).
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
    block_rows,
    decode_combine_func,
    decode_split_func,
)
from fastdlight.measure.inputs import INPUT_VALUES
from fastdlight.relax.rewrites import add_opaque_func

#: where the chunks are merged: "auto", "kernel" (a kernel of its own) or "step" (the chunk step's last CTA)
MERGE_ENV = "FASTDLIGHT_DECODE_MERGE"
MERGE_FORMS = ("auto", "kernel", "step")
#: most chunk rows (chunks x the query rows a CTA holds) the "auto" form merges in the step
#: (measured: 17 chunks of one row faster merged; 17, 33 and 66 chunks of 4 rows as a pair)
STEP_MERGE_ROWS = 24


def merge_form() -> str:
    """The form :data:`MERGE_ENV` asks for (one of :data:`MERGE_FORMS`)."""
    value = os.environ.get(MERGE_ENV, "auto").strip().lower() or "auto"
    if value not in MERGE_FORMS:
        raise ValueError(f"{MERGE_ENV}={value!r}: expected one of {', '.join(repr(f) for f in MERGE_FORMS)}")
    return value


def merges_in_step(shape: DecodeAttentionShape, form: str) -> bool:
    """Whether ``shape`` merges its chunks in its step under ``form``."""
    return form == "step" or (form == "auto" and shape.splits * block_rows(shape.rows) <= STEP_MERGE_ROWS)


class SplitKvCalls:
    """The pair of PrimFuncs per (shape, cache length) a mutator's module gets, and their calls."""

    def __init__(self, mutator: PyExprMutator, merged: bool | None = None):
        """``merged``: emit the merged form always (True) or never (False); default: as
        :data:`MERGE_ENV` says."""
        self.mutator = mutator
        self.form = merge_form() if merged is None else ("step" if merged else "kernel")
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
        shape = dataclasses.replace(shape, merged=merges_in_step(shape, self.form))
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
