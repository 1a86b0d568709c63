"""fastdlight.ops.matmul_scaled (CPU): FP8 products scaled in the epilogue, per tensor or per
row, compute their reference (LLVM), and compile to the wgmma template with the scales fused."""

import warnings

import numpy as np
import pytest
import tvm

import fastdlight
from fastdlight import ops
from fastdlight.measure.workload import host_inputs


def normal_fp8(a: np.ndarray) -> np.ndarray:
    """``a`` with its subnormal values raised to the smallest normal one (TVM 0.27's LLVM code
    decodes subnormal float8_e4m3fn wrongly: 0.013671875 as 0.0146484375)."""
    tiny = 2.0**-6
    f = a.astype(np.float32)
    return np.where(np.abs(f) < tiny, np.copysign(tiny, f), f).astype(a.dtype)


@pytest.mark.parametrize("scales", ["tensor", "row"])
def test_the_primfunc_computes_the_reference_on_the_cpu(scales):
    op = ops.matmul_scaled(24, 40, 64, "float8_e4m3fn", "float32", scales)
    args = host_inputs(op.func, seed=2)
    assert str(args[0].dtype) == "float8_e4m3fn" and args[2].shape == ((24,) if scales == "row" else (1,))
    args[0], args[1] = normal_fp8(args[0]), normal_fp8(args[1])
    out = tvm.runtime.empty((24, 40), "float32")
    tvm.compile(op.func, target="llvm")(*(tvm.runtime.tensor(a) for a in args[:-1]), out)
    np.testing.assert_allclose(out.numpy(), op.reference(*args[:-1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scales, dtype", [("tensor", "float8_e4m3fn"), ("row", "float8_e5m2")])
def test_scaled_fp8_compiles_to_the_wgmma_template_with_the_scales_in_its_epilogue(scales, dtype):
    op = ops.matmul_scaled(1000, 520, 272, dtype, "float16", scales)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, best = fastdlight.tune(op.func, "nvidia/nvidia-h100", topk=2, measure=False, max_workers=2)
    assert all(r.failure is None and r.config.kind == "matmul_wgmma" for r in results)
    assert "k32" in best.artifact.source and "SA" in best.artifact.source and best.artifact.spill_bytes == 0


def test_bad_scales_are_refused():
    with pytest.raises(ValueError, match="scales must be one of tensor, row"):
        ops.matmul_scaled(64, 64, 64, scales="column")
    with pytest.raises(ValueError, match="unsupported dtype 'float16'"):
        ops.matmul_scaled(64, 64, 64, dtype="float16")
