"""fastdlight.ops.matmul_int4 and matmul_int8 (CPU): the packed 4-bit weights mean what the
docstring says (an independent per-element dequantization), the PrimFuncs compute their
reference, random inputs vary every nibble, and both the decode (M = 1) and the prefill form
compile to CUDA for Hopper."""

import re
import warnings

import numpy as np
import pytest
import tvm

import fastdlight
from fastdlight import ops
from fastdlight.measure.workload import host_inputs


def element_weights(q, s, z, group_size):
    """W[n, k] one element at a time: nibble k % 8 of word k // 8 (lowest first)."""
    n, words = q.shape
    w = np.zeros((n, words * 8))
    for j in range(n):
        for kk in range(words * 8):
            nibble = (int(q[j, kk // 8]) >> (4 * (kk % 8))) & 15
            zero = 8.0 if z is None else float(z[j, kk // group_size])
            w[j, kk] = (nibble - zero) * float(s[j, kk // group_size])
    return w


@pytest.mark.parametrize("zero_point", [False, True])
def test_the_reference_dequantizes_each_nibble_as_documented(zero_point):
    rng = np.random.default_rng(1)
    q = rng.integers(0, 2**32, size=(3, 4), dtype=np.int64).astype(np.uint32)
    s = rng.uniform(0.5, 2, size=(3, 2)).astype(np.float16)
    z = rng.integers(0, 16, size=(3, 2)).astype(np.float16) if zero_point else None
    got = ops.dequantize_weights(q, s, z, 16)
    np.testing.assert_allclose(got, element_weights(q, s, z, 16), rtol=2e-3)  # fp16 rounding of the product


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_point", [False, True])
def test_the_primfunc_computes_the_reference_on_the_cpu(zero_point, bits):
    op = (ops.matmul_int8 if bits == 8 else ops.matmul_int4)(3, 32, 256, group_size=64, zero_point=zero_point)
    args = host_inputs(op.func, seed=3)
    q = args[1]
    assert q.dtype == np.uint32 and len({(int(w) >> 28) for w in q.flat}) > 8  # the top nibble varies too
    out = tvm.runtime.empty((3, 32), "float16")
    tvm.compile(op.func, target="llvm")(*(tvm.runtime.tensor(a) for a in args[:-1]), out)
    want = op.reference(*args[:-1])
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("kwargs, says", [
    ({"m": 1, "n": 64, "k": 100}, "multiple of 8 dividing K=100"),
    ({"m": 1, "n": 64, "k": 128, "group_size": 12}, "group size 12"),
    ({"m": 1, "n": 64, "k": 128, "dtype": "float32"}, "unsupported dtype 'float32'"),
])  # fmt: skip
def test_bad_shapes_are_refused(kwargs, says):
    with pytest.raises(ValueError, match=says):
        ops.matmul_int4(**kwargs)


@pytest.mark.parametrize("m", [1, 256])
def test_decode_and_prefill_compile_for_hopper(m):
    """M = 1 gets the dequantizing GEMV, M = 256 the dequantizing wgmma template (sm_90a) first;
    the weights are read packed and dequantized inside the kernel (no separate dequantization
    kernel): loaded by TMA (``Q_map``) or directly (``Q_ptr``)."""
    op = ops.matmul_int4(m, 512, 1024, group_size=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, best = fastdlight.tune(op.func, "nvidia/nvidia-h100", topk=2, measure=False, max_workers=2)
    assert best.artifact.cubin and all(r.failure is None for r in results)
    assert best.config.kind == ("matmul_wgmma_dequant" if m > 16 else "gemv_dequant"), best.config
    src = best.artifact.source
    kernels = set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", src))
    assert kernels == {"matmul_int4_kernel"} and ("Q_map" if m > 16 else "Q_ptr") in src
    assert (">>" if m <= 16 else "__byte_perm") in src
