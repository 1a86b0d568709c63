"""Convolutions with too few channels for a tensor-core row become an im2col GEMM
(:mod:`fastdlight.relax.convs`): which ones, the same values (on the CPU), and ResNet-18's stem
as a GEMM with its batch norm fused after it."""

import pathlib

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.convs import im2col_convs, pointwise, pointwise_convs, rewritable
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.relax.reshapes import output_reshape_views
from fastdlight.schedules import apply_config
from fastdlight.search.candidates import stock_configs

H100 = CUDA("nvidia/nvidia-h100")
FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def conv_module(data_shape, weight_shape, *, stride=1, pad=0, dilation=1, groups=1, layout=("NHWC", "OHWI"),
                dtype="float16"):
    """``astype(conv2d(data, weight, out_dtype=float32), dtype)``, as a model holds a layer."""
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(data_shape, dtype))
    weight = relax.Var("weight", relax.TensorType(weight_shape, dtype))
    with bb.function("main", [data, weight]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(data, weight, strides=stride, padding=pad, dilation=dilation,
                                              groups=groups, data_layout=layout[0], kernel_layout=layout[1],
                                              out_dtype="float32"))
            out = bb.emit_output(relax.op.astype(conv, dtype))
        bb.emit_func_output(out)
    return bb.get()


def convs_of(mod):
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d":
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


@pytest.mark.parametrize(
    "case, expected",
    [
        (dict(data_shape=(2, 32, 32, 3), weight_shape=(64, 7, 7, 3), stride=2, pad=3), True),  # a stem
        (dict(data_shape=(2, 32, 32, 1), weight_shape=(16, 3, 3, 1), pad=1), True),  # one channel
        (dict(data_shape=(2, 32, 32, 64), weight_shape=(64, 3, 3, 64), pad=1), False),  # a template's row
        (dict(data_shape=(2, 32, 32, 8), weight_shape=(16, 3, 3, 8), pad=1), False),  # 16-byte pixels
        (dict(data_shape=(2, 32, 32, 3), weight_shape=(64, 7, 7, 3), dtype="float32"), False),  # CUDA cores
        (dict(data_shape=(2, 32, 32, 3), weight_shape=(64, 3, 3, 3), dilation=2), False),
        (dict(data_shape=(2, 32, 32, 6), weight_shape=(64, 3, 3, 3), groups=2), False),
        (dict(data_shape=(2, 32, 32, 3), weight_shape=(8, 15, 15, 3)), False),  # a 675-value receptive field: too long
        (dict(data_shape=(2, 3, 32, 32), weight_shape=(64, 3, 7, 7), layout=("NCHW", "OIHW")), False),
    ],
)
def test_which_convolutions_are_rewritten(case, expected):
    (conv,) = convs_of(conv_module(**case))
    assert rewritable(conv) is expected
    rewritten = im2col_convs()(conv_module(**case))
    assert (len(convs_of(rewritten)) == 0) is expected


def run_on_cpu(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


@pytest.mark.parametrize(
    "data_shape, weight_shape, stride, pad",
    [
        ((2, 13, 11, 3), (8, 7, 7, 3), 2, 3),  # a stem on an odd, non-square image: padding on all sides
        ((1, 9, 9, 1), (4, 3, 3, 1), 1, 1),
        ((1, 10, 10, 5), (6, 2, 4, 5), 1, (0, 1, 1, 2)),  # a non-square filter, uneven padding
    ],
)
def test_the_im2col_gemm_computes_the_convolution(data_shape, weight_shape, stride, pad):
    mod = conv_module(data_shape, weight_shape, stride=stride, pad=pad)
    rewritten = im2col_convs()(mod)
    assert not convs_of(rewritten)
    rng = np.random.default_rng(0)
    data = rng.standard_normal(data_shape).astype("float16")
    weight = rng.standard_normal(weight_shape).astype("float16")
    expected = run_on_cpu(mod, data, weight)
    got = run_on_cpu(rewritten, data, weight)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_resnet18s_stem_is_a_gemm_with_its_batch_norm_and_relu_fused():
    model = for_inference(tvm.script.from_source((FIXTURES / "resnet18_nhwc_b16.py").read_text()), layout="NHWC")
    channels = {int(conv.args[0].ty.shape[3]) for conv in convs_of(model)}
    assert channels == {64, 128, 256, 512}, "the 3-channel stem is no convolution any more"
    funcs = prim_funcs(prepare(H100.target)(model))
    gathers = [name for name in funcs if name.endswith("im2col")]
    assert gathers == ["fused_cast_transpose_im2col"], "the input's cast and NHWC transpose fuse into the gather"
    stem = [name for name in funcs if name.startswith("fused_matmul") and name.endswith("relu")]
    assert len(stem) == 1 and "subtract" in stem[0], stem
    configs = [c for s in candidate_sets(funcs[stem[0]], H100, 8, stock_configs(funcs[stem[0]], H100))
               for c in s.configs]
    spills = []
    for config in [c for c in configs if c.kind == "matmul_wgmma"][:2]:
        with H100.target:
            src = cuda_source(build(tvm.IRModule({"main": apply_config(funcs[stem[0]], config)}), H100.target))
        assert "wgmma.mma_async" in src and "cp.async.bulk.tensor" in src  # K = 147: TMA zero-fills the last box
        spills.append(compile_cubin(src, H100.target).spill_bytes)
    assert 0 in spills


def test_a_one_layer_stem_returns_its_gemm_as_a_view_not_a_copy():
    """The stem as a whole model returns the GEMM's ``[N*P*Q, K]`` result reshaped to NHWC: a view
    (``output_reshape_views``), where TVM alone copies it (47 us of 108 on an H100)."""
    model = prepare(H100.target)(for_inference(conv_module((2, 32, 32, 3), (64, 7, 7, 3), stride=2, pad=3),
                                               layout="NHWC"))

    def reshape_kernels(mod):
        found = []

        def visit(expr):
            if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
                if relax.analysis.has_reshape_pattern(mod[expr.args[0]]):
                    found.append(expr.args[0].name_hint)

        relax.analysis.post_order_visit(mod["main"], visit)
        return found

    assert reshape_kernels(relax.transform.RewriteDataflowReshape()(model))  # the copy TVM keeps
    viewed = relax.transform.RewriteDataflowReshape()(output_reshape_views()(model))
    assert not reshape_kernels(viewed)
    assert "R.reshape" in viewed["main"].script()


@pytest.mark.parametrize(
    "case, expected",
    [
        (dict(data_shape=(1, 7, 7, 960), weight_shape=(320, 1, 1, 960)), True),  # MobileNetV2's last block
        (dict(data_shape=(2, 13, 11, 24), weight_shape=(40, 1, 1, 24)), True),
        (dict(data_shape=(1, 14, 14, 64), weight_shape=(64, 1, 1, 64), stride=2), False),  # a downsample
        (dict(data_shape=(1, 14, 14, 64), weight_shape=(64, 1, 1, 64), pad=1), False),
        (dict(data_shape=(1, 14, 14, 64), weight_shape=(64, 3, 3, 64), pad=1), False),
        (dict(data_shape=(1, 14, 14, 64), weight_shape=(64, 1, 1, 1), groups=64), False),  # depthwise
        (dict(data_shape=(1, 14, 14, 64), weight_shape=(64, 1, 1, 64), dtype="float32"), False),
        (dict(data_shape=(1, 64, 14, 14), weight_shape=(64, 64, 1, 1), layout=("NCHW", "OIHW")), False),
    ],
)
def test_which_convolutions_are_pointwise_gemms(case, expected):
    (conv,) = convs_of(conv_module(**case))
    assert pointwise(conv) is expected
    assert (len(convs_of(pointwise_convs()(conv_module(**case)))) == 0) is expected


def test_the_pointwise_gemm_computes_the_convolution_and_takes_a_tensor_core_policy():
    mod = conv_module((2, 13, 11, 24), (40, 1, 1, 24))
    rewritten = pointwise_convs()(mod)
    rng = np.random.default_rng(0)
    data, weight = rng.standard_normal((2, 13, 11, 24)).astype("float16"), rng.standard_normal((40, 1, 1, 24)).astype("float16")
    expected = run_on_cpu(mod, data, weight)
    got = run_on_cpu(rewritten, data, weight)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=1e-2, atol=1e-2)

    (func,) = [f for f in prim_funcs(prepare(H100.target)(rewritten)).values() if "matmul" in f.script()]
    assert next(candidate_sets(func, H100, 4)).policy == "TensorCorePolicy"
