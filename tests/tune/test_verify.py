"""Strict verification (CPU): the per-element bound accepts correct low-precision results and
rejects realistic wrong ones; the float64 twin of a function computes what numpy does."""

import numpy as np
import pytest
import tvm

from fastdlight import ops
from fastdlight.tune import verify
from fastdlight.tune.measure import param_buffers

RNG = np.random.default_rng(0)


def uniform(shape, dtype):
    return (RNG.random(shape, dtype=np.float32) * 2 - 1).astype(dtype)


@pytest.fixture(scope="module")
def matmul_case():
    m, n, k = 64, 64, 4096
    a, b = uniform((m, k), np.float16), uniform((k, n), np.float16)
    op32, op16 = ops.matmul(m, n, k, "float16", "float32"), ops.matmul(m, n, k, "float16", "float16")
    fp32_acc = a.astype(np.float32) @ b.astype(np.float32)  # another summation order than float64's
    fp16_acc = np.zeros((m, n), np.float16)
    for kk in range(0, k, 8):  # fp16 accumulation, 8 products at a time: the loosest correct kernel
        part = a[:, kk:kk + 8].astype(np.float32) @ b[kk:kk + 8].astype(np.float32)
        fp16_acc = (fp16_acc.astype(np.float32) + part).astype(np.float16)
    return {"fp32": (verify.expected_from_numpy(op32.reference, [a, b], op32.func), fp32_acc),
            "fp16": (verify.expected_from_numpy(op16.reference, [a, b], op16.func), fp16_acc),
            "fp32_to_fp16": (verify.expected_from_numpy(op16.reference, [a, b], op16.func), fp32_acc.astype(np.float16))}


@pytest.mark.parametrize("case", ["fp32", "fp16", "fp32_to_fp16"])
def test_correct_low_precision_matmuls_pass(matmul_case, case):
    expected, out = matmul_case[case]
    verdict = verify.check_outputs([out], expected, [str(out.dtype)])
    assert verdict.ok, verdict.message
    assert verdict.total == out.size and "sum-of-products" in verdict.message
    # and with a wide margin: no correct element comes near its bound
    ref, mag = expected.outputs[0], expected.magnitudes[0]
    allowed = verify._allowed(ref, mag, expected.kind, str(out.dtype))
    assert np.max(np.abs(out.astype(np.float64) - ref) / allowed) < 0.25


def sign_flip(x):
    x[:16, :16] *= -1


def zero_row(x):
    x[3] = 0


def shifted_row(x):
    x[7] = x[8]


def dropped_edge_tile(x):
    x[-16:, -16:] = 0


def one_nan(x):
    x[5, 9] = np.nan


@pytest.mark.parametrize("case", ["fp32", "fp16"])
@pytest.mark.parametrize("sabotage", [sign_flip, zero_row, shifted_row, dropped_edge_tile, one_nan])
def test_wrong_results_are_rejected_with_count_and_worst_element(matmul_case, case, sabotage):
    expected, out = matmul_case[case]
    wrong = out.copy()
    sabotage(wrong)
    verdict = verify.check_outputs([wrong], expected, [str(out.dtype)])
    assert not verdict.ok
    assert 0 < verdict.bad <= 256 and f"of {out.size} elements out of bound" in verdict.message
    assert "worst at (" in verdict.message and verdict.reference == "float64 numpy reference"


def test_integers_must_match_exactly():
    op = ops.elementwise((8, 8), "int32", "add")
    a, b = RNG.integers(-5, 5, (8, 8)).astype("int32"), RNG.integers(-5, 5, (8, 8)).astype("int32")
    expected = verify.expected_from_numpy(op.reference, [a, b], op.func)
    assert verify.check_outputs([a + b], expected, ["int32"]).ok
    off = a + b
    off[2, 2] += 1
    verdict = verify.check_outputs([off], expected, ["int32"])
    assert not verdict.ok and verdict.bad == 1


def test_elementwise_and_softmax_use_a_relative_tolerance():
    op = ops.softmax(32, 256, dtype="float16")
    x = uniform((32, 256), np.float16)
    expected = verify.expected_from_numpy(op.reference, [x], op.func)
    assert not expected.kind.sum_of_products and expected.magnitudes is None
    ref = np.asarray(expected.outputs[0])
    assert verify.check_outputs([ref.astype(np.float16)], expected, ["float16"]).ok
    wrong = ref.astype(np.float16)
    wrong[4] = 0
    assert not verify.check_outputs([wrong], expected, ["float16"]).ok


def test_check_kind_of_each_op_family():
    assert verify.check_kind(ops.matmul_bias_relu(64, 64, 64).func).sum_of_products
    assert verify.check_kind(ops.reduce((64, 128), "float16", "sum").func).sum_of_products
    assert not verify.check_kind(ops.reduce((64, 128), "float16", "max").func).sum_of_products
    assert not verify.check_kind(ops.softmax(64, 128, dtype="float16").func).sum_of_products
    kind = verify.check_kind(ops.matmul(32, 32, 1024, "float16", "float32").func)
    assert kind.k == 1024 and kind.acc_dtype == "float32" and kind.narrow_dtype == "float16"
    # a subtraction inside the sum (a dequantize's zero point): |inputs| no longer bound the terms
    from tvm import te

    a, b = te.placeholder((16, 64), "float16", name="A"), te.placeholder((64, 16), "float16", name="B")
    r = te.reduce_axis((0, 64), name="k")
    c = te.compute((16, 16), lambda i, j: te.sum((a[i, r] - te.const(7, "float16")) * b[r, j], axis=r), name="C")
    assert not verify.check_kind(te.create_prim_func([a, b, c])).sum_of_products
    # a min against another input (an attention mask) is not a clamp: not a sum of products
    m = te.placeholder((16, 16), "float16", name="M")
    c2 = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C2")
    d = te.compute((16, 16), lambda i, j: te.min(c2[i, j], m[i, j]), name="D")
    assert not verify.check_kind(te.create_prim_func([a, b, m, d])).sum_of_products
    relu = te.compute((16, 16), lambda i, j: te.max(c2[i, j], te.const(0, "float16")), name="R")
    assert verify.check_kind(te.create_prim_func([a, b, relu])).sum_of_products


def _float_dtypes(func):
    return {str(b.dtype) for b in verify._all_buffers(func)} - {"int32", "int64", "int8"}


@pytest.mark.parametrize("make", [lambda: ops.matmul(16, 24, 32, "float16", "float32"),
                                  lambda: ops.softmax(8, 64, dtype="float16"),
                                  lambda: ops.matmul_bias_relu(16, 16, 32)], ids=["matmul", "softmax", "bias_relu"])
def test_float64_twin_computes_what_numpy_does(make):
    op = make()
    wide = verify.widen_to_float64(op.func)
    assert _float_dtypes(wide) == {"float64"}
    ex = tvm.compile(tvm.IRModule({"main": wide.with_attr("global_symbol", "main")}), target="llvm")
    params = param_buffers(wide)
    host = [uniform(tuple(int(d) for d in b.shape), np.float16) for b in params[:-1]]
    args = [tvm.runtime.tensor(h.astype(np.float64)) for h in host]
    out = tvm.runtime.empty(tuple(int(d) for d in params[-1].shape), "float64")
    ex["main"](*args, out)
    np.testing.assert_allclose(out.numpy(), op.reference(*host), rtol=1e-12, atol=1e-12)


def test_naive_reference_of_a_two_output_norm_compiles_for_cuda():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def layer_norm(A: T.Buffer((16, 256), "float16"), B: T.Buffer((16, 256), "float16")):
        red = T.sblock_alloc_buffer((16,), "float32")
        sq = T.sblock_alloc_buffer((16,), "float32")
        for i, k in T.grid(16, 256):
            with T.sblock("red"):  # one block storing two buffers, as TVM writes norms
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    red[vi] = T.float32(0)
                    sq[vi] = T.float32(0)
                v_red: T.let[T.float32] = red[vi] + T.Cast("float32", A[vi, vk])  # typed lets, as TVM writes
                v_sq: T.let[T.float32] = sq[vi] + T.Cast("float32", A[vi, vk]) * T.Cast("float32", A[vi, vk])
                red[vi] = v_red
                sq[vi] = v_sq
        for i, k in T.grid(16, 256):
            with T.sblock("norm"):
                vi, vk = T.axis.remap("SS", [i, k])
                B[vi, vk] = T.Cast("float16", (T.Cast("float32", A[vi, vk]) - red[vi] / T.float32(256))
                                   * T.rsqrt(sq[vi] / T.float32(256) - red[vi] * red[vi] / T.float32(65536)
                                             + T.float32(1e-5)))

    target = tvm.target.Target("nvidia/nvidia-h100")
    mod = verify.naive_reference_module(layer_norm, target)
    with target:
        src = tvm.compile(mod, target=target).mod.imports[0].inspect_source()
    assert "double" in src and "__global__" in src and "half" not in src.split("__global__", 1)[1]
    assert not verify.check_kind(layer_norm).sum_of_products


def test_reinterpreting_functions_have_no_float64_twin():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def bits(A: T.Buffer((8,), "uint16"), B: T.Buffer((8,), "float16")):
        for i in range(8):
            with T.sblock("B"):
                vi = T.axis.spatial(8, i)
                B[vi] = T.reinterpret("float16", A[vi])

    with pytest.raises(ValueError, match="reinterprets bits"):
        verify.widen_to_float64(bits)
