"""Tensor-core matmul on the GPU: the policy's top-5 configs all give correct results, and so
do split-K configs (decode shapes, an epilogue, padded slices, batches, a deep convolution).

Each case builds the top configs of TensorCorePolicy for the live GPU with the tensor-core
template only (no fallback), in parallel worker processes, then runs every one on random inputs
with NaN/sentinel-poisoned outputs and compares with the float64 numpy reference: relative norm
error within ``fastdlight.measure.timing.tolerance`` (1e-2-scale for fp16 inputs), exact for int8.
"""

import pytest

from fastdlight import ops
from fastdlight.arch import auto_arch
from fastdlight.config import Config
from fastdlight.policies.tensorcore import TensorCorePolicy, get_tensorized_func_and_tags
from fastdlight.schedules.matmul_tensorcore import apply_tensorcore
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

TOPK = 5


def bias_relu_cast(m, n, k):
    op = ops.matmul_bias_relu(m, n, k)
    return op.func, op.reference


def conv_case(*args):
    op = ops.conv2d_nhwc(*args)
    return op.func, op.reference


def op_case(*args, **kw):
    op = ops.matmul(*args, **kw)
    return op.func, op.reference


CASES = {
    "fp16_fp32_NN": lambda: op_case(1024, 1024, 1024, "float16", "float32", "NN"),
    "fp16_fp32_NT": lambda: op_case(1024, 2048, 1024, "float16", "float32", "NT"),
    "fp16_fp32_TN": lambda: op_case(2048, 1024, 512, "float16", "float32", "TN"),
    "fp16_fp32_TT": lambda: op_case(512, 512, 512, "float16", "float32", "TT"),
    "fp16_fp16_NT": lambda: op_case(1024, 1024, 512, "float16", "float16", "NT"),
    "bf16_fp32_NT": lambda: op_case(1024, 2048, 1024, "bfloat16", "float32", "NT"),
    "bf16_fp32_NT_odd_decode": lambda: op_case(16, 520, 1000, "bfloat16", "float32", "NT"),
    "int8_int32_NT": lambda: op_case(1024, 1024, 1024, "int8", "int32", "NT"),
    "int8_int32_NT_odd": lambda: op_case(1000, 520, 1000, "int8", "int32", "NT"),
    "non_divisible_1000x3000x520": lambda: op_case(1000, 3000, 520, "float16", "float32", "NN"),
    "batched_4x512x256x256": lambda: op_case(512, 256, 256, "float16", "float32", "NT", batch=4),
    "seed_512x16x512": lambda: op_case(512, 16, 512, "float16", "float32", "NN"),
    "epilogue_bias_relu_cast": lambda: bias_relu_cast(1024, 512, 256),
    # implicit GEMMs: NHWC convolutions (the input reindexed while copied to shared memory)
    "conv_nhwc_3x3": lambda: conv_case(2, 28, 28, 64, 64, 3, 3, 1, 1),
    "conv_nhwc_1x1_stride2": lambda: conv_case(4, 28, 28, 64, 128, 1, 1, 2, 0),
    "conv_nhwc_7x7_stem": lambda: conv_case(2, 32, 32, 3, 64, 7, 7, 2, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_top5_configs_correct(name):
    func, ref = CASES[name]()
    arch = auto_arch()
    tc_func, tags = get_tensorized_func_and_tags(func, arch)
    assert tags is not None, f"{name} should be tensor-core eligible on {arch.name}"
    configs = TensorCorePolicy(tc_func, arch, tags, instructions=("mma.sync",)).emit_config(TOPK)
    assert len(configs) == TOPK
    results, best = apply_and_build(
        tc_func, configs, arch, check="all", ref=ref, budget_ms=5, template=apply_tensorcore, progress=False
    )
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if r.error or not r.verified]
    assert not bad, f"{name}: " + "; ".join(bad)
    assert best.latency_ms > 0


def _split(block, warp, rstep, split_k, stages=3):
    return Config("matmul_tc", block=block, warp=warp, rstep=(rstep,), pipeline_stages=stages, use_async_copy=True,
                  split_k=split_k)


#: split-K: the partial sums of each K slice added by a second kernel that runs the epilogue
SPLIT_CASES = {
    "decode_16x1024x4096_split4": (lambda: op_case(16, 1024, 4096, "float16", "float32", "NT"),
                                   _split((16, 64), (16, 32), 64, 4, stages=4)),
    "bf16_decode_16x512x2048_split8": (lambda: op_case(16, 512, 2048, "bfloat16", "float32", "NT"),
                                       _split((16, 128), (16, 64), 64, 8)),
    "bias_relu_cast_split2": (lambda: bias_relu_cast(256, 512, 1024), _split((64, 64), (32, 32), 32, 2)),
    "padded_slices_64x256x1000_split2": (lambda: op_case(64, 256, 1000, "float16", "float32", "NT"),
                                         _split((64, 64), (32, 32), 64, 2)),
    "batched_3x64x128x512_NN_split2": (lambda: op_case(64, 128, 512, "float16", "float32", "NN", batch=3),
                                       _split((64, 64), (32, 32), 32, 2)),
    "conv_nhwc_3x3_512ch_split4": (lambda: conv_case(2, 7, 7, 512, 512, 3, 3, 1, 1), _split((64, 128), (32, 64), 64, 4)),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_k_correct(name):
    make, config = SPLIT_CASES[name]
    func, ref = make()
    results, best = apply_and_build(
        func, [config], auto_arch(), check="all", ref=ref, budget_ms=5, template=apply_tensorcore, progress=False
    )
    (r,) = results
    assert not r.error and r.verified, f"{name}: {r.error or r.check_message}"
