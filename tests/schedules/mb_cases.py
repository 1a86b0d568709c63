"""Memory-bound test cases shared by the CPU (compile) and GPU (run) tests: each case is an op
(incl. shapes the tiles do not divide), the template expected to schedule it, and hand-written
configs covering the template's code paths (vectorized / scalar, several rows per thread,
cross-thread reductions on x and y, shared-memory row cache on / off)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tvm import te, topi

from fastdlight import ops
from fastdlight.config import Config


def gemv_acc32(n: int, k: int, m: int = 1) -> ops.Op:
    """fp16 GEMV accumulating in float32, then cast to fp16 (what cuBLAS does)."""
    X = te.placeholder((m, k), "float16", name="X")
    W = te.placeholder((n, k), "float16", name="W")
    r = te.reduce_axis((0, k), name="k")
    acc = te.compute(
        (m, n), lambda i, j: te.sum(X[i, r].astype("float32") * W[j, r].astype("float32"), axis=r), name="Y32"
    )
    Y = te.compute((m, n), lambda i, j: acc[i, j].astype("float16"), name="Y")
    func = te.create_prim_func([X, W, Y]).with_attr("global_symbol", "gemv_acc32")
    ref = lambda x, w: x.astype(np.float64) @ w.astype(np.float64).T  # noqa: E731
    return ops.Op("gemv_acc32", func, ref, 2.0 * m * n * k, (m * k + n * k + m * n) * 2)


def rms_norm(shape, dtype: str = "float32") -> ops.Op:
    """TVM's RMSNorm (``topi.nn.rms_norm``, what Relax's ``nn.rms_norm`` legalizes to) with its
    result cast to fp16; ``[1, 1, K]``: a batch-1 decode step's, rows of extent 1 only."""
    X = te.placeholder(shape, dtype, name="X")
    W = te.placeholder((shape[-1],), dtype, name="W")
    norm = topi.nn.rms_norm(X, W, axis=[-1], epsilon=1e-5)
    Y = te.compute(norm.shape, lambda *i: norm[i].astype("float16"), name="Y")
    func = te.create_prim_func([X, W, Y]).with_attr("global_symbol", "rms_norm")

    def ref(x, w):
        x = x.astype(np.float64)
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5) * w.astype(np.float64)

    n, bytes_ = math.prod(shape), np.dtype(dtype).itemsize
    return ops.Op("rms_norm", func, ref, 4.0 * n, n * (bytes_ + 2) + shape[-1] * bytes_)


def layer_norm(shape, dtype: str = "float16") -> ops.Op:
    """TVM's LayerNorm (``topi.nn.layer_norm``) over the last axis; ``[1, 1, K]``: a GPT-2-style
    decode step's."""
    X = te.placeholder(shape, dtype, name="X")
    G = te.placeholder((shape[-1],), dtype, name="G")
    B = te.placeholder((shape[-1],), dtype, name="B")
    func = te.create_prim_func([X, G, B, topi.nn.layer_norm(X, G, B, axis=[-1], epsilon=1e-5)])
    func = func.with_attr("global_symbol", "layer_norm")

    def ref(x, g, b):
        x = x.astype(np.float64)
        mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * g.astype(np.float64) + b.astype(np.float64)

    n, bytes_ = math.prod(shape), np.dtype(dtype).itemsize
    return ops.Op("layer_norm", func, ref, 8.0 * n, (2 * n + 2 * shape[-1]) * bytes_)


def ew(block, thread, **vec):
    return Config("elementwise", block=block, thread=thread, vectorize=vec)


def red(kind, block, thread, rstep, rthread, **vec):
    return Config(kind, block=block, thread=thread, rstep=rstep, reduce_thread=rthread, vectorize=vec)


@dataclass
class Case:
    id: str
    make: object  # () -> Op
    template: str  # expected template name
    configs: list = field(default_factory=list)
    #: the family's signature in the CUDA source (proves the intended code path was taken)
    marker: str = ""


CASES = [
    Case("add_1000x3000", lambda: ops.elementwise((1000, 3000), op="add"), "elementwise",
         [ew((4, 512), (1, 8)), ew((2, 1024), (1, 16)), ew((1, 256), (1, 8), A=4, B=4, C=4)], "uint4"),
    Case("add_nhwc_4x14x14x64", lambda: ops.elementwise((4, 14, 14, 64), op="add"), "elementwise",  # 4-D: unit loops
         [ew((1, 2, 8, 64), (1, 1, 1, 4)), ew((2, 2, 2, 64), (1, 1, 1, 8))]),
    Case("copy_4095_f32", lambda: ops.elementwise((4095,), op="copy", dtype="float32"), "elementwise",
         [ew((1024,), (4,)), ew((256,), (1,))]),
    Case("bias_relu_33x1000", lambda: ops.elementwise((33, 1000), op="bias_relu"), "elementwise",
         [ew((2, 256), (1, 8)), ew((4, 64), (2, 4))]),
    Case("sum_inner_1000x4096", lambda: ops.reduce((1000, 4096)), "reduction",
         [red("reduction", (4,), (1,), (1024,), (128,)), red("reduction", (8,), (2,), (256,), (32,))], "__shfl"),
    Case("max_inner_999x4095", lambda: ops.reduce((999, 4095), op="max"), "reduction",
         [red("reduction", (4,), (2,), (256,), (32,)), red("reduction", (1,), (1,), (128,), (128,))], "__shfl"),
    Case("sum_outer_1000x4096", lambda: ops.reduce((1000, 4096), axis=0), "reduction",
         [red("reduction", (256,), (8,), (16,), (8,)), red("reduction", (128,), (8,), (4,), (1,))], "uint4"),
    Case("max_outer_999x1000_f32", lambda: ops.reduce((999, 1000), op="max", axis=0, dtype="float32"), "reduction",
         [red("reduction", (128,), (4,), (4,), (1,)), red("reduction", (96,), (4,), (8,), (4,))]),
    Case("softmax_512x4096", lambda: ops.softmax(512, 4096), "general_reduction",
         [red("general_reduction", (1,), (1,), (4096,), (512,)), red("general_reduction", (2,), (1,), (1024,), (128,))],
         "A_shared"),
    Case("softmax_37x4095_f32", lambda: ops.softmax(37, 4095, dtype="float32"), "general_reduction",
         [red("general_reduction", (4,), (2,), (256,), (64,)), red("general_reduction", (1,), (1,), (512,), (256,))]),
    Case("softmax_6x64x512", lambda: ops.softmax(64, 512, batch=6), "general_reduction",  # attention's scores
         [red("general_reduction", (1, 8), (1, 1), (128,), (16,)), red("general_reduction", (2, 2), (1, 1), (256,), (32,))],
         "A_shared"),
    # one row (the unit row loops TVM's inlining drops); the weight, read after the reduction
    # only, fetched into shared memory with the rows before it
    Case("rms_norm_1x1x3072", lambda: rms_norm((1, 1, 3072)), "general_reduction",
         [red("reduction", (1,), (1,), (1024,), (256,))], "W_shared"),
    Case("rms_norm_7x1000_f16", lambda: rms_norm((7, 1000), "float16"), "general_reduction",
         [red("reduction", (1,), (1,), (256,), (64,)), red("reduction", (2,), (1,), (128,), (32,))], "W_shared"),
    Case("softmax_1x32000", lambda: ops.softmax(1, 32000), "general_reduction",  # a decode step's next token
         [red("general_reduction", (1,), (1,), (1024,), (256,))], "__shfl"),
    Case("layer_norm_1x1x1024", lambda: layer_norm((1, 1, 1024)), "general_reduction",
         [red("general_reduction", (1,), (1,), (256,), (128,))], "G_shared"),
    Case("gemv_1x4096x4096", lambda: ops.gemv(4096, 4096), "gemv",
         [red("gemv", (8,), (2,), (512,), (32,)), red("gemv", (2,), (1,), (256,), (32,))], "__shfl"),
    Case("gemv_8x1000x4096", lambda: ops.gemv(1000, 4096, m=8), "gemv",
         [red("gemv", (8, 4), (8, 1), (256,), (32,)), red("gemv", (8, 8), (8, 2), (512,), (64,))], "uint4"),
    Case("gemv_3x1000x4095", lambda: ops.gemv(1000, 4095, m=3), "gemv",
         [red("gemv", (3, 4), (3, 1), (64,), (64,))]),
    Case("gemv_acc32_1x4096x4096", lambda: gemv_acc32(4096, 4096), "gemv",
         [red("gemv", (8,), (2,), (512,), (32,)), red("gemv", (4, ), (4,), (1024,), (128,))], "__shfl"),
]  # fmt: skip


def case_ids():
    return [c.id for c in CASES]
