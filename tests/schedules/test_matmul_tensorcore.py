"""Tensor-core matmul template, CPU only: the policy's configs schedule, lower and compile to a
real cubin (nvcc) for sm_80 and sm_90a, and the CUDA source uses ldmatrix + mma.sync (+ cp.async
when pipelined), with fragments in registers (no local-memory stack frame, no spills)."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from tvm import te, topi

from fastdlight import ops
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.config import Config
from fastdlight.policies.tensorcore import TensorCorePolicy, get_tensorized_func_and_tags
from fastdlight.schedules.matmul_tensorcore import TensorCoreMatmulTemplate, register_intrinsics

H100, A100 = "nvidia/nvidia-h100", "nvidia/nvidia-a100"
TEMPLATE = TensorCoreMatmulTemplate()


@pytest.fixture(scope="module", autouse=True)
def _intrinsics():
    register_intrinsics()  # ~20 s, once for the module


def tc(**kw) -> Config:
    kw.setdefault("pipeline_stages", 3)
    kw.setdefault("use_async_copy", kw["pipeline_stages"] > 1)
    return Config("matmul_tc", **kw)


def bias_relu_cast(m, n, k):
    """C = A·Bᵀ in fp32, D = fp16(relu(C + bias)) — an epilogue the template must fuse."""
    return ops.matmul_bias_relu(m, n, k).func


def compile_all(jobs):
    """jobs: [(func, config, target)] -> [(source, cubin)]; nvcc runs two at a time."""
    sources = []
    for func, config, target in jobs:
        sch = TEMPLATE.apply_config(func, config)
        assert sch is not None, f"template refused {config}"
        sources.append((cuda_source(build(sch.mod, target)), target))
    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda st: compile_cubin(*st), sources))
    return [(src, cub) for (src, _), cub in zip(sources, cubins)]


def check_kernel(src, cubin, config, name=""):
    assert "mma.sync" in src and "ldmatrix" in src, name
    if config.pipeline_stages > 1 and config.use_async_copy:
        assert "cp.async" in src, name
    assert cubin.spill_bytes == 0, f"{name}: {cubin.spill_bytes} spill bytes"
    stack = [int(x) for x in re.findall(r"(\d+) bytes stack frame", cubin.log)]
    assert max(stack, default=0) == 0, f"{name}: fragments in local memory ({stack} bytes stack)"
    assert 0 < cubin.registers <= 255


@pytest.mark.parametrize("target", [H100, A100])
def test_policy_top10_fp16_4096_nt_compiles(target):
    op = ops.matmul(4096, 4096, 4096, "float16", "float32", "NT")
    func, tags = get_tensorized_func_and_tags(op.func, target)
    configs = TensorCorePolicy(func, target, tags, instructions=("mma.sync",)).emit_config(10)
    assert len(configs) == 10
    for config, (src, cubin) in zip(configs, compile_all([(func, c, target) for c in configs])):
        check_kernel(src, cubin, config, repr(config))
        assert "extern __shared__" in src  # dynamic shared memory (above 48 KB needs opt-in)
        if config.rasterization:
            assert "blockIdx.x" in src


CASES = {
    # name: (func builder, config, targets)
    "nn_fp32": (lambda: ops.matmul(1024, 1024, 1024, "float16", "float32", "NN").func,
                tc(block=(128, 256), warp=(64, 64), rstep=(32,)), (H100, A100)),
    "tn_fp32": (lambda: ops.matmul(1024, 1024, 1024, "float16", "float32", "TN").func,
                tc(block=(256, 128), warp=(64, 64), rstep=(32,), pipeline_stages=4), (H100,)),
    "tt_fp16acc": (lambda: ops.matmul(1024, 512, 256, "float16", "float16", "TT").func,
                   tc(block=(128, 128), warp=(64, 64), rstep=(64,)), (H100,)),
    "nt_fp16acc_k16": (lambda: ops.matmul(512, 512, 512, "float16", "float16", "NT").func,
                       tc(block=(64, 64), warp=(32, 32), rstep=(16,), pipeline_stages=2), (A100,)),
    "int8_nt": (lambda: ops.matmul(1024, 1024, 1024, "int8", "int32", "NT").func,
                tc(block=(128, 128), warp=(64, 64), rstep=(64,)), (H100, A100)),
    "int8_nt_padded": (lambda: ops.matmul(1000, 520, 1000, "int8", "int32", "NT").func,
                       tc(block=(64, 128), warp=(32, 64), rstep=(128,), pipeline_stages=2), (A100,)),
    "batched_nt": (lambda: ops.matmul(512, 256, 128, "float16", "float32", "NT", batch=4).func,
                   tc(block=(64, 128), warp=(32, 64), rstep=(32,), pipeline_stages=2), (H100,)),
    "non_divisible_nn": (lambda: ops.matmul(1000, 3000, 520, "float16", "float32", "NN").func,
                         tc(block=(128, 128), warp=(64, 64), rstep=(32,)), (H100, A100)),
    "small_n16": (lambda: ops.matmul(512, 16, 512, "float16", "float32", "NN").func,
                  tc(block=(32, 16), warp=(16, 16), rstep=(64,), pipeline_stages=4), (H100,)),
    "raster_no_pipeline": (lambda: ops.matmul(2048, 2048, 256, "float16", "float32", "NT").func,
                           tc(block=(128, 128), warp=(64, 32), rstep=(32,), pipeline_stages=1, rasterization=4), (A100,)),
    # bf16: ldmatrix + mma.sync.m16n8k16.bf16 (intrinsics the template registers), NT only
    "bf16_nt": (lambda: ops.matmul(1024, 1024, 1024, "bfloat16", "float32", "NT").func,
                tc(block=(128, 128), warp=(64, 64), rstep=(32,)), (H100, A100)),
    "bf16_nt_padded": (lambda: ops.matmul(1000, 520, 264, "bfloat16", "float32", "NT").func,
                       tc(block=(64, 128), warp=(32, 64), rstep=(32,), pipeline_stages=2), (A100,)),
    "bf16_nt_batched": (lambda: ops.matmul(512, 256, 128, "bfloat16", "float32", "NT", batch=4).func,
                        tc(block=(64, 128), warp=(32, 64), rstep=(32,), pipeline_stages=2), (H100,)),
    "epilogue_bias_relu": (lambda: bias_relu_cast(1024, 1024, 512),
                           tc(block=(128, 128), warp=(64, 64), rstep=(32,)), (H100,)),
}  # fmt: skip


def test_layouts_dtypes_batch_padding_epilogue_compile():
    jobs, names = [], []
    for name, (make, config, targets) in CASES.items():
        func = make()
        for target in targets:
            jobs.append((func, config, target))
            names.append(f"{name}@{target}")
    for (func, config, _), name, (src, cubin) in zip(jobs, names, compile_all(jobs)):
        check_kernel(src, cubin, config, name)
        kernels = re.findall(r"__global__[^;{]*\{", src)
        assert len(kernels) == 1, f"{name}: the matmul and its epilogue must be one kernel"
        if name.startswith("non_divisible"):
            assert "pred" in src  # zero-filled predicated cp.async for the padded edges
        if name.startswith("epilogue"):
            assert "bias_ptr" in src and "max(" in src.replace("fmaxf(", "max(")
        if name.startswith("int8_nt"):
            assert "m16n8k32" in src and ".s8.s8.s32" in src
        if name.startswith("bf16"):
            assert "m16n8k16" in src and ".bf16.bf16.f32" in src and ".f16.f16" not in src
            assert src.count("ldmatrix.sync") >= 2 and "* 0 * 16" not in src  # the instruction, not a loop


def test_refuses_what_it_cannot_build():
    op = ops.matmul(256, 256, 256, "float16", "float32", "NT")
    good = tc(block=(64, 64), warp=(32, 32), rstep=(32,))
    assert TEMPLATE.apply_config(op.func, good) is not None
    # wrong kind, warp tile not a multiple of 16, K step not a multiple of the MMA k
    assert TEMPLATE.apply_config(op.func, Config("matmul", block=(64, 64), thread=(4, 4), rstep=(16,))) is None
    assert TEMPLATE.apply_config(op.func, tc(block=(64, 64), warp=(8, 64), rstep=(32,))) is None
    assert TEMPLATE.apply_config(op.func, tc(block=(64, 64), warp=(32, 32), rstep=(24,))) is None
    int8 = ops.matmul(256, 256, 256, "int8", "int32", "NT")
    assert TEMPLATE.apply_config(int8.func, tc(block=(64, 64), warp=(32, 32), rstep=(16,))) is None
    # int8 needs K-inner A and B (TVM's int8 ldmatrix); other layouts go to CUDA cores
    int8_nn = ops.matmul(256, 256, 256, "int8", "int32", "NN")
    assert TEMPLATE.apply_config(int8_nn.func, tc(block=(64, 64), warp=(32, 32), rstep=(32,))) is None
    # not a tensor-core matmul at all
    assert TEMPLATE.apply_config(ops.matmul(256, 256, 256, "float32").func, good) is None
    assert TEMPLATE.apply_config(ops.softmax(256, 256).func, good) is None
    bf16_nn = ops.matmul(256, 256, 256, "bfloat16", "float32", "NN")  # would need ldmatrix .trans
    assert TEMPLATE.apply_config(bf16_nn.func, good) is None
    assert TEMPLATE.kinds == ("matmul_tc",)


def test_nhwc_convolutions_compile_as_implicit_gemms():
    """A 3x3 conv (batch 1: a unit axis), a 1x1 stride-2 downsample and ResNet's 3-channel 7x7
    stem: the input reindexed while it is copied (predicated 16-byte cp.async for the padding)."""
    jobs = []
    for n, h, c, k, r, stride, pad in [(1, 28, 64, 64, 3, 1, 1), (4, 28, 64, 128, 1, 2, 0), (4, 64, 3, 64, 7, 2, 3)]:
        func = ops.conv2d_nhwc(n, h, h, c, k, r, r, stride, pad).func
        tc_func, tags = get_tensorized_func_and_tags(func, H100)
        assert tags is not None, (n, h, c, k, r)
        config = TensorCorePolicy(tc_func, H100, tags, instructions=("mma.sync",)).emit_config(1)[0]
        jobs.append((tc_func, config, H100))
    jobs.append((conv2d_nhwc_ohwi_bf16(2, 14, 64, 64), None, H100))  # bf16 as ConvertLayout(NHWC, OHWI) gives it
    _, tags = get_tensorized_func_and_tags(jobs[-1][0], H100)
    assert tags is not None and tags["layout"] == "NT"
    jobs[-1] = (jobs[-1][0], TensorCorePolicy(jobs[-1][0], H100, tags, instructions=("mma.sync",)).emit_config(1)[0], H100)
    for (_, config, _), (src, cubin) in zip(jobs, compile_all(jobs)):
        check_kernel(src, cubin, config, "conv")
    assert ".bf16.bf16.f32" in src


def conv2d_nhwc_ohwi_bf16(n, h, c, k):
    """A 3x3 stride-1 bf16 convolution with OHWI weights (fp32 accumulation, bf16 out)."""
    data = te.placeholder((n, h, h, c), "bfloat16", name="data")
    weight = te.placeholder((k, 3, 3, c), "bfloat16", name="weight")
    conv = topi.nn.conv2d(data, weight, 1, 1, 1, data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
    out = topi.cast(conv, "bfloat16")
    return te.create_prim_func([data, weight, out])


def test_split_k_compiles_to_a_partial_sum_kernel_and_an_epilogue_kernel():
    """Split-K: the matmul kernel writes fp32 partial sums per K slice (blockIdx.y = slice), a
    second kernel adds them and runs the epilogue (bias, ReLU, cast), for a GEMM with an
    epilogue and a 3x3 convolution whose input channels are sliced."""
    data = te.placeholder((2, 7, 7, 256), "float16", name="data")
    weight = te.placeholder((256, 3, 3, 256), "float16", name="weight")
    conv = topi.nn.conv2d(data, weight, 1, 1, 1, data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
    conv_func = te.create_prim_func([data, weight, topi.cast(conv, "float16")])
    jobs = [
        (bias_relu_cast(64, 512, 2048), tc(block=(64, 64), warp=(32, 32), rstep=(64,), split_k=4), H100),
        (conv_func, tc(block=(64, 128), warp=(32, 64), rstep=(64,), split_k=2), H100),
    ]
    for (_, config, _), (src, cubin) in zip(jobs, compile_all(jobs)):
        check_kernel(src, cubin, config, repr(config))
        kernels = re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src)
        assert len(set(kernels)) == 2, kernels
        assert "blockIdx.y" in src and "_rf" in src
    # a split that does not divide the sliced axis is refused, not built wrong
    assert TEMPLATE.apply_config(bias_relu_cast(64, 512, 1000), tc(block=(64, 64), warp=(32, 32), rstep=(64,), split_k=3)) is None
