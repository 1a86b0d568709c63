"""The split-KV pair (:mod:`fastdlight.analysis.decode_attention`) as Relax calls: what both
attention rewrites emit for decode attention (the symbolic cache lengths of
:mod:`.decode_attention`, the static decode shapes :mod:`.fuse_attention` finds)."""

from __future__ import annotations

from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator

from fastdlight.analysis.decode_attention import (
    DecodeAttentionShape,
    decode_combine_func,
    decode_split_func,
)
from fastdlight.relax.rewrites import add_opaque_func


class SplitKvCalls:
    """The pair of PrimFuncs per (shape, cache length) a mutator's module gets, and their calls."""

    def __init__(self, mutator: PyExprMutator):
        self.mutator = mutator
        self.funcs: dict[tuple, tuple[relax.GlobalVar, relax.GlobalVar]] = {}

    def functions(self, shape: DecodeAttentionShape, seq_kv) -> tuple[relax.GlobalVar, relax.GlobalVar]:
        """The chunk step and the merge; a symbolic ``seq_kv`` gives the step a variable of the
        model's name (so ``opt_shapes`` reaches it)."""
        length = seq_kv if isinstance(seq_kv, int) else str(seq_kv.name)
        key = (shape, length)
        if key not in self.funcs:
            var = seq_kv if isinstance(seq_kv, int) else tirx.Var(length, "int64")
            builder = self.mutator.builder_
            self.funcs[key] = (add_opaque_func(builder, decode_split_func(shape, var), "decode_attention"),
                               add_opaque_func(builder, decode_combine_func(shape), "decode_combine"))
        return self.funcs[key]

    def emit(self, shape: DecodeAttentionShape, seq_kv, q: relax.Expr, caches, new=()) -> relax.Expr:
        """``[B, G, R, D]`` attention of ``q`` (any shape of those elements, cast to the shape's
        dtype) over the K and V ``caches`` and, where appended, the ``new`` token's K and V (all
        visited already)."""
        builder = self.mutator.builder_
        split, combine = self.functions(shape, seq_kv)
        if str(q.ty.dtype) != shape.dtype:
            q = builder.emit(relax.op.astype(q, shape.dtype))
        q = builder.emit(relax.op.reshape(q, shape.input_shapes(1)[0]))
        parts = builder.emit(relax.call_tir(split, [q, *caches, *new],
                                            [relax.TensorType(p, "float32") for p in shape.partial_shapes]))
        merged = [builder.emit(relax.TupleGetItem(parts, i)) for i in range(3)]
        return builder.emit(relax.call_tir(combine, merged, relax.TensorType(shape.out_shape, shape.dtype)))
