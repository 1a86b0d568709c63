"""The transpose template (CPU): which functions get its configs, and that they schedule through
shared memory and compile to cubin. (On the GPU: test_transpose_gpu.py.)"""

import pathlib

import pytest
import tvm
from tvm import te

from fastdlight import ops
from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.policies.transpose import transpose_configs
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.schedules import dispatch_config

H100 = CUDA("nvidia/nvidia-h100")

#: (shape, axes, dtype, out dtype): layout changes of models and odd shapes
TRANSPOSES = [
    ((16, 64, 56, 56), (0, 2, 3, 1), "float16", "float16"),  # NCHW -> NHWC (a ResNet layer)
    ((16, 28, 28, 128), (0, 3, 1, 2), "float16", "float16"),  # NHWC -> NCHW
    ((1000, 300), (1, 0), "float32", "float32"),  # no tile divides the extents
    ((2, 64, 30, 7), (0, 2, 3, 1), "float32", "float16"),  # with a cast; 7 columns: a thin tile
]


@pytest.mark.parametrize("shape, axes, dtype, out", TRANSPOSES)
def test_layout_changes_get_transpose_configs_first(shape, axes, dtype, out):
    func = ops.transpose(shape, axes, dtype, out).func
    configs = transpose_configs(analyze(func), H100, 6)
    assert configs and all(c.kind == "transpose" for c in configs)
    a = axes.index(len(shape) - 1)  # the output axis the input's innermost one became
    for c in configs:
        assert c.block[a] > 1 and c.block[-1] > 1, c  # the tile spans both innermost axes
        assert c.num_threads % 32 == 0 and c.num_threads <= 1024
    (first, *_) = candidate_sets(func, H100, 20)
    assert first.configs[0].kind == "transpose"
    assert len(first.configs) <= 20


@pytest.mark.parametrize("shape, axes", [((4, 512, 16, 128), (0, 2, 1, 3)), ((64, 64), (0, 1)), ((3, 5, 64), (2, 1, 0))])
def test_no_transpose_configs_where_the_innermost_axis_stays_or_is_too_small(shape, axes):
    """A head permutation keeps the innermost axis (already coalesced); a 3-element innermost
    output axis leaves no tile a warp could write."""
    func = ops.transpose(shape, axes).func
    if axes == (2, 1, 0):
        func = ops.transpose((64, 5, 3), axes).func
    assert transpose_configs(analyze(func), H100, 6) == []


def test_a_small_transposed_operand_is_no_layout_change():
    x = te.placeholder((256, 512), "float16", name="x")
    bias = te.placeholder((512, 1), "float16", name="bias")  # read as bias[j, 0]: moves with j, but tiny
    y = te.compute((256, 512), lambda i, j: x[i, j] + bias[j, 0], name="y")
    func = te.create_prim_func([x, bias, y])
    assert transpose_configs(analyze(func), H100, 6) == []


@pytest.mark.parametrize("shape, axes, dtype, out", TRANSPOSES)
def test_transpose_configs_stage_through_shared_memory_and_compile(shape, axes, dtype, out):
    func = ops.transpose(shape, axes, dtype, out).func
    for config in transpose_configs(analyze(func), H100, 6)[:2]:
        with H100.target:
            result = dispatch_config(func, config, allow_fallback=False)
        assert result.template == "transpose"
        src = cuda_source(build(result.schedule.mod, H100.target))
        assert "__shared__" in src and "__syncthreads" in src
        cubin = compile_cubin(src, H100.target)
        assert cubin.spill_bytes == 0 and cubin.registers > 0


def test_attentions_key_transpose_with_a_reshape_folded_in_is_a_transpose():
    """decoder_ln's K^T (a slice of QKV, heads folded into the batch by a reshape: the read's
    outer indices are not affine, its innermost one is the head dimension) gets staged tiles."""
    fixture = pathlib.Path(__file__).parents[1] / "relax" / "fixtures" / "decoder_ln.py"
    # prepared for an A100 with its attention unfused: where the target has wgmma the matmuls
    # read Q, K and V in place, and a fused attention reads them itself
    a100 = CUDA("nvidia/nvidia-a100")
    model = for_inference(tvm.script.from_source(fixture.read_text()))
    funcs = prim_funcs(prepare(a100.target, fuse_attention=False)(model))
    name = next(n for n in funcs if n.startswith("fused_strided_slice") and n.count("transpose") == 2)
    func = funcs[name].with_attr("global_symbol", "key_t")
    info = analyze(func)
    assert info.reads[0].linear is None  # the reshape's div/mod
    configs = transpose_configs(info, H100, 6)
    assert configs
    with H100.target:
        result = dispatch_config(func, configs[0], allow_fallback=False)
    src = cuda_source(build(result.schedule.mod, H100.target))
    assert "__shared__" in src and compile_cubin(src, H100.target).spill_bytes == 0
    others = [n for n in funcs if n.startswith("fused_strided_slice") and n.count("transpose") == 1]
    assert others and all(not transpose_configs(analyze(funcs[n]), H100, 6) for n in others)  # Q, V: rows kept
