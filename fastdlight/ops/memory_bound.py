"""The memory-bound ops: elementwise (add, copy, bias-relu), transpose, row/column reductions
and softmax."""

from __future__ import annotations

import math

import numpy as np
from tvm import te, tirx

from fastdlight.analysis.dtypes import NBYTES
from fastdlight.ops.core import Op, check_dtype, check_shape, prim_func


def elementwise(shape, dtype="float16", op="add") -> Op:
    """add: C = A + B; copy: B = A; bias_relu: C = max(A + bias[last axis], 0)."""
    shape = tuple(shape)
    check_shape(*shape)
    check_dtype(dtype)
    A = te.placeholder(shape, dtype, name="A")
    n = math.prod(shape) * NBYTES[dtype]
    if op == "copy":
        B = te.compute(shape, lambda *i: A[i], name="B")
        return Op("copy", prim_func([A, B], "copy"), lambda a: a.astype(np.float64), 0.0, 2 * n)
    if op == "add":
        B = te.placeholder(shape, dtype, name="B")
        C = te.compute(shape, lambda *i: A[i] + B[i], name="C")
        ref = lambda a, b: a.astype(np.float64) + b.astype(np.float64)  # noqa: E731
        return Op("add", prim_func([A, B, C], "add"), ref, float(math.prod(shape)), 3 * n)
    if op == "bias_relu":
        bias = te.placeholder((shape[-1],), dtype, name="bias")
        zero = tirx.const(0, dtype)
        C = te.compute(shape, lambda *i: tirx.max(A[i] + bias[i[-1]], zero), name="C")
        ref = lambda a, b: np.maximum(a.astype(np.float64) + b.astype(np.float64), 0)  # noqa: E731
        return Op("bias_relu", prim_func([A, bias, C], "bias_relu"), ref, 2.0 * math.prod(shape), 2 * n)
    raise ValueError(f"unknown elementwise op {op!r}; use add, copy or bias_relu")


def transpose(shape, axes, dtype="float16", out_dtype=None) -> Op:
    """B = cast(transpose(A, axes), out_dtype): a layout change (e.g. NCHW -> NHWC: axes 0, 2, 3, 1)."""
    shape, axes = tuple(shape), tuple(axes)
    check_shape(*shape)
    check_dtype(dtype)
    out_dtype = check_dtype(out_dtype or dtype)
    if sorted(axes) != list(range(len(shape))):
        raise ValueError(f"axes {axes} are not a permutation of the {len(shape)} axes of {shape}")
    A = te.placeholder(shape, dtype, name="A")
    B = te.compute(tuple(shape[a] for a in axes),
                   lambda *i: A[tuple(i[axes.index(d)] for d in range(len(shape)))].astype(out_dtype), name="B")
    n = math.prod(shape)
    return Op("transpose", prim_func([A, B], "transpose"), lambda a: np.transpose(a.astype(np.float64), axes), 0.0,
              float(n * (NBYTES[dtype] + NBYTES[out_dtype])))


def reduce(shape, dtype="float16", op="sum", axis=-1) -> Op:
    """Sum or max of a 2-D tensor over its last (axis=-1) or first (axis=0) axis."""
    rows, cols = shape
    check_shape(rows, cols)
    check_dtype(dtype, ("float16", "bfloat16", "float32"))
    if op not in ("sum", "max"):
        raise ValueError(f"unknown reduction {op!r}; use sum or max")
    if axis not in (-1, 1, 0):
        raise ValueError("reduce axis must be -1 (last) or 0 (first)")
    A = te.placeholder((rows, cols), dtype, name="A")
    inner = axis in (-1, 1)
    r = te.reduce_axis((0, cols if inner else rows), name="k")
    fn = te.sum if op == "sum" else te.max
    if inner:
        B = te.compute((rows,), lambda i: fn(A[i, r], axis=r), name="B")
    else:
        B = te.compute((cols,), lambda j: fn(A[r, j], axis=r), name="B")
    npfn = np.sum if op == "sum" else np.max
    ref = lambda a: npfn(a.astype(np.float64), axis=1 if inner else 0)  # noqa: E731
    out = rows if inner else cols
    nbytes = (rows * cols + out) * NBYTES[dtype]
    return Op(f"reduce_{op}", prim_func([A, B], f"reduce_{op}"), ref, float(rows * cols), nbytes)


def softmax(rows, cols, dtype="float16", batch=None) -> Op:
    """Numerically stable softmax over the last axis (max, exp-sum, normalize), fp32 inside;
    ``batch``: ``[batch, rows, cols]``, as attention's scores."""
    check_shape(rows, cols, *(() if batch is None else (batch,)))
    check_dtype(dtype, ("float16", "bfloat16", "float32"))
    lead = () if batch is None else (batch,)
    A = te.placeholder((*lead, rows, cols), dtype, name="A")
    k1 = te.reduce_axis((0, cols), name="k1")
    k2 = te.reduce_axis((0, cols), name="k2")
    mx = te.compute((*lead, rows), lambda *i: te.max(A[(*i, k1)].astype("float32"), axis=k1), name="row_max")
    ex = te.compute((*lead, rows, cols), lambda *i: te.exp(A[i].astype("float32") - mx[i[:-1]]), name="row_exp")
    sm = te.compute((*lead, rows), lambda *i: te.sum(ex[(*i, k2)], axis=k2), name="row_sum")
    out = te.compute((*lead, rows, cols), lambda *i: (ex[i] / sm[i[:-1]]).astype(dtype), name="softmax")

    def ref(a):
        a = a.astype(np.float64)
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    n = math.prod(lead) * rows * cols
    return Op("softmax", prim_func([A, out], "softmax"), ref, 5.0 * n, 2 * n * NBYTES[dtype])
