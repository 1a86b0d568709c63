"""CUDA-core matmul template on the GPU: results match the float64 reference.

Inputs are uniform in [-1, 1], the output is NaN-poisoned before the launch (an element the
kernel never writes fails), and the error is ||out - ref|| / ||ref|| in float64.
"""

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from fastdlight import ops
from fastdlight.arch import auto_arch
from fastdlight.compiler.compile import build
from fastdlight.config import Config
from fastdlight.schedules.matmul import MatmulTemplate

pytestmark = pytest.mark.gpu

TOL = {"float32": 1e-5, "float16": 1e-2}


def mm(**kw) -> Config:
    return Config("matmul", **kw)


def _run_and_check(built, func, reference, seed: int = 0) -> float:
    """Run ``built`` on random inputs and return the relative error against ``reference``."""
    dev = tvm.cuda(0)
    rng = np.random.default_rng(seed)
    params = list(func.params)
    inputs = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(str(p.dtype)) for p in params[:-1]]
    out_param = params[-1]
    out = tvm.runtime.tensor(np.full([int(d) for d in out_param.shape], np.nan, str(out_param.dtype)), dev)
    built.mod[str(func.attrs["global_symbol"])](*[tvm.runtime.tensor(a, dev) for a in inputs], out)
    dev.sync()
    result = out.numpy().astype(np.float64)
    if not np.all(np.isfinite(result)):
        return float("inf")
    ref = np.asarray(reference(*inputs), dtype=np.float64).reshape(result.shape)
    return float(np.linalg.norm(result - ref) / np.linalg.norm(ref))


def _target():
    return auto_arch().target


BIG = dict(block=(128, 128), thread=(8, 8), vectorize={"A": 4, "B": 4})

CASES = {
    "nn_fp32_plain": (lambda: ops.matmul(1024, 1024, 1024, "float32"), mm(**BIG, rstep=(8,))),
    "nn_fp32_staged": (lambda: ops.matmul(1024, 1024, 1024, "float32"), mm(**BIG, rstep=(16,), pipeline_stages=2)),
    "nn_fp32_raster": (
        lambda: ops.matmul(1024, 768, 512, "float32"),
        mm(**BIG, rstep=(16,), pipeline_stages=2, rasterization=4),
    ),
    "nn_fp32_async3": (
        lambda: ops.matmul(1024, 1024, 1024, "float32"),
        mm(**BIG, rstep=(16,), pipeline_stages=3, use_async_copy=True),  # dynamic shared memory
    ),
    "nt_fp32": (
        lambda: ops.matmul(512, 384, 256, "float32", layout="NT"),
        mm(block=(64, 64), thread=(4, 4), rstep=(16,), vectorize={"A": 4, "B": 4}, pipeline_stages=2),
    ),
    "tn_fp32_async": (
        lambda: ops.matmul(512, 384, 256, "float32", layout="TN"),
        mm(block=(128, 64), thread=(8, 4), rstep=(8,), vectorize={"A": 4, "B": 4}, pipeline_stages=2, use_async_copy=True),
    ),
    "batch_fp32": (
        lambda: ops.matmul(256, 192, 128, "float32", batch=3),
        mm(block=(1, 64, 64), thread=(1, 4, 8), rstep=(16,), vectorize={"A": 4, "B": 4}, pipeline_stages=2),
    ),
    "batch_fp16": (
        lambda: ops.matmul(256, 256, 128, "float16", batch=4),
        mm(block=(2, 64, 64), thread=(1, 8, 8), rstep=(16,), vectorize={"A": 8, "B": 8}, pipeline_stages=2, use_async_copy=True),
    ),
    "fp16_in_fp32_out": (
        lambda: ops.matmul(256, 256, 512, "float16", "float32"),
        mm(block=(64, 64), thread=(8, 8), rstep=(16,), vectorize={"A": 8, "B": 8}),
    ),
    "conv_fp32": (
        lambda: ops.conv2d_nhwc(2, 28, 28, 64, 64, dtype="float32"),
        mm(block=(1, 4, 8, 64), thread=(1, 1, 2, 8), rstep=(1, 1, 16), vectorize={"data": 4, "W": 4}, pipeline_stages=2),
    ),
    "conv_stride2_fp16": (
        lambda: ops.conv2d_nhwc(1, 56, 56, 16, 64, stride=2, dtype="float16"),
        mm(block=(4, 8, 64), thread=(1, 2, 8), rstep=(1, 3, 8), vectorize={"data": 8, "W": 8}),
    ),
    "conv_nondivisible_fp32": (
        lambda: ops.conv2d_nhwc(1, 7, 7, 20, 24, dtype="float32"),
        mm(block=(4, 4, 16), thread=(1, 2, 4), rstep=(1, 3, 8), vectorize={"data": 4, "W": 4}),
    ),
    "nondivisible_fp32_async": (
        lambda: ops.matmul(1000, 3000, 520, "float32"),
        mm(**BIG, rstep=(16,), pipeline_stages=2, use_async_copy=True),
    ),
    "nondivisible_fp32_staged": (
        lambda: ops.matmul(1000, 3000, 520, "float32"),
        mm(**BIG, rstep=(8,), pipeline_stages=2),
    ),
    "odd_fp32": (
        lambda: ops.matmul(511, 257, 129, "float32", layout="NT"),
        mm(block=(64, 64), thread=(4, 4), rstep=(16,), vectorize={"A": 4, "B": 4}, pipeline_stages=2),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
    build_op, config = CASES[name]
    op = build_op()
    sch = MatmulTemplate().apply_config(op.func, config)
    assert sch is not None
    err = _run_and_check(build(sch.mod, _target()), op.func, op.reference)
    tol = TOL[str(op.func.params[-1].dtype)]
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"


def test_fused_bias_relu_epilogue():
    m, n, k = 256, 192, 128
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    D = te.compute((m, n), lambda i, j: tirx.max(C[i, j] + bias[j], tirx.const(0, "float32")), name="D")
    func = te.create_prim_func([A, B, bias, D]).with_attr("global_symbol", "mm_bias_relu")
    sch = MatmulTemplate().apply_config(func, mm(block=(64, 64), thread=(4, 8), rstep=(16,), vectorize={"A": 4, "B": 4}))
    err = _run_and_check(build(sch.mod, _target()), func, lambda a, b, c: np.maximum(a.astype(np.float64) @ b + c, 0))
    assert err <= 1e-5


def test_default_policy_top_configs():
    default = pytest.importorskip("fastdlight.policies.default")

    arch = auto_arch()
    for op in (ops.matmul(1024, 1024, 1024, "float32", layout="NT"), ops.conv2d_nhwc(4, 14, 14, 64, 96, dtype="float32")):
        configs = [c for c in default.DefaultPolicy(op.func, arch).emit_config(3) if c.kind == "matmul"]
        assert configs
        for config in configs:
            sch = MatmulTemplate().apply_config(op.func, config)
            assert sch is not None, config
            err = _run_and_check(build(sch.mod, arch.target), op.func, op.reference)
            assert err <= 1e-5, f"{op.name} {config}: relative error {err:.3g}"
