"""CUDA-core matmul template on a grouped convolution whose tiles do not divide its axes (no GPU,
no nvcc: the CUDA source only).

RegNet's grouped 3x3 convolutions (16 channels a group) are no einsum, so the template splits
their loops with a predicate instead of padding them. Unrolled, that bound test used to guard
every multiply-add of the micro tile: 227 K characters of CUDA for this config. It is now tested
once around each unrolled micro tile.
"""

import re

import numpy as np
import pytest
import tvm
from gpu_util import relative_error, run
from tvm import te, tirx

from fastdlight.arch import CUDA, auto_arch
from fastdlight.compiler import build_task
from fastdlight.compiler.compile import PASS_CONFIG, build, cuda_source, tir_pipeline
from fastdlight.config import Config

H100 = "nvidia/nvidia-h100"


def grouped_conv(hw=7, channels=784, group=16, r=3) -> tirx.PrimFunc:
    """NHWC grouped convolution, OHWI weights, fp16 in, fp32 sums, stride 1, padding 1: RegNet
    Y-800MF's last stage as Relax's legalization writes it."""
    data = te.placeholder((1, hw, hw, channels), "float16", name="data")
    weight = te.placeholder((channels, r, r, group), "float16", name="weight")
    pad = te.compute(
        (1, hw + 2, hw + 2, channels),
        lambda n, h, w, c: tirx.if_then_else(
            tirx.all(h >= 1, h <= hw, w >= 1, w <= hw), data[n, h - 1, w - 1, c], tirx.const(0, "float16")),
        name="pad_temp")
    ry, rx, rc = te.reduce_axis((0, r), "ry"), te.reduce_axis((0, r), "rx"), te.reduce_axis((0, group), "rc")
    conv = te.compute(
        (1, hw, hw, channels),
        lambda n, y, x, f: te.sum(
            pad[n, y + ry, x + rx, f // group * group + rc].astype("float32")
            * weight[f, ry, rx, rc].astype("float32"), axis=[ry, rx, rc]),
        name="group_conv2d_nhwc")
    return te.create_prim_func([data, weight, conv]).with_attr("global_symbol", "main")


def cuda_of(func, config: Config) -> str:
    arch = CUDA(H100)
    with arch.target:
        mod = build_task.as_module(build_task.apply_template(func, config))
    with arch.target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
        return cuda_source(tvm.compile(mod, target=arch.target, tir_pipeline=tir_pipeline(mod)))


#: the policy's configs for it: tiles of 2 or 4 rows of 7, 128 of 784 channels, 2 of 3 taps
CONFIGS = (
    Config("matmul", block=(2, 7, 128), thread=(1, 1, 8), rstep=(1, 2, 16), pipeline_stages=2),
    Config("matmul", block=(4, 7, 32), thread=(1, 1, 4), rstep=(1, 2, 16)),
)


def test_the_bound_test_of_a_predicated_split_is_not_repeated_on_every_multiply_add():
    func = grouped_conv()
    for config in CONFIGS:
        src = cuda_of(func, config)
        lines = [ln.strip() for ln in src.splitlines() if ln.strip()]
        fmas = [i for i, ln in enumerate(lines) if re.match(r"group_conv2d_nhwc_local_ptr\[\d+\] = \(group_conv2d", ln)]
        assert len(fmas) >= 128, config  # the micro tile is still unrolled
        guarded = [i for i in fmas if lines[i - 1].startswith("if (")]
        # one test per unrolled micro tile (4 or 8 multiply-adds), not one per multiply-add
        assert len(guarded) * 4 <= len(fmas), (config, len(guarded), len(fmas))
        if config.pipeline_stages == 2:
            assert len(src) < 180_000, len(src)  # 227 K characters when every one was guarded


def test_tiles_that_divide_are_scheduled_as_before():
    """No predicate, nothing to hoist: the micro tile stays one loop nest with the k steps."""
    func = grouped_conv(hw=14, channels=320)
    src = cuda_of(func, Config("matmul", block=(2, 14, 32), thread=(1, 1, 4), rstep=(1, 1, 16)))
    assert not re.search(r"if \([^\n]*\n\s*group_conv2d_nhwc_local_ptr\[\d+\] = \(", src)


def grouped_conv_reference(data, weight, group=16):
    """float64 NHWC grouped convolution, padding 1 (the function above)."""
    n, hw, _, channels = data.shape
    r = weight.shape[1]
    padded = np.pad(data.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((n, hw, hw, channels))
    for f in range(channels):
        first = f // group * group
        for ry in range(r):
            for rx in range(r):
                window = padded[:, ry:ry + hw, rx:rx + hw, first:first + group]
                out[..., f] += window @ weight[f, ry, rx].astype(np.float64)
    return out


@pytest.mark.gpu
def test_the_hoisted_bound_test_computes_the_convolution_on_the_gpu():
    """Every element written (the output is NaN-poisoned), each the float64 convolution's,
    under both configs."""
    target = auto_arch().target
    func = grouped_conv()
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, (1, 7, 7, 784)).astype("float16"), rng.uniform(-1, 1, (784, 3, 3, 16)).astype("float16")]
    ref = grouped_conv_reference(*inputs)
    for config in CONFIGS:
        with target:
            mod = build_task.as_module(build_task.apply_template(func, config))
        err = relative_error(run(build(mod, target), func, inputs), ref)
        assert err <= 1e-5, (config, err)
