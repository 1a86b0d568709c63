"""The naive float64 reference's schedules: the tiled one for plain contractions, stock Dlight's
Fallback for everything else, and both computing the same sums in the same order."""

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import dlight as dl

from fastdlight import ops
from fastdlight.compiler.compile import build, compile_cubin
from fastdlight.measure import widen
from fastdlight.measure.workload import output_indices, param_buffers, static_shape
from fastdlight.search import reference
from fastdlight.search.reference import ReferenceRun
from fastdlight.search.results import Failure
from fastdlight.search.stages import Built

H100 = tvm.target.Target("nvidia/nvidia-h100")


def _source(mod) -> str:
    with H100:
        return tvm.compile(mod, target=H100).mod.imports[0].inspect_source()


@pytest.mark.parametrize("op", [
    ops.matmul(256, 128, 512, layout="NT"),
    ops.matmul(64, 256, 128, dtype="bfloat16", layout="NN"),
    ops.matmul(128, 64, 64, layout="NN", batch=3),
    ops.matmul_bias_relu(128, 128, 256),
], ids=["nt", "bf16_nn", "batched", "bias_relu"])
def test_plain_contractions_get_the_tiled_schedule_and_compile(op):
    mod = widen.naive_reference_module(op.func, H100)
    src = _source(mod)
    assert "__shared__" in src and "double" in src and "half" not in src.split("__global__")[1]
    # one thread per output, the reduction serial in it: a TILE x TILE block of threads
    assert f"__launch_bounds__({widen.TILE * widen.TILE})" in src
    cubin = compile_cubin(src, H100)
    # both operands' TILE x TILE slices, rows padded by one element against bank conflicts
    assert cubin.binary and cubin.shared_bytes == 2 * widen.TILE * (widen.TILE + 1) * 8 and not cubin.spill_bytes


def _matmul_then_batchnorm_relu6(m=128, n=96, k=16):
    """A 1x1 convolution as a GEMM, its fp16 result through BatchNorm and ReLU6 (MobileNetV2's
    expansion layers): the subtraction after the fp16 cast may cancel beyond the elementwise bound."""
    x, w = te.placeholder((m, k), "float16", "x"), te.placeholder((k, n), "float16", "w")
    mean, std = te.placeholder((n,), "float32", "mean"), te.placeholder((n,), "float32", "std")
    r = te.reduce_axis((0, k), "r")
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * w[r, j].astype("float32"), axis=r))
    half = te.compute((m, n), lambda i, j: acc[i, j].astype("float16"))
    norm = te.compute((m, n), lambda i, j: (half[i, j].astype("float32") - mean[j]) / std[j])
    out = te.compute((m, n), lambda i, j: tvm.tirx.min(tvm.tirx.max(norm[i, j], 0.0), 6.0).astype("float16"))
    return te.create_prim_func([x, w, mean, std, out])


def test_a_tiled_twin_keeps_the_functions_own_dtype_run_where_it_cancels():
    func = _matmul_then_batchnorm_relu6()
    assert widen.tiled_reference_schedule(widen.widen_to_float64(func)) is not None
    mod = widen.naive_reference_module(func, H100)
    assert {gv.name_hint for gv in mod.functions} == {"main", widen.OWN_DTYPES}
    src = _source(mod)
    assert "__shared__" in src and compile_cubin(src, H100).binary


@pytest.mark.parametrize("op", [
    ops.matmul(24, 128, 512, layout="NT"),          # rows not a multiple of TILE
    ops.gemv(4096, 512),                            # one row
    ops.conv2d_nhwc(2, 16, 16, 32, 32),             # operands indexed by sums of variables
    ops.softmax(64, 256),                           # several reductions
], ids=["odd_rows", "gemv", "conv", "softmax"])
def test_everything_else_gets_dlights_fallback(op):
    assert widen.tiled_reference_schedule(widen.widen_to_float64(op.func)) is None
    src = _source(widen.naive_reference_module(op.func, H100))
    assert "__shared__" not in src and "double" in src
    assert f"__launch_bounds__({widen.NAIVE_BLOCK_THREADS})" in src  # narrow blocks: few-row reductions spread


@pytest.mark.gpu
def test_narrow_blocks_give_the_same_bits_as_dlights_own_fallback():
    """The naive schedule's narrow blocks change where each output is summed, not how."""
    op = ops.softmax(96, 3000)
    wide = widen.widen_to_float64(op.func).with_attr("global_symbol", "main")
    with H100:
        stock = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(tvm.IRModule({"main": wide}))
    ours = widen.naive_reference_module(op.func, H100)
    dev = tvm.cuda(0)
    params = param_buffers(wide)
    x = tvm.runtime.tensor(np.random.default_rng(0).uniform(-4, 4, static_shape(params[0])), dev)
    outs = []
    for mod in (ours, stock):
        out = tvm.runtime.empty(static_shape(params[-1]), "float64", dev)
        build(mod, "cuda")[mod["main"].attrs["global_symbol"]](x, out)  # ours keeps softmax's name
        outs.append(out.numpy())
    assert np.all(np.isfinite(outs[0]))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.parametrize("op", [ops.matmul(256, 128, 512, layout="NT"), ops.matmul_bias_relu(128, 128, 256),
                                ops.matmul(64, 64, 128, layout="NN", batch=3)],
                         ids=["nt", "bias_relu", "batched"])
def test_the_tiled_and_the_fallback_schedule_give_the_same_bits(op):
    """Both sum each output in the same order in float64: equal to the last bit."""
    _assert_same_bits_as_fallback(op)


def _assert_same_bits_as_fallback(op):
    """The reference module of ``op`` and Dlight's Fallback schedule of its float64 twin give
    the same bits on the same random inputs."""
    wide = widen.widen_to_float64(op.func).with_attr("global_symbol", "main")
    with H100:
        fallback = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(tvm.IRModule({"main": wide}))
    ours = widen.naive_reference_module(op.func, H100)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    params = param_buffers(wide)
    inputs = [tvm.runtime.tensor(rng.uniform(-1, 1, static_shape(b)), dev) for b in params[:-1]]
    outs = []
    for mod in (ours, fallback):
        out = tvm.runtime.empty(static_shape(params[-1]), "float64", dev)
        build(mod, "cuda")[mod["main"].attrs["global_symbol"]](*inputs, out)
        outs.append(out.numpy())
    assert np.all(np.isfinite(outs[0]))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_the_naive_reference_runs_on_its_own_thread_once_and_reports_why_it_failed():
    """``start_early`` runs the reference beside the build stream; ``expected`` waits for it and
    never runs it a second time. A reference that did not build is reported in one line."""
    op = ops.matmul(64, 64, 64, layout="NT")
    release, calls = threading.Event(), []

    def workload():  # the reference waits for the GPU inputs, made on another thread
        calls.append(threading.current_thread().name)
        release.wait(5)
        return object()

    run = ReferenceRun(op.func, None)
    run.built(Built("ref", None, Failure("nvcc", "nvcc: ptxas error"), 0.1))
    run.start_early(workload, arch=None)
    run.start_early(workload, arch=None)  # a second start is a no-op
    release.set()
    expected, why = run.expected(wl=None, arch=None)
    assert expected is None and why.startswith("reference failed: ") and why.endswith("the naive reference did not build or run (nvcc: ptxas error)")
    assert calls == ["fastdlight-reference"]
    # a numpy reference never starts early: it runs after the timings
    numpy_run = ReferenceRun(op.func, op.reference)
    numpy_run.start_early(workload, arch=None)
    assert numpy_run._thread is None


@pytest.mark.parametrize("op, runs", [(ops.softmax(8, 64), [False]), (ops.matmul(16, 16, 32, layout="NT"), [False, True])],
                         ids=["softmax", "matmul"])
def test_the_reference_runs_on_absolute_inputs_only_for_sums_of_products(op, runs, monkeypatch):
    """Magnitudes bound a sum of products only: a softmax's reference runs once, a matmul's twice."""
    seen = []
    out = param_buffers(op.func)[output_indices(op.func)[0]]

    def run_widened(fn, wl, absolute):
        seen.append(absolute)
        return [np.ones(static_shape(out))]

    monkeypatch.setattr(reference, "run_widened", run_widened)
    expected = reference.naive_expected(None, SimpleNamespace(func=op.func))
    assert seen == runs
    assert (expected.magnitudes[0] is not None) == (True in runs)


@pytest.mark.parametrize("op", [ops.attention(1, 2, 256, 256, 64), ops.attention(2, 2, 128, 256, 128, causal=True)],
                         ids=["b1", "b2_causal"])
def test_attention_gets_a_kernel_a_block_with_its_two_contractions_tiled(op):
    wide = widen.widen_to_float64(op.func)
    assert widen.tiled_reference_schedule(wide) is None and widen.staged_reference_schedule(wide) is not None
    src = _source(widen.naive_reference_module(op.func, H100))
    kernels = [k for k in src.split("__global__")[1:] if "{" in k.split(";")[0]]  # definitions, not declarations
    # the scores, the row max, the exponentials (read by a contraction: not inlined there), the
    # weighted values, the row sum, the output; the scaling is inlined into its two readers
    assert len(kernels) == 6 and sum("__shared__" in k for k in kernels) == 2
    assert "half" not in "".join(kernels) and compile_cubin(src, H100).binary


@pytest.mark.parametrize("op", [ops.attention(1, 4, 128, 128, 64, kv_heads=2), ops.softmax(64, 256)],
                         ids=["gqa", "softmax"])
def test_no_staged_schedule_without_a_plain_contraction(op):
    # grouped heads read K and V at h // group: not indexed by iteration variables alone
    assert widen.staged_reference_schedule(widen.widen_to_float64(op.func)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_staged_and_the_fallback_attention_reference_give_the_same_bits(causal):
    _assert_same_bits_as_fallback(ops.attention(1, 2, 128, 256, 64, causal=causal))
