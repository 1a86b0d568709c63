"""Symbolic dimensions: a kernel per tuned value, compiled symbolic, behind one dispatcher."""

import dataclasses
import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.analysis.prepare import specialize
from fastdlight.arch import CUDA, auto_arch
from fastdlight.compiler.compile import build, compile_mod_to_cubin, cuda_source, pre_lower
from fastdlight.config import Config
from fastdlight.relax import ApplyFastTuning
from fastdlight.schedules.dispatch import dispatch_config
from fastdlight.schedules.symbolic import DISPATCHER, Branch, dispatch_func, generalize
from fastdlight.search.dynamic import check_dispatch, check_values, default_points, plan_values, tune_dispatch
from fastdlight.search.options import TuneOptions

H100 = CUDA("nvidia/nvidia-h100")
COMPILE_ONLY = TuneOptions(measure=False, parallel_build=False)


def decode_matmul(n: int, k: int):
    return ops.matmul_symbolic_rows(n, k).with_attr("global_symbol", "mm")


@T.prim_func(s_tir=True)
def scale_rows(a: T.handle, b: T.handle):
    T.func_attr({"global_symbol": "scale_rows"})
    n = T.int64()
    A = T.match_buffer(a, (n, 1024), "float32")
    B = T.match_buffer(b, (n, 1024), "float32")
    for i, j in T.grid(n, 1024):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)


@T.prim_func(s_tir=True)
def scale_2d(a: T.handle, b: T.handle):
    T.func_attr({"global_symbol": "scale_2d"})
    n, c = T.int64(), T.int64()
    A = T.match_buffer(a, (n, c), "float32")
    B = T.match_buffer(b, (n, c), "float32")
    for i, j in T.grid(n, c):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)


def test_plan_values_defaults_and_errors():
    values, defaulted = plan_values(scale_rows, None, H100)
    assert values == (("n", default_points(H100)),) and defaulted == ("n",)
    assert default_points(H100)[-1] == 4096  # 132 SMs x 32 rows, rounded down to a power of two
    assert plan_values(scale_rows, {"n": [64, 1, 64]}, H100) == ((("n", (1, 64)),), ())
    with pytest.raises(ValueError, match="does not have"):
        plan_values(scale_rows, {"seq": [1]}, H100)
    with pytest.raises(ValueError, match="positive integer"):
        plan_values(scale_rows, {"n": [0, 4]}, H100)


def test_check_values_cover_each_range_and_above():
    points = [dict(p)["m"] for p in check_values((("m", (1, 16, 128, 2048)),))]
    assert points == [1, 9, 16, 73, 128, 1089, 2048, 3073]
    assert all(p % 2 for p in points if p not in (16, 128, 2048))  # inside a range: odd, no tile divides it


def test_list_to_tune_points_at_the_dispatcher():
    with pytest.raises(ValueError, match="tune_dispatch"):
        specialize(scale_rows, {"n": [1, 2]})


def test_dispatcher_chain_and_build():
    d = tune_dispatch(scale_rows, H100, 2, COMPILE_ONLY, {"n": [1, 64]})
    text = d.func.script()
    assert [b.point for b in d.buckets] == [(("n", 1),), (("n", 64),)]
    # the kernel tuned at 1 serves n = 1; the one tuned at 64, compiled symbolic, serves 2..64
    # and everything above: one else branch
    assert re.search(r"if n (<=|==) T\.int64\(1\)", text) and "n <= T.int64(64)" not in text
    assert text.count("else:") == 1
    assert not any(b.config.is_stock for b in d.buckets[1:])
    source, cubin = compile_mod_to_cubin(tvm.IRModule({"scale_rows": d.func}), H100.target)
    assert source.count("__global__") >= 2 and cubin.binary


def test_two_variables_dispatch_on_both():
    d = tune_dispatch(scale_2d, H100, 1, COMPILE_ONLY, {"n": [8, 64], "c": [256, 1024]})
    assert {tuple(sorted(b.point)) for b in d.buckets} == {(("c", c), ("n", n)) for n in (8, 64) for c in (256, 1024)}
    text = d.func.script()
    assert "n <= T.int64(8)" in text and "c <= T.int64(256)" in text  # a chain over c inside each n branch
    source, cubin = compile_mod_to_cubin(tvm.IRModule({"scale_2d": d.func}), H100.target)
    assert source.count("__global__") >= 4 and cubin.binary


def test_decode_matmul_kernels_are_symbolic_and_compile():
    func = decode_matmul(256, 256)
    d = tune_dispatch(func, H100, 2, COMPILE_ONLY, {"m": [1, 16, 64]})
    kinds = [b.config.kind for b in d.buckets]
    # 16 rows: mma.sync (wgmma needs 64); 64 rows: whichever tensor-core template estimates
    # best (unmeasured), the wgmma kernel with symbolic M beside the s_tir ones
    assert kinds[1] == "matmul_tc" and kinds[2] in ("matmul_tc", "matmul_wgmma"), d.describe()
    # one row keeps the static GEMV winner, run only at m == 1
    assert d.buckets[0].exact and kinds[0] == "gemv" and "m == T.int64(1)" in d.func.script()
    for b in d.buckets:
        assert not b.note or "symbolic form" in b.note
    source, _ = compile_mod_to_cubin(tvm.IRModule({"mm": d.func}), H100.target)
    assert "mma" in source  # the tensor-core kernels made it into the dispatcher
    assert ("wgmma.mma_async" in source) == (kinds[2] == "matmul_wgmma")


def test_apply_fast_tuning_dispatches_symbolic_functions():
    tuning = ApplyFastTuning(topk=2, target=H100, opt_shapes={"n": [1, 64]}, measure=False, parallel_build=False)
    mod = tuning(tvm.IRModule({"scale_rows": scale_rows}))
    assert DISPATCHER in mod["scale_rows"].attrs and "tirx.is_scheduled" in mod["scale_rows"].attrs
    (entry,) = tuning.report
    assert entry.status == "tuned" and entry.dispatch.startswith(("n<=1: ", "n=1: ")) and "n<=64: " in entry.dispatch


def test_a_wgmma_kernel_with_symbolic_m_shares_a_dispatcher_with_s_tir_kernels():
    func = decode_matmul(512, 512)
    static = specialize(func, {"m": 256})
    config = Config("matmul_wgmma", (128, 128), warp=(64, 128), rstep=(64,), pipeline_stages=3, rasterization=4)
    with H100.target:
        wgmma = generalize(func, static, dispatch_config(static, config, allow_fallback=False).schedule, config, 132)
    assert wgmma is not None and "tirx.kernel" in wgmma.attrs
    small = tune_dispatch(func, H100, 1, COMPILE_ONLY, {"m": [16]}).buckets[0]
    with H100.target:
        mma = generalize(func, specialize(func, {"m": 17}),
                         dispatch_config(specialize(func, {"m": 17}), small.config, allow_fallback=False).schedule)
    assert mma is not None
    lowered = [pre_lower(k, H100.target) for k in (mma, wgmma)]
    d = dispatch_func(func, ["m"], [Branch((("m", 16),), lowered[0]), Branch((("m", None),), lowered[1])])
    source, cubin = compile_mod_to_cubin(tvm.IRModule({"mm": d}), H100.target)
    assert "wgmma.mma_async" in source and "mma.sync" in source and cubin.binary
    # both branches' kernels (lowered apart, before the dispatcher) launched as dependents too
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))
    assert len(kernels) == 2 and source.count("tvm_builtin_ptx_griddepcontrol_wait();") == 2


def test_a_cluster_winner_gives_its_single_cta_tile_for_a_symbolic_m():
    func = decode_matmul(512, 512)
    static = specialize(func, {"m": 256})
    single = Config("matmul_wgmma", (128, 128), warp=(64, 128), rstep=(64,), pipeline_stages=3, rasterization=4)
    sources = []
    for config in (dataclasses.replace(single, cluster=2), single):
        with H100.target:
            kernel = generalize(func, static, dispatch_config(static, config, allow_fallback=False).schedule, config, 132)
        assert kernel is not None
        sources.append(cuda_source(build(tvm.IRModule({"main": kernel}), H100.target)))
    assert "multicast::cluster" not in sources[0] and sources[0] == sources[1]


@pytest.mark.gpu
def test_decode_matmul_dispatches_correctly_on_gpu():
    arch, func = auto_arch(), decode_matmul(1024, 1024)
    opts = TuneOptions(budget_ms=20, screen_ms=5)
    d = tune_dispatch(func, arch, 4, opts, {"m": [1, 16, 128, 2048]})
    checks = check_dispatch(d, func, arch, opts, points=[(("m", m),) for m in (1, 7, 128, 1000, 4096)])
    assert [c.passed for c in checks] == [True] * 5, [c.message for c in checks]
    timed = [c for c in checks if c.latency_ms is not None]
    assert len(timed) == 2 and all(np.isfinite(c.latency_ms) for c in timed)  # M = 1 and 128 were tuned


@T.prim_func(s_tir=True)
def transposed_scores(a: T.handle, b: T.handle):
    """A decode step's scores (cache length L symbolic), transposed, scaled and widened."""
    T.func_attr({"global_symbol": "transposed_scores"})
    L = T.int64()
    A = T.match_buffer(a, (1, 2, L, 4), "float16")
    B = T.match_buffer(b, (1, 2, 4, L), "float32")
    t = T.sblock_alloc_buffer((1, 2, 4, L), "float16")
    for i, j, k, m in T.grid(1, 2, 4, L):
        with T.sblock("T_transpose"):
            v0, v1, v2, v3 = T.axis.remap("SSSS", [i, j, k, m])
            t[v0, v1, v2, v3] = A[v0, v1, v3, v2]
    for i, j, k, m in T.grid(1, 2, 4, L):
        with T.sblock("compute"):
            v0, v1, v2, v3 = T.axis.remap("SSSS", [i, j, k, m])
            B[v0, v1, v2, v3] = T.Cast("float32", t[v0, v1, v2, v3] * T.float16(0.1767578125))


def test_a_replay_that_does_not_compile_gives_way_to_one_that_does():
    """The transpose template's winner, replayed with L symbolic, left the whole transposed row to
    a thread ("Can only handle constant size stack allocation"): the dispatcher takes a candidate
    whose replay compiles, and builds."""
    d = tune_dispatch(transposed_scores, H100, 4, COMPILE_ONLY, {"L": [64, 512]})
    source, cubin = compile_mod_to_cubin(tvm.IRModule({"transposed_scores": d.func}), H100.target)
    assert [b.point for b in d.buckets] == [(("L", 64),), (("L", 512),)] and cubin.binary
