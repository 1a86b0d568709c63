"""Tensor-core matmul on the GPU: the policy's top-5 configs all give correct results.

Each case builds the top configs of TensorCorePolicy for the live GPU with the tensor-core
template only (no fallback), in parallel worker processes, then runs every one on random inputs
with NaN/sentinel-poisoned outputs and compares with the float64 numpy reference: relative norm
error within ``fastdlight.tune.measure.tolerance`` (1e-2-scale for fp16 inputs), exact for int8.
"""

import pytest

from fastdlight import ops
from fastdlight.arch import auto_arch
from fastdlight.policies.tensorcore import TensorCorePolicy, get_tensorized_func_and_tags
from fastdlight.schedules.matmul_tensorcore import apply_tensorcore
from fastdlight.tune.runner import apply_and_build

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
