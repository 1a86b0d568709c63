"""Strict verification (CPU): the per-element bounds accept correct low-precision results and
reject realistic wrong ones; each output's check is read from the TIR; the float64 twin of a
function computes what numpy does, and its naive schedule compiles to CUDA."""

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.measure import host, verify, widen
from fastdlight.measure.check_kinds import FP8_MMA_ACC, output_kinds
from fastdlight.measure.verify import check_outputs, expected_from_numpy
from fastdlight.measure.workload import param_buffers

M, N, K = 64, 64, 4096


def uniform(shape, dtype, seed=0):
    """Inputs as the tuner makes them (uniform in [-1, 1]), the same whatever tests ran before."""
    return (np.random.default_rng(seed).random(shape, dtype=np.float32) * 2 - 1).astype(dtype)


def matmul_cast_fp16(m, n, k):
    """D = fp16(sum_k fp32(A) * fp32(B)): fp16 in, fp32 accumulation, fp16 out."""
    a, b = te.placeholder((m, k), "float16", name="A"), te.placeholder((k, n), "float16", name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r), name="C")
    d = te.compute((m, n), lambda i, j: c[i, j].astype("float16"), name="D")
    return te.create_prim_func([a, b, d])


@pytest.fixture(scope="module")
def matmuls():
    """Correct results of three kernels for A (M×K) · B (K×N), fp16 inputs, K = 4096, each
    with the Expected of the TIR it implements."""
    a, b = uniform((M, K), np.float16, 1), uniform((K, N), np.float16, 2)
    ref = lambda x, y: x @ y  # noqa: E731 - the float64 numpy reference
    # fp32 accumulation in another order than numpy's float64 one: split-K, 8 partial sums
    split_k = sum(a[:, s:s + 512].astype(np.float32) @ b[s:s + 512].astype(np.float32) for s in range(0, K, 512))
    fp16_acc = np.zeros((M, N), np.float16)
    for s in range(0, K, 8):  # fp16 accumulation, 8 products at a time: the loosest correct kernel
        fp16_acc = (fp16_acc.astype(np.float32) + a[:, s:s + 8].astype(np.float32) @ b[s:s + 8].astype(np.float32)
                    ).astype(np.float16)
    fp32_out = ops.matmul(M, N, K, "float16", "float32").func
    fp16_out = ops.matmul(M, N, K, "float16", "float16").func  # the TIR accumulates in fp16
    return {
        "fp32_acc": (verify.expected_from_numpy(ref, [a, b], fp32_out), split_k, (a, b)),
        "fp32_acc_fp16_out": (verify.expected_from_numpy(ref, [a, b], matmul_cast_fp16(M, N, K)),
                              split_k.astype(np.float16), (a, b)),
        "fp16_acc": (verify.expected_from_numpy(ref, [a, b], fp16_out), fp16_acc, (a, b)),
    }


@pytest.mark.parametrize("case", ["fp32_acc", "fp32_acc_fp16_out", "fp16_acc"])
def test_correct_low_precision_matmuls_pass_with_a_wide_margin(matmuls, case):
    expected, out, _ = matmuls[case]
    verdict = verify.check_outputs([out], expected)
    assert verdict.ok, verdict.message
    assert verdict.total == out.size and verdict.bad == 0 and "sum-of-products" in verdict.message
    allowed = verify.allowed_error(expected.outputs[0], expected.magnitudes[0], expected.kinds[0], str(out.dtype))
    # the final rounding to fp16 (half an ulp: u·|ref|) takes up to half of its C_OUT·u·|ref| share
    margin = 0.6 if out.dtype == np.float16 and case != "fp16_acc" else 0.25
    assert np.max(np.abs(out.astype(np.float64) - expected.outputs[0]) / allowed) < margin


def test_the_bound_follows_the_accumulator_and_output_precision(matmuls):
    fp32_kind, fp16_kind = matmuls["fp32_acc_fp16_out"][0].kinds[0], matmuls["fp16_acc"][0].kinds[0]
    assert (fp32_kind.acc_dtype, fp32_kind.narrow_dtype, fp32_kind.k) == ("float32", "float16", K)
    assert (fp16_kind.acc_dtype, fp16_kind.narrow_dtype) == ("float16", "float16")
    assert matmuls["fp32_acc"][0].kinds[0].narrow_dtype == "float32"  # fp16 inputs are exact values


def flip_one(x):
    x[10, 20] *= -1
    return (10, 20)


def zero_row(x):
    x[3] = 0
    return None


def shifted_row(x, a, b):  # row 7 computed from row 8 of A: a broken index
    x[7] = (a[8].astype(np.float32) @ b.astype(np.float32)).astype(x.dtype)
    return None


def dropped_edge_tile(x):  # the last 16×16 tile never written: it keeps the NaN poison
    x[-16:, -16:] = np.nan
    return None


def dropped_k_tile(x, a, b):  # the edge blocks miss the last 64 of K
    part = a[-16:, :-64].astype(np.float32) @ b[:-64, -16:].astype(np.float32)
    x[-16:, -16:] = part.astype(x.dtype)
    return None


def one_nan(x):
    x[5, 9] = np.nan
    return (5, 9)


def one_inf(x):
    x[6, 1] = np.inf
    return (6, 1)


SABOTAGE = [flip_one, zero_row, shifted_row, dropped_edge_tile, dropped_k_tile, one_nan, one_inf]


def _sabotaged(matmuls, case, sabotage):
    expected, out, (a, b) = matmuls[case]
    wrong = out.copy()
    needs_inputs = sabotage in (shifted_row, dropped_k_tile)
    where = sabotage(wrong, a, b) if needs_inputs else sabotage(wrong)
    return expected, wrong, where


@pytest.mark.parametrize("case", ["fp32_acc", "fp32_acc_fp16_out"])
@pytest.mark.parametrize("sabotage", SABOTAGE, ids=[s.__name__ for s in SABOTAGE])
def test_wrong_results_are_rejected_with_count_and_worst_element(matmuls, case, sabotage):
    expected, wrong, where = _sabotaged(matmuls, case, sabotage)
    verdict = verify.check_outputs([wrong], expected)
    assert not verdict.ok
    assert 0 < verdict.bad <= 256 and verdict.total == M * N
    assert verdict.message.startswith(f"{verdict.bad} of {M * N} elements out of bound; worst at (")
    assert verdict.worst in verdict.message and verdict.reference == "float64 numpy reference"
    if where is not None:  # one wrong element: it is the one named, and it is the only one
        assert verdict.bad == 1 and verdict.worst.startswith(f"worst at {where}: got {wrong[where]:.6g}")


@pytest.mark.parametrize("sabotage", [flip_one, zero_row, shifted_row, dropped_edge_tile, one_nan],
                         ids=lambda s: s.__name__)
def test_fp16_accumulation_still_rejects_the_large_errors(matmuls, sabotage):
    """An fp16 accumulator over K = 4096 is only good to ~10 here (outputs ~21 rms): the
    wrong elements larger than that (a sign flip of a large element, most of a zeroed or
    shifted row, any NaN) stand out; a dropped K tile (off by ~3) does not."""
    expected, wrong, _ = _sabotaged(matmuls, "fp16_acc", sabotage)
    if sabotage is flip_one:
        ref = expected.outputs[0]
        allowed = verify.allowed_error(ref, expected.magnitudes[0], expected.kinds[0], "float16")
        assert 2 * abs(ref[10, 20]) > allowed[10, 20]  # the flip is visible at this precision
    assert not verify.check_outputs([wrong], expected).ok


def sum_of_squares(rows, k):
    x = te.placeholder((rows, k), "float16", name="X")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute((rows,), lambda i: te.sum(x[i, r].astype("float32") * x[i, r].astype("float32"), axis=r), name="Y")
    return te.create_prim_func([x, y])


def test_one_signed_sums_pass_serial_accumulation_at_k_16384():
    """Every partial sum of a sum of squares has the same sign: a serial fp32 loop drifts by
    ~u·sqrt(K)·|ref|, beyond Higham & Mary's sqrt(K)·u·S with multiplier 1, within ours."""
    rows, k = 64, 16384
    x = uniform((rows, k), np.float16)
    expected = verify.expected_from_numpy(lambda a: (a * a).sum(axis=1), [x], sum_of_squares(rows, k))
    assert expected.kinds[0].sum_of_products and expected.kinds[0].k == k
    sq = x.astype(np.float32) ** 2
    acc = np.zeros(rows, np.float32)
    for j in range(k):  # one thread per row, serial, as the TIR reads
        acc += sq[:, j]
    ref, mag = expected.outputs[0], expected.magnitudes[0]
    err = np.abs(acc - ref)
    assert np.max(err / (verify.UNIT_ROUNDOFF["float32"] * np.sqrt(k) * mag)) > 1
    assert verify.check_outputs([acc], expected).ok
    assert np.max(err / verify.allowed_error(ref, mag, expected.kinds[0], "float32")) < 0.5


def test_integers_must_match_exactly():
    op = ops.elementwise((8, 8), "int32", "add")
    rng = np.random.default_rng(0)
    a, b = rng.integers(-5, 5, (8, 8)).astype("int32"), rng.integers(-5, 5, (8, 8)).astype("int32")
    expected = verify.expected_from_numpy(op.reference, [a, b], op.func)
    assert verify.check_outputs([a + b], expected).ok
    off = a + b
    off[2, 2] += 1
    verdict = verify.check_outputs([off], expected)
    assert not verdict.ok and verdict.bad == 1 and "worst at (2, 2)" in verdict.message


def test_elementwise_tolerance_is_relative_with_the_outputs_scale_as_floor():
    op = ops.elementwise((32, 64), "float16", "add")
    a, b = uniform((32, 64), np.float16, 1), uniform((32, 64), np.float16, 2)
    expected = verify.expected_from_numpy(op.reference, [a, b], op.func)
    kind = expected.kinds[0]
    assert not kind.sum_of_products and expected.magnitudes == (None,)
    correct = a + b  # rounded to fp16 once
    assert verify.check_outputs([correct], expected).ok
    ref = expected.outputs[0]
    big = np.unravel_index(np.argmax(np.abs(ref)), ref.shape)
    off = correct.copy()
    off[big] = np.float16(ref[big] * 1.01)  # 1 % off: 20 fp16 roundings
    assert not verify.check_outputs([off], expected).ok
    # a near-zero element is judged at the output's scale (rms), not at its own |ref|
    allowed = verify.allowed_error(ref, None, kind, "float16")
    small = np.argmin(np.abs(ref))
    assert allowed.flat[small] > verify.C_REL * verify.UNIT_ROUNDOFF["float16"] * np.sqrt(np.mean(ref**2))


def test_softmax_rejects_a_row_sum_missing_a_tile():
    op = ops.softmax(32, 1024, dtype="float16")
    x = uniform((32, 1024), np.float16)
    expected = verify.expected_from_numpy(op.reference, [x], op.func)
    assert not expected.kinds[0].sum_of_products and expected.kinds[0].acc_dtype == "float32"
    e = np.exp(x.astype(np.float32) - x.astype(np.float32).max(axis=1, keepdims=True))
    assert verify.check_outputs([(e / e.sum(axis=1, keepdims=True)).astype(np.float16)], expected).ok
    short = (e / e[:, :-128].sum(axis=1, keepdims=True)).astype(np.float16)  # the sum misses 1/8
    verdict = verify.check_outputs([short], expected)
    assert not verdict.ok and verdict.bad > 1000


def test_a_nan_reference_element_accepts_only_nan():
    op = ops.elementwise((4, 4), "float32", "copy")
    x = uniform((4, 4), np.float32)
    with np.errstate(invalid="ignore"):  # NaN where x < 0
        expected = verify.expected_from_numpy(np.log, [x], op.func)
        good = np.log(x)
    assert np.isnan(good).any() and verify.check_outputs([good], expected).ok
    wrong = np.where(np.isnan(good), 0.0, good).astype(np.float32)
    assert verify.check_outputs([wrong], expected).bad == np.isnan(good).sum()


def test_a_reference_of_the_wrong_shape_is_refused():
    op = ops.elementwise((4, 4), "float32", "copy")
    with pytest.raises(ValueError, match="shape"):
        verify.expected_from_numpy(lambda a: a[:2], [uniform((4, 4), np.float32)], op.func)


def _sop(func):
    return [k.sum_of_products for k in verify.output_kinds(func)]


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_an_intermediate_rounded_to_fp16_before_a_bias_is_judged_at_its_own_magnitude(out_dtype):
    """After ToMixedPrecision: fp32 sum -> fp16, then + bias (ResNet's classifier adds in fp32,
    a transformer's FFN in fp16). Where the bias nearly cancels the sum, the sum's fp16 rounding
    is large next to |ref|; a correct kernel passes, one that drops the bias still fails."""
    a, b = te.placeholder((16, 512), "float16", name="A"), te.placeholder((512, 64), "float16", name="B")
    bias = te.placeholder((64,), out_dtype, name="bias")
    r = te.reduce_axis((0, 512), name="k")
    c = te.compute((16, 64), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r))
    h = te.compute((16, 64), lambda i, j: c[i, j].astype("float16"))
    d = te.compute((16, 64), lambda i, j: h[i, j].astype(out_dtype) + bias[j], name="D")
    func = te.create_prim_func([a, b, bias, d])
    x, y = uniform((16, 512), np.float16, 1), uniform((512, 64), np.float16, 2)
    exact = x.astype(np.float64) @ y.astype(np.float64)
    bias_v = (-exact[0] + uniform((64,), np.float32, 3) * 1e-3).astype(out_dtype)  # cancels row 0
    expected = verify.expected_from_numpy(lambda p, q, z: (p @ q) + z, [x, y, bias_v], func)
    assert expected.kinds[0].inner_dtype == "float16"
    summed = (x.astype(np.float32) @ y.astype(np.float32)).astype(np.float16).astype(out_dtype)
    verdict = verify.check_outputs([summed + bias_v], expected)
    assert verdict.ok, verdict.message
    assert not verify.check_outputs([summed], expected).ok


def test_a_plain_matmul_keeps_its_tight_output_rounding_bound(matmuls):
    kind = matmuls["fp32_acc_fp16_out"][0].kinds[0]
    assert (kind.inner_dtype, kind.narrow_dtype) == ("float32", "float16")  # only the output is fp16


def test_which_outputs_are_sums_of_products():
    assert _sop(ops.matmul_bias_relu(64, 64, 64).func) == [True]
    assert _sop(ops.conv2d_nhwc(1, 8, 8, 4, 4).func) == [True]  # the padding select reads indices only
    assert _sop(ops.reduce((64, 128), "float16", "sum").func) == [True]
    assert _sop(ops.reduce((64, 128), "float16", "max").func) == [False]
    assert _sop(ops.softmax(64, 128, dtype="float16").func) == [False]
    assert _sop(ops.elementwise((8, 8), "float16", "add").func) == [False]
    a, b = te.placeholder((16, 64), "float16", name="A"), te.placeholder((64, 16), "float16", name="B")
    m = te.placeholder((16, 16), "float16", name="M")
    r = te.reduce_axis((0, 64), name="k")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")

    def on_c(fn, *extra):
        return _sop(te.create_prim_func([a, b, *extra, te.compute((16, 16), fn, name="D")]))

    assert on_c(lambda i, j: c[i, j] / te.const(64, "float16")) == [True]  # a mean
    assert on_c(lambda i, j: te.max(c[i, j], te.const(0, "float16"))) == [True]  # relu
    assert on_c(lambda i, j: te.max(c[i, j], m[i, j]), m) == [True]  # |max(x, y)| <= max(|x|, |y|)
    assert on_c(lambda i, j: te.min(c[i, j], te.const(0.5, "float16"))) == [False]  # min(|x|, c) < |x|
    assert on_c(lambda i, j: c[i, j] * te.const(-2, "float16")) == [False]
    assert on_c(lambda i, j: tirx.Select(m[i, j] > 0, c[i, j], m[i, j]), m) == [False]  # data decides
    # a subtraction inside the sum (a dequantize's zero point): |inputs| no longer bound the terms
    zp = te.compute((16, 16), lambda i, j: te.sum((a[i, r] - te.const(7, "float16")) * b[r, j], axis=r), name="Z")
    assert _sop(te.create_prim_func([a, b, zp])) == [False]


def test_each_output_has_its_own_check():
    a, b = te.placeholder((16, 64), "float16", name="A"), te.placeholder((64, 16), "float16", name="B")
    r = te.reduce_axis((0, 64), name="k")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r),
                   name="C")
    e = te.compute((16, 16), lambda i, j: te.exp(c[i, j]), name="E")
    kinds = verify.output_kinds(te.create_prim_func([a, b, c, e]))
    assert [(k.output, k.sum_of_products, k.k) for k in kinds] == [("C", True, 64), ("E", False, 64)]
    x, y = uniform((16, 64), np.float16, 1), uniform((64, 16), np.float16, 2)
    expected = verify.expected_from_numpy(lambda p, q: (p @ q, np.exp(p @ q)), [x, y],
                                          te.create_prim_func([a, b, c, e]))
    assert expected.magnitudes[0] is not None and expected.magnitudes[1] is None
    good = [o.astype(np.float32) for o in expected.outputs]
    assert verify.check_outputs(good, expected).ok
    good[1][2, 3] = 0
    assert verify.check_outputs(good, expected).worst.startswith("output E: worst at (2, 3)")


# -- the float64 twin ---------------------------------------------------------------------------
@T.prim_func(s_tir=True)
def two_store_norm(A: T.Buffer((16, 256), "float16"), B: T.Buffer((16, 256), "float16")):
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


def norm_reference(a):
    a = a.astype(np.float64)
    mean = a.mean(axis=1, keepdims=True)
    return (a - mean) / np.sqrt((a * a).mean(axis=1, keepdims=True) - mean * mean + 1e-5)


@T.prim_func(s_tir=True)
def int8_dequant_gemv(W: T.Buffer((16, 64), "int8"), S: T.Buffer((16,), "float16"), X: T.Buffer((64,), "float16"),
                      Y: T.Buffer((16,), "float32")):
    Wq = T.sblock_alloc_buffer((16, 64), "int8")  # an int8 intermediate: must stay int8
    for n, k in T.grid(16, 64):
        with T.sblock("shift"):
            vn, vk = T.axis.remap("SS", [n, k])
            Wq[vn, vk] = W[vn, vk] - T.int8(1)
    for n, k in T.grid(16, 64):
        with T.sblock("Y"):
            vn, vk = T.axis.remap("SR", [n, k])
            with T.init():
                Y[vn] = T.float32(0)
            Y[vn] = Y[vn] + T.Cast("float32", T.Cast("float16", Wq[vn, vk]) * S[vn] * X[vk])


def dequant_reference(w, s, x):
    return ((w.astype(np.float64) - 1) * s.astype(np.float64)[:, None]) @ x.astype(np.float64)


def _dtypes(func):
    """The dtype of every buffer, variable and expression of ``func``."""
    return {verify.expr_dtype(e) for e in verify.walk_exprs(func, tvm.ir.Expr)} - {""}


def _float_dtypes(func):
    return {d for d in _dtypes(func) if d.startswith(("float", "bfloat"))}


def _host_inputs(func):
    out = []
    for seed, b in enumerate(param_buffers(func)[:-1]):
        shape = tuple(int(d) for d in b.shape)
        ints = np.random.default_rng(seed).integers(-4, 5, shape).astype("int8")
        out.append(ints if str(b.dtype) == "int8" else uniform(shape, np.float16, seed))
    return out


CASES = {
    "matmul": (lambda: ops.matmul(16, 24, 32, "float16", "float32").func, lambda a, b: a.astype(float) @ b),
    "softmax": (lambda: ops.softmax(8, 64, dtype="float16").func, ops.softmax(8, 64).reference),
    "bias_relu": (lambda: ops.matmul_bias_relu(16, 16, 32).func, ops.matmul_bias_relu(16, 16, 32).reference),
    "two_store_norm": (lambda: two_store_norm, norm_reference),
    "int8_dequant": (lambda: int8_dequant_gemv, dequant_reference),
}


@pytest.mark.parametrize("case", list(CASES))
def test_float64_twin_computes_what_numpy_does(case):
    make, reference = CASES[case]
    func = make()
    wide = widen.widen_to_float64(func)
    assert _float_dtypes(func) - {"float64"} and _float_dtypes(wide) == {"float64"}
    assert {d for d in _dtypes(wide) if not d.startswith("float")} == {d for d in _dtypes(func)
                                                                       if not d.startswith(("float", "bfloat"))}
    ex = tvm.compile(tvm.IRModule({"main": wide.with_attr("global_symbol", "main")}), target="llvm")
    params = param_buffers(wide)
    host = _host_inputs(func)
    args = [tvm.runtime.tensor(h.astype(np.float64) if h.dtype != np.int8 else h) for h in host]
    out = tvm.runtime.empty(tuple(int(d) for d in params[-1].shape), "float64")
    ex["main"](*args, out)
    np.testing.assert_allclose(out.numpy(), reference(*host), rtol=1e-12, atol=1e-12)


def test_expected_from_the_twins_outputs_matches_numpys():
    """The naive-reference path on the CPU: the twin run on the inputs and on |inputs| gives
    the Expected numpy gives, and judges a candidate the same way."""
    op = ops.matmul_bias_relu(16, 16, 256)
    wide = widen.widen_to_float64(op.func).with_attr("global_symbol", "main")
    ex = tvm.compile(tvm.IRModule({"main": wide}), target="llvm")
    host = _host_inputs(op.func)

    def run(inputs):
        out = tvm.runtime.empty((16, 16), "float64")
        ex["main"](*[tvm.runtime.tensor(h.astype(np.float64)) for h in inputs], out)
        return [out.numpy()]

    twin = verify.expected_from_outputs(run(host), run(verify.magnitude_inputs(host)), op.func)
    numpy_ref = verify.expected_from_numpy(op.reference, host, op.func)
    assert twin.reference == verify.NAIVE_REFERENCE.name and twin.kinds == numpy_ref.kinds
    np.testing.assert_allclose(twin.outputs[0], numpy_ref.outputs[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(twin.magnitudes[0], numpy_ref.magnitudes[0], rtol=1e-12)
    candidate = numpy_ref.outputs[0].astype(np.float16)
    assert verify.check_outputs([candidate], twin).ok
    candidate[0, :8] = 0
    verdict = verify.check_outputs([candidate], twin)
    assert not verdict.ok and verdict.reference == "naive float64 schedule of the function"


@pytest.mark.parametrize("case", ["two_store_norm", "softmax"])
def test_naive_reference_module_compiles_to_a_float64_cuda_kernel(case):
    target = tvm.target.Target("nvidia/nvidia-h100")
    mod = widen.naive_reference_module(CASES[case][0](), target)
    with target:
        src = tvm.compile(mod, target=target).mod.imports[0].inspect_source()
    # the twin's kernels (the function in its own dtypes, where it is there, is not the twin)
    kernels = [k for k in src.split("__global__")[1:] if widen.OWN_DTYPES not in k.split("{")[0]]
    assert kernels and all("double" in k for k in kernels)
    assert not any("half" in k or "float " in k for k in kernels)
    assert "threadIdx.x" in src


def test_functions_without_a_float64_twin_are_refused():
    @T.prim_func(s_tir=True)
    def bits(A: T.Buffer((8,), "uint16"), B: T.Buffer((8,), "float16")):
        for i in range(8):
            with T.sblock("B"):
                vi = T.axis.spatial(8, i)
                B[vi] = T.reinterpret("float16", A[vi])

    @T.prim_func(s_tir=True)
    def extern(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
        for i in range(8):
            with T.sblock("B"):
                vi = T.axis.spatial(8, i)
                B[vi] = T.call_pure_extern("float32", "expf", A[vi])

    with pytest.raises(ValueError, match="reinterprets bits"):
        widen.widen_to_float64(bits)
    with pytest.raises(ValueError, match="expf"):
        widen.widen_to_float64(extern)


def test_an_fp16_overflow_is_accepted_only_where_the_exact_value_overflows():
    """fp16 arithmetic turns -66578 into -inf (a batch-norm epilogue of ResNet-18 with random
    weights); the float64 reference does not overflow. That infinity is the function's own
    result; an infinity where the value fits, or of the wrong sign, is still wrong."""
    a = te.placeholder((4,), "float16", name="A")
    d = te.compute((4,), lambda i: a[i] * te.const(4, "float16"), name="D")
    func = te.create_prim_func([a, d])
    x = np.array([20000, -17000, 15000, 1], np.float16)
    expected = verify.expected_from_numpy(lambda v: v * 4, [x], func)
    with np.errstate(over="ignore"):
        fp16 = x * np.float16(4)  # [inf, -inf, 60000, 4] in fp16
    assert np.isinf(fp16[:2]).all()
    assert verify.check_outputs([fp16], expected).ok
    wrong_sign = fp16.copy()
    wrong_sign[1] = np.inf
    assert not verify.check_outputs([wrong_sign], expected).ok
    fits = fp16.copy()
    fits[2] = np.inf  # 60000 is a finite fp16
    assert not verify.check_outputs([fits], expected).ok


def test_the_check_judges_every_element_by_the_rule_it_states(monkeypatch):
    """Elementwise: within the bound where the reference is finite (or an infinity the
    function's own fp16 produces), identical where it is not (NaN matching NaN). The check only
    applies the special rules to elements that failed the bound, so mix them all in."""
    a = te.placeholder((64,), "float16", name="A")
    d = te.compute((64,), lambda i: a[i] * te.const(4, "float16"), name="D")
    func = te.create_prim_func([a, d])
    rng = np.random.default_rng(3)
    x = rng.uniform(-100, 100, 64).astype(np.float16)
    x[:4] = [20000, -17000, np.inf, np.nan]
    expected = verify.expected_from_numpy(lambda v: v * 4, [x], func)
    ref = expected.outputs[0]
    allowed = verify.allowed_error(ref, None, expected.kinds[0], "float16")
    with np.errstate(over="ignore", invalid="ignore"):
        out = (x * np.float16(4)).astype(np.float16)
    out[10:14] = out[10:14].astype(np.float32) + np.float32(allowed[10:14]) * np.array([0.5, 2, -0.5, -2], np.float32)
    out[20], out[21], out[22] = np.nan, np.inf, -np.inf
    out[3] = np.nan
    out64, limit = out.astype(np.float64), 65504.0
    with np.errstate(invalid="ignore"):
        fits = np.abs(out64 - ref) <= allowed
    overflow = np.isinf(out64) & (np.sign(out64) == np.sign(ref)) & (np.abs(ref) + allowed >= limit)
    same = (out64 == ref) | (np.isnan(ref) & np.isnan(out64))
    want_bad = int(np.count_nonzero(~np.where(np.isfinite(ref), fits | overflow, same)))
    assert want_bad == 5  # 11 and 13 beyond the bound, 20-22 not finite where the value is
    verdict = verify.check_outputs([out], expected)
    assert verdict.bad == want_bad and not verdict.ok
    # cut into chunks of 5 elements (checked on threads): the same count and the same worst
    monkeypatch.setattr(host, "CHUNK_ELEMENTS", 5)
    chunked = verify.check_outputs([out], expected)
    assert (chunked.bad, chunked.worst) == (verdict.bad, verdict.worst)


@T.prim_func(s_tir=True)
def tanh_gelu_fp16(x: T.Buffer((64, 256), "float16"), y: T.Buffer((64, 256), "float16")):
    """GPT-2's GELU as torch.export gives it after ToMixedPrecision: every step in fp16."""
    for i, j in T.grid(64, 256):
        with T.sblock("y"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = T.float16(0.5) * x[vi, vj] * (T.float16(1) + T.tanh(T.float16(0.7978846) * (
                x[vi, vj] + T.float16(0.044715) * x[vi, vj] * x[vi, vj] * x[vi, vj])))


def _fp16_gelu(x):
    """The chain above in numpy fp16, rounding after every operation as the kernel does."""
    h = np.float16
    inner = h(0.7978846) * (x + h(0.044715) * x * x * x)
    return (h(0.5) * x * (h(1) + np.tanh(inner).astype(h))).astype(h)


def test_an_fp16_chain_that_cancels_is_judged_by_its_own_arithmetic():
    # the negative tail, [-4, -2]: tanh near -1, outputs (and their rms) small
    x = (uniform((64, 256), np.float32, 3) - 3).astype(np.float16)
    xd = x.astype(np.float64)
    ref = 0.5 * xd * (1 + np.tanh(0.7978846 * (xd + 0.044715 * xd**3)))
    own = _fp16_gelu(x)
    plain = verify.expected_from_outputs([ref], None, tanh_gelu_fp16)
    assert not verify.check_outputs([own], plain).ok  # 1 + tanh cancels beyond the elementwise bound
    assert verify.wants_own_dtype_run(tanh_gelu_fp16)
    expected = verify.expected_from_outputs([ref], None, tanh_gelu_fp16, own_outputs=[own])
    assert verify.check_outputs([own], expected).ok
    # a wrong element is still wrong: the neighbour's value, or a dropped factor
    for wrong in (np.roll(own, 1, axis=1), (own * np.float16(0.98)).astype(np.float16)):
        verdict = verify.check_outputs([wrong], expected)
        assert not verdict.ok and verdict.bad > 0


def test_the_own_dtype_twin_is_built_for_narrow_elementwise_chains_only():
    mod = widen.naive_reference_module(tanh_gelu_fp16, "nvidia/nvidia-h100")
    assert widen.OWN_DTYPES in [g.name_hint for g in mod.get_global_vars()]
    assert str(mod[widen.OWN_DTYPES].params[0].dtype) == "float16"
    matmul = widen.naive_reference_module(matmul_cast_fp16(64, 64, 64), "nvidia/nvidia-h100")
    assert [g.name_hint for g in matmul.get_global_vars()] == ["main"]


def _attention_like_kernel(q, k, v, causal, drop_tile=None):
    """Flash attention's arithmetic on the host: fp32 scores, probabilities rounded to fp16
    before P·V (as the tensor cores take them), row sums of the unrounded ones; optionally a
    key tile left out (a wrong kernel)."""
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float32), k.astype(np.float32)) / np.sqrt(q.shape[-1])
    t = s.shape[-1]
    if causal:
        s = np.where(np.arange(t)[None, :] <= np.arange(t)[:, None], s, -np.inf)
    if drop_tile is not None:
        s[..., drop_tile] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True)).astype(np.float32)
    o = np.einsum("bhij,bhjd->bhid", p.astype(np.float16).astype(np.float32), v.astype(np.float32))
    return (o / p.sum(-1, keepdims=True)).astype(np.float16)


def test_attention_is_bounded_by_its_weighted_magnitudes():
    """Early causal rows average a few keys, which cancel: the rounding of the probabilities
    errs relative to Σ p |v|, not to the output. That passes; a key tile left out does not."""
    op = ops.attention(1, 4, 256, 256, 64, causal=True)
    rng = np.random.default_rng(3)
    q, k, v = (rng.uniform(-1, 1, (1, 4, 256, 64)).astype(np.float16) for _ in range(3))
    assert output_kinds(op.func)[0].sum_of_products
    expected = expected_from_numpy(op.reference, [q, k, v], op.func)
    assert check_outputs([_attention_like_kernel(q, k, v, True)], expected).ok
    assert not check_outputs([_attention_like_kernel(q, k, v, True, drop_tile=slice(64, 128))], expected).ok


def test_sums_of_fp8_products_are_checked_at_the_tensor_cores_accumulation():
    """Hopper's tensor cores keep about 14 bits of a running sum of fp8 products: every wgmma
    tile of a 1000x520x272 e4m3 GEMM erred by 6e-5 of S at the same elements (H200), past the
    float32 bound. fp16 products keep the float32 bound."""
    fp8 = ops.matmul(64, 64, 272, "float8_e4m3fn", "float16", "NT", acc_dtype="float32").func
    (kind,) = output_kinds(fp8)
    assert kind.acc_dtype == FP8_MMA_ACC
    assert output_kinds(ops.matmul_scaled(64, 64, 128).func)[0].acc_dtype == FP8_MMA_ACC
    (fp16_kind,) = output_kinds(ops.matmul(64, 64, 272, "float16", "float16", "NT", acc_dtype="float32").func)
    assert fp16_kind.acc_dtype == "float32"
    ref, mag = np.array([0.0559]), np.array([68.0])  # the H200's worst element, S of 272 products
    assert verify.allowed_error(ref, mag, kind, "float16")[0] > 0.0042 > verify.allowed_error(ref, mag, fp16_kind, "float16")[0]
    assert verify.allowed_error(ref, mag, kind, "float16")[0] < 0.25  # a lost product of two halves is still caught
