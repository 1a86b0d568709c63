"""Coverage: each failure class the Dlight-test survey found (benchmarks/survey_dlight.py), on a
workload of that shape written here, compiles to cubin (or is refused with one line)."""

import warnings

import pytest
from tvm.script import tirx as T

from fastdlight.arch import CUDA, auto_arch
from fastdlight.measure.workload import param_buffers, static_shape
from fastdlight.search.candidates import tune_function
from fastdlight.search.options import TuneOptions

H100 = CUDA("nvidia/nvidia-h100")


def compiles(func, opt_shapes=None, topk=2):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tune_function(func, H100, topk, TuneOptions(measure=False, max_workers=2), opt_shapes=opt_shapes)
    assert tuned.best.compiled and all(r.compiled for r in tuned.results), [r.error for r in tuned.results]
    return tuned


@T.prim_func(s_tir=True)
def composite_dim(p_x: T.handle, w: T.Buffer((T.int64(64), T.int64(512)), "float32"), p_y: T.handle, n: T.int64):
    x = T.match_buffer(p_x, (T.int64(64), n), "float32")
    y = T.match_buffer(p_y, (n * T.int64(4),), "float32")  # a dimension that is an expression
    for i, c, r in T.grid(n * T.int64(4), T.int64(64), T.int64(512)):
        with T.sblock("y"):
            vi, vc, vr = T.axis.remap("SRR", [i, c, r])
            with T.init():
                y[vi] = T.float32(0)
            y[vi] = y[vi] + x[vc, vi // T.int64(4)] * w[vc, vr]


def test_a_dimension_that_is_an_expression_is_specialized():
    tuned = compiles(composite_dim, {"n": 256})
    assert [static_shape(b) for b in param_buffers(tuned.best._func)] == [(64, 256), (64, 512), (1024,)]


@T.prim_func(s_tir=True)
def two_store_norm(p_a: T.handle, g: T.Buffer((T.int64(1024),), "float32"), p_out: T.handle):
    n = T.int64()
    a = T.match_buffer(p_a, (n, T.int64(1024)))
    out = T.match_buffer(p_out, (n, T.int64(1024)), "float16")
    s1 = T.sblock_alloc_buffer((n,))
    s2 = T.sblock_alloc_buffer((n,))
    for i, k in T.grid(n, T.int64(1024)):
        with T.sblock("red"):  # sum and sum of squares in one block, as TVM legalizes layer_norm
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s1[vi] = T.float32(0)
                s2[vi] = T.float32(0)
            v1: T.let[T.float32] = s1[vi] + a[vi, vk]
            v2: T.let[T.float32] = s2[vi] + a[vi, vk] * a[vi, vk]
            s1[vi] = v1
            s2[vi] = v2
    for i, k in T.grid(n, T.int64(1024)):
        with T.sblock("norm"):
            vi, vk = T.axis.remap("SS", [i, k])
            out[vi, vk] = T.Cast("float16", (a[vi, vk] - s1[vi] * T.float32(1 / 1024)) * T.rsqrt(
                s2[vi] * T.float32(1 / 1024) - s1[vi] * T.float32(1 / 1024) * s1[vi] * T.float32(1 / 1024)
                + T.float32(1e-5)) * g[vk])


def test_a_reduction_block_storing_two_buffers_is_a_general_reduction():
    tuned = compiles(two_store_norm, {"n": 64})
    assert tuned.config.kind == "general_reduction"


@T.prim_func(s_tir=True)
def gemv_2x2(m: T.Buffer((2, 2), "float32"), v: T.Buffer((2,), "float32"), o: T.Buffer((2,), "float32")):
    for i, k in T.grid(2, 2):
        with T.sblock("gemv"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                o[vi] = T.float32(0)
            o[vi] = o[vi] + m[vi, vk] * v[vk]


def test_a_gemv_shorter_than_a_warp_gets_configs():
    assert compiles(gemv_2x2).config.kind == "gemv"


@T.prim_func(s_tir=True)
def cpu_kernel(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    T.func_attr({"target": T.target("llvm")})
    for i in range(64):
        with T.sblock("b"):
            vi = T.axis.spatial(64, i)
            b[vi] = a[vi] * T.float32(2)


def test_a_function_with_its_own_cpu_target_is_refused():
    with pytest.raises(ValueError, match=r"carries its own target \(llvm\); fastdlight tunes CUDA functions only"):
        tune_function(cpu_kernel, H100, 2, TuneOptions(measure=False, max_workers=2))


@T.prim_func(s_tir=True)
def int4_dequant_matmul(x: T.Buffer((256, 512), "float16"), wq: T.Buffer((256, 64), "uint32"),
                        scale: T.Buffer((256, 4), "float16"), y: T.Buffer((256, 256), "float16")):
    w = T.sblock_alloc_buffer((256, 512), "float16")
    for n, k in T.grid(256, 512):
        with T.sblock("dequant"):  # eight int4 weights per uint32, one scale per 128
            vn, vk = T.axis.remap("SS", [n, k])
            w[vn, vk] = (T.Cast("float16", T.bitwise_and(T.shift_right(wq[vn, vk // 8], T.Cast("uint32", vk % 8 * 4)),
                                                         T.uint32(15))) - T.float16(7)) * scale[vn, vk // 128]
    for m, n, k in T.grid(256, 256, 512):
        with T.sblock("matmul"):
            vm, vn, vk = T.axis.remap("SSR", [m, n, k])
            with T.init():
                y[vm, vn] = T.float16(0)
            y[vm, vn] = y[vm, vn] + x[vm, vk] * w[vn, vk]


def test_tensor_core_candidates_of_an_int4_dequant_matmul_compile():
    # the dequantize step computes in uint32: 8 fp16 lanes of it would be a 256-bit vector
    assert compiles(int4_dequant_matmul).config.kind == "matmul_tc"


@T.prim_func(s_tir=True)
def gemv_broadcast(a: T.Buffer((1, 8, 1, 128), "float16"), b: T.Buffer((1, 8, 512, 128), "float16"),
                   c: T.Buffer((1, 8, 2, 3, 512), "float32")):
    t = T.sblock_alloc_buffer((1, 8, 1, 512), "float16")
    for i0, i1, i2, i3, k in T.grid(1, 8, 1, 512, 128):
        with T.sblock("gemv"):
            v0, v1, v2, v3, vk = T.axis.remap("SSSSR", [i0, i1, i2, i3, k])
            with T.init():
                t[v0, v1, v2, v3] = T.float16(0)
            t[v0, v1, v2, v3] = t[v0, v1, v2, v3] + a[v0, v1, v2, vk] * b[v0, v1, v3, vk]
    for i0, i1, i2, i3, i4 in T.grid(1, 8, 2, 3, 512):
        with T.sblock("broadcast"):  # every result read by 6 outputs: cannot be inlined
            v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
            c[v0, v1, v2, v3, v4] = T.Cast("float32", t[v0, v1, 0, v4])


def test_an_epilogue_that_broadcasts_keeps_its_input_out_of_global_memory():
    compiles(gemv_broadcast)


@T.prim_func(s_tir=True)
def batched_decode_gemv(x: T.Buffer((1, 8, 1, 128), "float16"), w: T.Buffer((1, 8, 512, 128), "float16"),
                        y: T.Buffer((1, 8, 1, 512), "float16")):
    for i0, h, m, n, k in T.grid(1, 8, 1, 512, 128):
        with T.sblock("attn_decode"):  # one query row per head against that head's keys
            v0, vh, vm, vn, vk = T.axis.remap("SSSSR", [i0, h, m, n, k])
            with T.init():
                y[v0, vh, vm, vn] = T.float16(0)
            y[v0, vh, vm, vn] = y[v0, vh, vm, vn] + x[v0, vh, vm, vk] * w[v0, vh, vn, vk]


def test_a_batched_decode_gemv_uses_the_gemv_template():
    # the head axis indexes both operands: it is one more row of W, not one more row of X
    assert compiles(batched_decode_gemv).config.kind == "gemv"


@pytest.mark.gpu
def test_gpu_coverage_workloads_are_verified():
    for func, shapes in ((two_store_norm, {"n": 64}), (gemv_2x2, None), (int4_dequant_matmul, None),
                         (gemv_broadcast, None), (composite_dim, {"n": 256}), (batched_decode_gemv, None)):
        tuned = tune_function(func, auto_arch(), 4, TuneOptions(budget_ms=20), opt_shapes=shapes)
        assert tuned.best.verified is True, tuned.best.check_message
