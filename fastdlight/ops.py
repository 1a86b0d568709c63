"""Builders for the operators fastdlight tunes out of the box (CLI, tests, benchmarks).

Each builder returns an :class:`Op`: the TIR PrimFunc, a float64 numpy reference, and the
work it does (FLOPs, minimal bytes moved) so results can be reported as TFLOPS or GB/s.
The last parameter of every PrimFunc is its output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tvm import te, tirx

from fastdlight.analysis.attention import AttentionShape, attention_func
from fastdlight.analysis.decode_attention import (
    TICKETS,
    DecodeAttentionShape,
    chunk_reference,
    combine_reference,
    decode_paged_func,
    decode_split_func,
)
from fastdlight.analysis.weight_only import PER_WORD, WeightOnlyShape, weight_only_func
from fastdlight.analysis.dtypes import FP8_DTYPES, NBYTES, default_out_dtype
from fastdlight.analysis.dtypes import OP_DTYPES as DTYPES
from fastdlight.measure.inputs import DISTINCT_INDICES, INPUT_VALUES, RANDOM_BITS


@dataclass
class Op:
    name: str
    func: tirx.PrimFunc
    reference: Callable[..., np.ndarray]  # float64 result from the numpy inputs
    flops: float
    bytes: float

    @property
    def memory_bound(self) -> bool:
        # Arithmetic intensity below ~20 FLOP/byte cannot be compute bound on any modern GPU.
        return self.flops < 20 * self.bytes


def _check_dtype(dtype: str, allowed=DTYPES) -> str:
    if dtype not in allowed:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(allowed)}")
    return dtype


def _check_shape(*dims: int) -> None:
    for d in dims:
        if not isinstance(d, (int, np.integer)) or d <= 0:
            raise ValueError(f"shape dimensions must be positive integers, got {dims}")
        if d >= 2**63:  # TVM's FFI would say only that the value is not an int64
            raise ValueError(f"shape dimensions must be below 2^63 (int64), got {d}")


#: tensors with more elements than this are indexed with int64 (int32 offsets would overflow)
INT32_ELEMENTS = 2**31 - 1


def _prim_func(tensors, name: str) -> tirx.PrimFunc:
    big = any(math.prod(int(d) for d in t.shape) > INT32_ELEMENTS for t in tensors)
    return te.create_prim_func(tensors, index_dtype_override="int64" if big else None).with_attr("global_symbol", name)


def matmul(m, n, k, dtype="float16", out_dtype=None, layout="NN", batch=None, acc_dtype=None) -> Op:
    """C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]; layout letters say whether A / B are transposed
    in memory (N: A is M×K, B is K×N; T: A is K×M, B is N×K). ``acc_dtype``: accumulate in it and
    cast the result to ``out_dtype`` (an epilogue block), as cuBLAS does for fp16 with fp32 sums."""
    _check_shape(m, n, k, *(() if batch is None else (batch,)))
    _check_dtype(dtype, ("float16", "bfloat16", "float32", "int8") + FP8_DTYPES)
    out_dtype = _check_dtype(out_dtype or default_out_dtype(dtype))
    layout = layout.upper()
    if layout not in ("NN", "NT", "TN", "TT"):
        raise ValueError(f"unsupported matmul layout {layout!r}; use NN, NT, TN or TT")
    if dtype in FP8_DTYPES and layout != "NT":
        raise ValueError(f"{dtype} matmuls run on Hopper tensor cores, which read both operands K-major: "
                         f"layout NT (A is M×K, B is N×K), not {layout}")
    pre = () if batch is None else (batch,)
    a_shape = pre + ((k, m) if layout[0] == "T" else (m, k))
    b_shape = pre + ((n, k) if layout[1] == "T" else (k, n))
    A = te.placeholder(a_shape, dtype, name="A")
    B = te.placeholder(b_shape, dtype, name="B")
    r = te.reduce_axis((0, k), name="k")

    def a_at(b, i, kk):
        idx = (kk, i) if layout[0] == "T" else (i, kk)
        return A[b + idx] if b else A[idx]

    def b_at(b, j, kk):
        idx = (j, kk) if layout[1] == "T" else (kk, j)
        return B[b + idx] if b else B[idx]

    acc = _check_dtype(acc_dtype or out_dtype)

    def body(*ax):
        b, (i, j) = ax[:-2], ax[-2:]
        return te.sum(a_at(b, i, r).astype(acc) * b_at(b, j, r).astype(acc), axis=r)

    C = te.compute(pre + (m, n), body, name="C")
    if acc != out_dtype:
        C = te.compute(pre + (m, n), lambda *ax: C[ax].astype(out_dtype), name="D")

    def ref(a, b):
        a = a.astype(np.float64)
        b = b.astype(np.float64)
        if layout[0] == "T":
            a = np.swapaxes(a, -1, -2)
        if layout[1] == "T":
            b = np.swapaxes(b, -1, -2)
        return a @ b

    nb = batch or 1
    nbytes = nb * ((m * k + k * n) * NBYTES[dtype] + m * n * NBYTES[out_dtype])
    return Op(f"matmul_{layout}", _prim_func([A, B, C], "matmul"), ref, 2.0 * nb * m * n * k, nbytes)


#: how an FP8 matmul's result is scaled back: one scale per operand, or one per row of A and
#: one per row of B (the output's rows and columns), as ``torch._scaled_mm`` takes them
FP8_SCALES = ("tensor", "row")


def matmul_scaled(m, n, k, dtype="float8_e4m3fn", out_dtype="float16", scales="tensor") -> Op:
    """``D[i, j] = (sum_k A[i, k] * B[j, k]) * SA * SB`` in ``out_dtype``: 8-bit inputs (A is
    M×K, B is N×K), fp32 sums, the scales applied in the epilogue. ``scales``: "tensor" (SA and
    SB one float32 each, shape [1]) or "row" (SA per row of A, [M]; SB per row of B, [N])."""
    _check_shape(m, n, k)
    _check_dtype(dtype, FP8_DTYPES)
    _check_dtype(out_dtype, ("float16", "bfloat16", "float32"))
    if scales not in FP8_SCALES:
        raise ValueError(f"scales must be one of {', '.join(FP8_SCALES)}, got {scales!r}")
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((n, k), dtype, name="B")
    SA = te.placeholder((m,) if scales == "row" else (1,), "float32", name="SA")
    SB = te.placeholder((n,) if scales == "row" else (1,), "float32", name="SB")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[j, r].astype("float32"), axis=r),
                   name="C")
    row = (lambda i: i) if scales == "row" else (lambda i: 0)
    D = te.compute((m, n), lambda i, j: (C[i, j] * SA[row(i)] * SB[row(j)]).astype(out_dtype), name="D")

    def ref(a, b, sa, sb):
        out = a.astype(np.float64) @ b.astype(np.float64).T
        return out * np.asarray(sa, np.float64).reshape(-1, 1) * np.asarray(sb, np.float64).reshape(1, -1)

    nbytes = (m * k + n * k) * NBYTES[dtype] + m * n * NBYTES[out_dtype]
    return Op(f"matmul_scaled_{scales}", _prim_func([A, B, SA, SB, D], "matmul_scaled"), ref, 2.0 * m * n * k, nbytes)


def matmul_symbolic_rows(n, k, dtype="float16") -> tirx.PrimFunc:
    """C[m, n] = dtype(A[m, k] @ W[n, k]^T), summed in fp32, with the row count ``m`` symbolic and
    every dimension int64 (as Relax's legalization builds it): an LLM layer's GEMM at any number
    of tokens, for :func:`fastdlight.tune_dispatch`."""
    _check_shape(n, k)
    _check_dtype(dtype, ("float16", "bfloat16"))
    m, n, k = tirx.Var("m", "int64"), tirx.IntImm("int64", n), tirx.IntImm("int64", k)
    A = te.placeholder((m, k), dtype, name="A")
    W = te.placeholder((n, k), dtype, name="W")
    r = te.reduce_axis((0, k), name="k")
    acc = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * W[j, r].astype("float32"), axis=r),
                     name="acc")
    C = te.compute((m, n), lambda i, j: acc[i, j].astype(dtype), name="C")
    return te.create_prim_func([A, W, C]).with_attr("global_symbol", "matmul_symbolic_rows")


def matmul_bias_relu(m, n, k, dtype="float16") -> Op:
    """D = dtype(relu(A·Bᵀ + bias)) with the product accumulated in fp32: a matmul followed by an
    epilogue (bias, relu, cast) that templates fuse into the same kernel."""
    _check_shape(m, n, k)
    _check_dtype(dtype, ("float16", "float32"))
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((n, k), dtype, name="B")
    bias = te.placeholder((n,), dtype, name="bias")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[j, r].astype("float32"), axis=r), name="C")
    D = te.compute((m, n), lambda i, j: tirx.max(C[i, j] + bias[j].astype("float32"), 0.0).astype(dtype), name="D")

    def ref(a, b, c):
        return np.maximum(a.astype(np.float64) @ b.astype(np.float64).T + c.astype(np.float64), 0)

    nbytes = (m * k + n * k + n + m * n) * NBYTES[dtype]
    return Op("matmul_bias_relu", _prim_func([A, B, bias, D], "matmul_bias_relu"), ref, 2.0 * m * n * k, nbytes)


def matmul_gated(m, n, k, dtype="float16") -> Op:
    """D = silu(A·Bᵀ + bias) * G, the product accumulated in fp32, the bias fp32 and the gate
    ``G[m, n]`` a second tensor in ``dtype``: the epilogue of an LLM's gated MLP projection, with
    one read per output column and one per output element."""
    _check_shape(m, n, k)
    _check_dtype(dtype, ("float16", "bfloat16"))
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((n, k), dtype, name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    G = te.placeholder((m, n), dtype, name="G")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[j, r].astype("float32"), axis=r), name="C")
    S = te.compute((m, n), lambda i, j: C[i, j] + bias[j], name="S")
    D = te.compute((m, n), lambda i, j: (S[i, j] * tirx.sigmoid(S[i, j]) * G[i, j].astype("float32")).astype(dtype),
                   name="D")

    def ref(a, b, c, g):
        s = a.astype(np.float64) @ b.astype(np.float64).T + c.astype(np.float64)
        return s / (1 + np.exp(-s)) * g.astype(np.float64)

    nbytes = (m * k + n * k + 2 * m * n) * NBYTES[dtype] + 4 * n
    return Op("matmul_gated", _prim_func([A, B, bias, G, D], "matmul_gated"), ref, 2.0 * m * n * k, nbytes)


def matmul_residual(m, n, k, dtype="float16") -> Op:
    """D = R + (bias + A·Bᵀ), all fp32 but the operands: a transformer's output projection added
    to an fp32 residual stream (one read per output element, 8 bytes a pair)."""
    _check_shape(m, n, k)
    _check_dtype(dtype, ("float16", "bfloat16"))
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((n, k), dtype, name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    R = te.placeholder((m, n), "float32", name="residual")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[j, r].astype("float32"), axis=r), name="C")
    D = te.compute((m, n), lambda i, j: R[i, j] + (bias[j] + C[i, j]), name="D")

    def ref(a, b, c, res):
        return res.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64).T + c.astype(np.float64)

    nbytes = (m * k + n * k) * NBYTES[dtype] + 4 * (2 * m * n + n)
    return Op("matmul_residual", _prim_func([A, B, bias, R, D], "matmul_residual"), ref, 2.0 * m * n * k, nbytes)


def conv2d_nhwc_ohwi(n, h, w, c, k, r=3, stride=1, pad=1, dtype="float16") -> Op:
    """Out = dtype(conv2d(In, W)) with NHWC data, OHWI weights ``W[k, r, s, c]`` and fp32 sums:
    a ResNet layer as ``relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})``
    and FuseOps leave it (TOPI's conv2d, then a cast)."""
    from tvm import topi

    _check_shape(n, h, w, c, k, r, stride)
    _check_dtype(dtype, ("float16", "bfloat16"))
    data = te.placeholder((n, h, w, c), dtype, name="data")
    weight = te.placeholder((k, r, r, c), dtype, name="weight")
    conv = topi.nn.conv2d(data, weight, stride, pad, 1, data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
    out = topi.cast(conv, dtype)
    hwio = conv2d_nhwc(n, h, w, c, k, r, r, stride, pad, "float32")

    def ref(i, wt):
        return hwio.reference(i, np.transpose(wt, (1, 2, 3, 0)))

    return Op("conv2d_nhwc_ohwi", _prim_func([data, weight, out], "conv2d_nhwc_ohwi"), ref, hwio.flops,
              hwio.bytes * NBYTES[dtype] // 4)


def gemv(n, k, m=1, dtype="float16", out_dtype=None) -> Op:
    """Y[m, n] = sum_k X[m, k] * W[n, k] (weights stored N×K as in linear layers); m <= 16 is
    the low-batch case."""
    _check_shape(m, n, k)
    _check_dtype(dtype, ("float16", "bfloat16", "float32", "int8"))
    out_dtype = _check_dtype(out_dtype or default_out_dtype(dtype))
    X = te.placeholder((m, k), dtype, name="X")
    W = te.placeholder((n, k), dtype, name="W")
    r = te.reduce_axis((0, k), name="k")
    Y = te.compute(
        (m, n), lambda i, j: te.sum(X[i, r].astype(out_dtype) * W[j, r].astype(out_dtype), axis=r), name="Y"
    )
    ref = lambda x, w: x.astype(np.float64) @ w.astype(np.float64).T  # noqa: E731
    nbytes = (m * k + n * k) * NBYTES[dtype] + m * n * NBYTES[out_dtype]
    return Op("gemv", _prim_func([X, W, Y], "gemv"), ref, 2.0 * m * n * k, nbytes)


def elementwise(shape, dtype="float16", op="add") -> Op:
    """add: C = A + B; copy: B = A; bias_relu: C = max(A + bias[last axis], 0)."""
    shape = tuple(shape)
    _check_shape(*shape)
    _check_dtype(dtype)
    A = te.placeholder(shape, dtype, name="A")
    n = math.prod(shape) * NBYTES[dtype]
    if op == "copy":
        B = te.compute(shape, lambda *i: A[i], name="B")
        return Op("copy", _prim_func([A, B], "copy"), lambda a: a.astype(np.float64), 0.0, 2 * n)
    if op == "add":
        B = te.placeholder(shape, dtype, name="B")
        C = te.compute(shape, lambda *i: A[i] + B[i], name="C")
        ref = lambda a, b: a.astype(np.float64) + b.astype(np.float64)  # noqa: E731
        return Op("add", _prim_func([A, B, C], "add"), ref, float(math.prod(shape)), 3 * n)
    if op == "bias_relu":
        bias = te.placeholder((shape[-1],), dtype, name="bias")
        zero = tirx.const(0, dtype)
        C = te.compute(shape, lambda *i: tirx.max(A[i] + bias[i[-1]], zero), name="C")
        ref = lambda a, b: np.maximum(a.astype(np.float64) + b.astype(np.float64), 0)  # noqa: E731
        return Op("bias_relu", _prim_func([A, bias, C], "bias_relu"), ref, 2.0 * math.prod(shape), 2 * n)
    raise ValueError(f"unknown elementwise op {op!r}; use add, copy or bias_relu")


def transpose(shape, axes, dtype="float16", out_dtype=None) -> Op:
    """B = cast(transpose(A, axes), out_dtype): a layout change (e.g. NCHW -> NHWC: axes 0, 2, 3, 1)."""
    shape, axes = tuple(shape), tuple(axes)
    _check_shape(*shape)
    _check_dtype(dtype)
    out_dtype = _check_dtype(out_dtype or dtype)
    if sorted(axes) != list(range(len(shape))):
        raise ValueError(f"axes {axes} are not a permutation of the {len(shape)} axes of {shape}")
    A = te.placeholder(shape, dtype, name="A")
    B = te.compute(tuple(shape[a] for a in axes),
                   lambda *i: A[tuple(i[axes.index(d)] for d in range(len(shape)))].astype(out_dtype), name="B")
    n = math.prod(shape)
    return Op("transpose", _prim_func([A, B], "transpose"), lambda a: np.transpose(a.astype(np.float64), axes), 0.0,
              float(n * (NBYTES[dtype] + NBYTES[out_dtype])))


def reduce(shape, dtype="float16", op="sum", axis=-1) -> Op:
    """Sum or max of a 2-D tensor over its last (axis=-1) or first (axis=0) axis."""
    rows, cols = shape
    _check_shape(rows, cols)
    _check_dtype(dtype, ("float16", "bfloat16", "float32"))
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
    return Op(f"reduce_{op}", _prim_func([A, B], f"reduce_{op}"), ref, float(rows * cols), nbytes)


def softmax(rows, cols, dtype="float16", batch=None) -> Op:
    """Numerically stable softmax over the last axis (max, exp-sum, normalize), fp32 inside;
    ``batch``: ``[batch, rows, cols]``, as attention's scores."""
    _check_shape(rows, cols, *(() if batch is None else (batch,)))
    _check_dtype(dtype, ("float16", "bfloat16", "float32"))
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
    return Op("softmax", _prim_func([A, out], "softmax"), ref, 5.0 * n, 2 * n * NBYTES[dtype])


def attention(batch, heads, seq_q, seq_kv, head_dim, kv_heads=None, causal=False, dtype="float16") -> Op:
    """Scaled dot-product attention per head, ``softmax(Q Kᵀ / sqrt(D)) V``: Q ``[B, H, TQ, D]``,
    K and V ``[B, G, TKV, D]``, out ``[B, H, TQ, D]`` in ``dtype``; scores, softmax and sums in
    fp32. ``kv_heads`` G (default H) divides H: query head h reads K/V head ``h // (H // G)``
    (GQA; MQA at G = 1). ``causal``: query i sees keys j <= i + TKV - TQ, the mask aligned to
    the bottom right (torch's ``causal_lower_right``; the same as ``is_causal=True`` when TQ =
    TKV), which a decode step (one query against the whole cache) needs; TQ <= TKV then."""
    _check_shape(batch, heads, seq_q, seq_kv, head_dim, *(() if kv_heads is None else (kv_heads,)))
    _check_dtype(dtype, ("float16", "bfloat16", "float32"))
    shape = AttentionShape(batch, heads, seq_q, seq_kv, head_dim, heads if kv_heads is None else kv_heads,
                           causal=causal, dtype=dtype)
    group, offset, scale = shape.group, shape.offset, shape.scale

    def ref(qa, ka, va):
        qa, ka, va = (x.astype(np.float64) for x in (qa, ka, va))
        ka, va = np.repeat(ka, group, axis=1), np.repeat(va, group, axis=1)
        sc = qa @ np.swapaxes(ka, -1, -2) * scale
        if causal:
            sc = np.where(np.arange(seq_kv)[None, :] <= np.arange(seq_q)[:, None] + offset, sc, -np.inf)
        e = np.exp(sc - sc.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ va

    nbytes = (2 * batch * heads * seq_q + 2 * batch * shape.kv_heads * seq_kv) * head_dim * NBYTES[dtype]
    return Op("attention", attention_func(shape), ref, shape.flops, nbytes)


def decode_attention(batch, kv_heads, rows, seq_kv, head_dim, splits=32, appended=True, dtype="float16",
                     page_size=0, merged=False) -> Op:
    """The chunk step of split-KV decode attention
    (:func:`~fastdlight.analysis.decode_attention.decode_split_func`): ``rows`` query rows per
    K/V head against a cache of ``seq_kv`` keys (and, ``appended``, the new token's key and
    value), cut into ``splits`` chunks. ``page_size``: the cache in pages of a pool
    (:func:`~fastdlight.analysis.decode_attention.decode_paged_func`), ``ceil(seq_kv /
    page_size)`` pages a sequence, every sequence ``seq_kv`` long (the page table random).
    ``merged``: the step also merges the chunks (its ticket counters zero)."""
    _check_shape(batch, kv_heads, rows, seq_kv, head_dim, splits)
    _check_dtype(dtype, ("float16", "bfloat16"))
    paged = page_size > 0
    shape = DecodeAttentionShape(batch, kv_heads, rows, head_dim, splits, appended and not paged, dtype=dtype,
                                 page_size=page_size, merged=merged)
    width = -(-seq_kv // page_size) if paged else 0

    def ref(q, k, v, *rest):
        if paged:  # gather each sequence's pages, in order, cut at its length
            table = rest[0].astype(np.int64)
            k, v = (pool[table].transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, -1, head_dim)[:, :, :seq_kv]
                    for pool in (k, v))
        elif appended:
            k, v = np.concatenate([k, rest[0]], axis=2), np.concatenate([v, rest[1]], axis=2)
        parts = chunk_reference(shape, q, k, v)
        return (*parts, combine_reference(*parts)) if merged else parts

    keys = seq_kv + int(shape.appended)
    flops = 4.0 * batch * kv_heads * rows * keys * head_dim
    known = ({"lengths": float(seq_kv)} if paged else {}) | ({TICKETS: 0.0} if merged else {})
    func = decode_paged_func(shape, batch * width + 3, width) if paged else decode_split_func(shape, seq_kv)
    if paged:
        func = func.with_attr(DISTINCT_INDICES, ["pages"])
    return Op("decode_attention", func.with_attr(INPUT_VALUES, known) if known else func, ref, flops,
              shape.cache_bytes(seq_kv))


def conv2d_nhwc(n, h, w, c, k, r=3, s=3, stride=1, pad=1, dtype="float16", out_dtype=None) -> Op:
    """Out[n, p, q, k] = sum_{r, s, c} In[n, p*stride + r - pad, q*stride + s - pad, c] * W[r, s, c, k]."""
    _check_shape(n, h, w, c, k, r, s, stride)
    if pad < 0:
        raise ValueError("padding must be >= 0")
    _check_dtype(dtype, ("float16", "bfloat16", "float32", "int8"))
    out_dtype = _check_dtype(out_dtype or default_out_dtype(dtype))
    p = (h + 2 * pad - r) // stride + 1
    q = (w + 2 * pad - s) // stride + 1
    if p <= 0 or q <= 0:
        raise ValueError("conv2d: kernel larger than the padded input")
    I = te.placeholder((n, h, w, c), dtype, name="data")
    W = te.placeholder((r, s, c, k), dtype, name="W")
    zero = tirx.const(0, dtype)
    P = te.compute(
        (n, h + 2 * pad, w + 2 * pad, c),
        lambda b, y, x, ci: tirx.if_then_else(
            tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad), I[b, y - pad, x - pad, ci], zero
        ),
        name="pad",
    )
    rr = te.reduce_axis((0, r), name="rr")
    rs = te.reduce_axis((0, s), name="rs")
    rc = te.reduce_axis((0, c), name="rc")
    O = te.compute(
        (n, p, q, k),
        lambda b, y, x, co: te.sum(
            P[b, y * stride + rr, x * stride + rs, rc].astype(out_dtype) * W[rr, rs, rc, co].astype(out_dtype),
            axis=[rr, rs, rc],
        ),
        name="conv",
    )

    def ref(i, wt):
        i = np.pad(i.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        wt = wt.astype(np.float64)
        out = np.zeros((n, p, q, k))
        for y in range(r):
            for x in range(s):
                patch = i[:, y : y + stride * p : stride, x : x + stride * q : stride, :]
                out += patch @ wt[y, x]
        return out

    flops = 2.0 * n * p * q * k * r * s * c
    nbytes = (n * h * w * c + r * s * c * k) * NBYTES[dtype] + n * p * q * k * NBYTES[out_dtype]
    return Op("conv2d_nhwc", _prim_func([I, W, O], "conv2d_nhwc"), ref, flops, nbytes)


def matmul_int4(m, n, k, group_size=128, dtype="float16", zero_point=False) -> Op:
    """Weight-only 4-bit matmul, as a linear layer quantized for serving holds it:
    Y[m, n] = sum_k X[m, k] * W[n, k], with W[n, k] = (q[n, k] - z) * S[n, k // group_size]
    dequantized in the kernel; q packed eight to a uint32 word along K (``Q[n, k // 8]``, the
    lowest nibble first), S the group scales, z 8 (symmetric) or, with ``zero_point``, the
    group's ``Z[n, k // group_size]``. fp32 sums, the result in ``dtype``."""
    return _weight_only(4, m, n, k, group_size, dtype, zero_point)


def matmul_int8(m, n, k, group_size=128, dtype="float16", zero_point=False) -> Op:
    """Weight-only 8-bit matmul: as :func:`matmul_int4` with q packed four to a word (``Q[n, k //
    4]``, the lowest byte first) and z 128 (symmetric) or the group's zero."""
    return _weight_only(8, m, n, k, group_size, dtype, zero_point)


def _weight_only(bits, m, n, k, group_size, dtype, zero_point) -> Op:
    _check_shape(m, n, k, group_size)
    _check_dtype(dtype, ("float16", "bfloat16"))
    shape = WeightOnlyShape((m,), n, k, group_size, dtype, dtype, zero_point, bits)
    func = weight_only_func(shape).with_attr(RANDOM_BITS, ["Q"])

    def ref(x, q, s, z=None):
        return x.astype(np.float64) @ dequantize_weights(q, s, z, group_size, dtype, bits).T

    groups = k // group_size
    nbytes = (m * k + (2 if zero_point else 1) * n * groups + m * n) * NBYTES[dtype] + n * k * bits // 8
    return Op(f"matmul_int{bits}", func, ref, 2.0 * m * n * k, nbytes)


def dequantize_weights(q, s, z, group_size: int, dtype: str = "float16", bits: int = 4) -> np.ndarray:
    """The float64 weights ``[N, K]`` packed words ``q`` (``[N, K / per word]`` uint32), scales
    ``s`` and zeros ``z`` (None: the middle of the range) stand for, each step rounded as the
    kernel rounds it (the value minus the zero and the product with the scale are ``dtype``
    operations)."""
    n, per_word = q.shape[0], PER_WORD[bits]
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    values = ((q.astype(np.uint32)[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(n, -1)
    scale = np.repeat(np.asarray(s, np.float64), group_size, axis=1)
    zero = float(1 << (bits - 1)) if z is None else np.repeat(np.asarray(z, np.float64), group_size, axis=1)
    low = np.float32 if dtype == "bfloat16" else np.float16  # bf16 stand-in: exact for these values
    return (((values - zero).astype(low)).astype(np.float64) * scale).astype(low).astype(np.float64)

