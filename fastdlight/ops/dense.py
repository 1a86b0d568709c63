"""The dense contraction ops: matmuls (plain, batched, FP8-scaled, symbolic-row, and with fused
epilogues: bias-relu, gated, residual) and low-batch gemv."""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from fastdlight.analysis.dtypes import FP8_DTYPES, NBYTES, default_out_dtype
from fastdlight.ops.core import Op, check_dtype, check_shape, prim_func


def matmul(m, n, k, dtype="float16", out_dtype=None, layout="NN", batch=None, acc_dtype=None) -> Op:
    """C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]; layout letters say whether A / B are transposed
    in memory (N: A is M×K, B is K×N; T: A is K×M, B is N×K). ``acc_dtype``: accumulate in it and
    cast the result to ``out_dtype`` (an epilogue block), as cuBLAS does for fp16 with fp32 sums."""
    check_shape(m, n, k, *(() if batch is None else (batch,)))
    check_dtype(dtype, ("float16", "bfloat16", "float32", "int8") + FP8_DTYPES)
    out_dtype = check_dtype(out_dtype or default_out_dtype(dtype))
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

    acc = check_dtype(acc_dtype or out_dtype)

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
    return Op(f"matmul_{layout}", prim_func([A, B, C], "matmul"), ref, 2.0 * nb * m * n * k, nbytes)


#: how an FP8 matmul's result is scaled back: one scale per operand, or one per row of A and
#: one per row of B (the output's rows and columns), as ``torch._scaled_mm`` takes them
FP8_SCALES = ("tensor", "row")


def matmul_scaled(m, n, k, dtype="float8_e4m3fn", out_dtype="float16", scales="tensor") -> Op:
    """``D[i, j] = (sum_k A[i, k] * B[j, k]) * SA * SB`` in ``out_dtype``: 8-bit inputs (A is
    M×K, B is N×K), fp32 sums, the scales applied in the epilogue. ``scales``: "tensor" (SA and
    SB one float32 each, shape [1]) or "row" (SA per row of A, [M]; SB per row of B, [N])."""
    check_shape(m, n, k)
    check_dtype(dtype, FP8_DTYPES)
    check_dtype(out_dtype, ("float16", "bfloat16", "float32"))
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
    return Op(f"matmul_scaled_{scales}", prim_func([A, B, SA, SB, D], "matmul_scaled"), ref, 2.0 * m * n * k, nbytes)


def matmul_symbolic_rows(n, k, dtype="float16") -> tirx.PrimFunc:
    """C[m, n] = dtype(A[m, k] @ W[n, k]^T), summed in fp32, with the row count ``m`` symbolic and
    every dimension int64 (as Relax's legalization builds it): an LLM layer's GEMM at any number
    of tokens, for :func:`fastdlight.tune_dispatch`."""
    check_shape(n, k)
    check_dtype(dtype, ("float16", "bfloat16"))
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
    check_shape(m, n, k)
    check_dtype(dtype, ("float16", "float32"))
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((n, k), dtype, name="B")
    bias = te.placeholder((n,), dtype, name="bias")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[j, r].astype("float32"), axis=r), name="C")
    D = te.compute((m, n), lambda i, j: tirx.max(C[i, j] + bias[j].astype("float32"), 0.0).astype(dtype), name="D")

    def ref(a, b, c):
        return np.maximum(a.astype(np.float64) @ b.astype(np.float64).T + c.astype(np.float64), 0)

    nbytes = (m * k + n * k + n + m * n) * NBYTES[dtype]
    return Op("matmul_bias_relu", prim_func([A, B, bias, D], "matmul_bias_relu"), ref, 2.0 * m * n * k, nbytes)


def matmul_gated(m, n, k, dtype="float16") -> Op:
    """D = silu(A·Bᵀ + bias) * G, the product accumulated in fp32, the bias fp32 and the gate
    ``G[m, n]`` a second tensor in ``dtype``: the epilogue of an LLM's gated MLP projection, with
    one read per output column and one per output element."""
    check_shape(m, n, k)
    check_dtype(dtype, ("float16", "bfloat16"))
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
    return Op("matmul_gated", prim_func([A, B, bias, G, D], "matmul_gated"), ref, 2.0 * m * n * k, nbytes)


def matmul_residual(m, n, k, dtype="float16") -> Op:
    """D = R + (bias + A·Bᵀ), all fp32 but the operands: a transformer's output projection added
    to an fp32 residual stream (one read per output element, 8 bytes a pair)."""
    check_shape(m, n, k)
    check_dtype(dtype, ("float16", "bfloat16"))
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
    return Op("matmul_residual", prim_func([A, B, bias, R, D], "matmul_residual"), ref, 2.0 * m * n * k, nbytes)


def gemv(n, k, m=1, dtype="float16", out_dtype=None) -> Op:
    """Y[m, n] = sum_k X[m, k] * W[n, k] (weights stored N×K as in linear layers); m <= 16 is
    the low-batch case."""
    check_shape(m, n, k)
    check_dtype(dtype, ("float16", "bfloat16", "float32", "int8"))
    out_dtype = check_dtype(out_dtype or default_out_dtype(dtype))
    X = te.placeholder((m, k), dtype, name="X")
    W = te.placeholder((n, k), dtype, name="W")
    r = te.reduce_axis((0, k), name="k")
    Y = te.compute(
        (m, n), lambda i, j: te.sum(X[i, r].astype(out_dtype) * W[j, r].astype(out_dtype), axis=r), name="Y"
    )
    ref = lambda x, w: x.astype(np.float64) @ w.astype(np.float64).T  # noqa: E731
    nbytes = (m * k + n * k) * NBYTES[dtype] + m * n * NBYTES[out_dtype]
    return Op("gemv", prim_func([X, W, Y], "gemv"), ref, 2.0 * m * n * k, nbytes)
