"""CUDA-core matmul template (kind "matmul"): schedules compile to real cubins, no GPU needed.

Each case is compiled with nvcc (``compile_mod_to_cubin``); a sample runs for both H100 and
A100 so the sm_80 cp.async path is covered too. The no-spill checks hold for nvcc's code: NVRTC
(the tuner's compiler where it is installed) keeps shared-memory addresses in 64-bit registers,
and ptxas then spills 12 bytes in two of these configs (the tuner times what NVRTC builds).
"""

import pathlib
import re

import pytest
import tvm
from tvm import s_tir, te, tirx

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import COMPILER_ENV, compile_mod_to_cubin
from fastdlight.config import Config
from fastdlight.policies.select import candidate_sets
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.schedules import dispatch_config
from fastdlight.schedules.base import reverse_compute_inline
from fastdlight.schedules.matmul import MatmulTemplate

H100, A100 = "nvidia/nvidia-h100", "nvidia/nvidia-a100"


@pytest.fixture(autouse=True)
def _nvcc(monkeypatch):
    monkeypatch.setenv(COMPILER_ENV, "nvcc")


def mm(**kw) -> Config:
    return Config("matmul", **kw)


def stack_bytes(cubin) -> int:
    """Local-memory stack of the kernel: register arrays indexed dynamically end up there."""
    return sum(int(x) for x in re.findall(r"(\d+) bytes stack frame", cubin.log))


#: the main fp32 GEMM configs (128x128 / 8x8 micro tile): must not spill
BIG = dict(block=(128, 128), thread=(8, 8), vectorize={"A": 4, "B": 4})

CASES = {
    # name: (op builder, config, targets)
    "nn_fp32_plain": (lambda: ops.matmul(1024, 1024, 1024, "float32"), mm(**BIG, rstep=(8,)), (H100,)),
    "nn_fp32_staged": (
        lambda: ops.matmul(1024, 1024, 1024, "float32"),
        mm(**BIG, rstep=(16,), pipeline_stages=2),
        (H100, A100),
    ),
    "nn_fp32_async": (
        lambda: ops.matmul(1024, 1024, 1024, "float32"),
        mm(**BIG, rstep=(8,), pipeline_stages=2, use_async_copy=True),
        (H100, A100),
    ),
    "nt_fp32": (
        lambda: ops.matmul(512, 512, 512, "float32", layout="NT"),
        mm(block=(64, 64), thread=(4, 4), rstep=(16,), vectorize={"A": 4, "B": 4}, pipeline_stages=2),
        (H100,),
    ),
    "tn_fp32": (
        lambda: ops.matmul(512, 512, 512, "float32", layout="TN"),
        mm(block=(128, 64), thread=(8, 4), rstep=(8,), vectorize={"A": 4, "B": 4}),
        (H100,),
    ),
    "batch_fp16": (
        lambda: ops.matmul(256, 256, 128, "float16", batch=4),
        mm(block=(1, 64, 64), thread=(1, 4, 4), rstep=(32,), vectorize={"A": 8, "B": 8}),
        (H100,),
    ),
    "fp16_in_fp32_out": (
        lambda: ops.matmul(256, 256, 128, "float16", "float32"),
        mm(block=(64, 64), thread=(8, 8), rstep=(16,), vectorize={"A": 8, "B": 8}),
        (H100,),
    ),
    # SiLU-gated epilogue in fp32 on fp16 outputs: its vectors stay within 16 bytes (an 8-lane
    # fp32 constant came out as make_ulonglong4 with eight arguments)
    "gated_fp16": (
        lambda: ops.matmul_gated(256, 512, 128),
        mm(block=(128, 64), thread=(8, 8), rstep=(16,), vectorize={"A": 8, "B": 8}, pipeline_stages=2),
        (H100,),
    ),
    "conv_fp32": (
        lambda: ops.conv2d_nhwc(2, 28, 28, 64, 64, dtype="float32"),
        mm(block=(1, 4, 8, 64), thread=(1, 1, 2, 8), rstep=(1, 1, 16), vectorize={"data": 4, "W": 4}, pipeline_stages=2),
        (H100,),
    ),
    "conv_stride2_fp16": (
        lambda: ops.conv2d_nhwc(1, 56, 56, 32, 64, stride=2, dtype="float16"),
        mm(block=(4, 8, 64), thread=(1, 2, 8), rstep=(1, 3, 8), vectorize={"data": 8, "W": 8}),
        (H100,),
    ),
    "nondivisible_fp32": (
        lambda: ops.matmul(1000, 3000, 520, "float32"),
        mm(**BIG, rstep=(16,), pipeline_stages=2, use_async_copy=True),
        (H100,),
    ),
    "odd_4095_fp32": (
        lambda: ops.matmul(4095, 4095, 4095, "float32"),
        mm(**BIG, rstep=(8,), pipeline_stages=2),
        (H100,),
    ),
    "conv_nondivisible_fp32": (
        lambda: ops.conv2d_nhwc(1, 7, 7, 20, 24, dtype="float32"),
        mm(block=(4, 4, 16), thread=(1, 2, 4), rstep=(1, 3, 8), vectorize={"data": 4, "W": 4}),
        (H100,),
    ),
}

PARAMS = [(name, target) for name, (_, _, targets) in CASES.items() for target in targets]


@pytest.mark.parametrize("name,target", PARAMS, ids=[f"{n}-{t.split('-')[-1]}" for n, t in PARAMS])
def test_compiles_to_cubin(name, target):
    build_op, config, _ = CASES[name]
    op = build_op()
    sch = MatmulTemplate().apply_config(op.func, config)
    assert sch is not None
    src, cubin = compile_mod_to_cubin(sch.mod, target)
    assert cubin.binary and cubin.registers > 0
    assert f"__launch_bounds__({config.num_threads})" in src
    assert cubin.spill_bytes == 0, f"{name}: {cubin.spill_bytes} bytes spilled\n{cubin.log[-800:]}"
    assert stack_bytes(cubin) == 0, f"{name}: local arrays in local memory\n{cubin.log[-800:]}"
    if config.pipeline_stages > 1 and config.use_async_copy:
        assert "cp.async" in src  # double buffering really uses cp.async
    if name.startswith("nondivisible"):
        # padded to whole tiles (pad_einsum): zero-filled loads and guarded stores
        assert "A_pad_shared" in src and "C_pad_local" in src and "if (" in src
    if config.block == (128, 128):
        # the main GEMM reads its register fragments with 16-byte shared loads
        assert "*(float4*)(" in src


def test_rasterization_walks_panels_of_block_rows():
    op = ops.matmul(1024, 1024, 1024, "float32")
    sch = MatmulTemplate().apply_config(op.func, mm(**BIG, rstep=(8,), rasterization=4))
    src, cubin = compile_mod_to_cubin(sch.mod, H100)
    assert cubin.spill_bytes == 0
    # 8 x 8 blocks in panels of 4 rows: the row block is (bx >> 5) * 4 + (bx & 3)
    assert "(((int)blockIdx.x) & 3)" in src and "(((int)blockIdx.x) >> 5)" in src


def test_main_gemm_fits_registers_and_static_smem():
    op = ops.matmul(1024, 1024, 1024, "float32")
    sch = MatmulTemplate().apply_config(op.func, mm(**BIG, rstep=(8,)))
    _, cubin = compile_mod_to_cubin(sch.mod, H100)
    # 64 accumulators + 2 x 8 fragment values + addressing: two blocks of 256 threads per SM
    assert cubin.registers <= 128
    assert 0 < cubin.shared_bytes <= 48 * 1024


def matmul_with_epilogue(epilogue):
    """A 256^3 fp16 matmul summed in fp32 (``C``) and ``D = epilogue(C, bias)`` (fp16), as a
    PrimFunc of A, B, bias and D."""
    m = n = k = 256
    A = te.placeholder((m, k), "float16", name="A")
    B = te.placeholder((k, n), "float16", name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[r, j].astype("float32"), axis=r), name="C")
    return te.create_prim_func([A, B, bias, epilogue(C, bias)])


def fused_kernels(func):
    """``func`` under a CUDA-core matmul config: its CUDA source, cubin and kernel names."""
    sch = MatmulTemplate().apply_config(func, mm(block=(64, 64), thread=(4, 4), rstep=(16,), vectorize={"A": 8}))
    assert sch is not None
    src, cubin = compile_mod_to_cubin(sch.mod, H100)
    return src, cubin, set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src))


def test_epilogue_is_fused_into_the_store():
    def relu(C, bias):
        return te.compute(C.shape, lambda i, j: tirx.max(C[i, j] + bias[j], tirx.const(0, "float32")).astype(
            "float16"), name="D")

    src, cubin, kernels = fused_kernels(matmul_with_epilogue(relu))
    assert cubin.spill_bytes == 0
    assert len(kernels) == 1, kernels  # bias + relu + cast run in the matmul kernel
    assert "C_ptr" not in src  # the fp32 intermediate never reaches global memory


def test_an_epilogue_that_reads_the_tile_twice_is_fused_and_lowers():
    """SiLU, x * sigmoid(x) (EfficientNet's, and GELU's x * erf(x) in Whisper): the biased value
    has two readers. Inlining the first reader into the tile dropped the value the second one
    reads ("T_add is used before its definition" at lowering), so these convolutions fell back
    to stock Dlight; the steps in between are inlined into their readers first."""

    def silu(C, bias):
        T_add = te.compute(C.shape, lambda i, j: C[i, j] + bias[j], name="T_add")
        sig = te.compute(C.shape, lambda i, j: tirx.sigmoid(T_add[i, j]), name="sig")
        return te.compute(C.shape, lambda i, j: (T_add[i, j] * sig[i, j]).astype("float16"), name="D")

    src, cubin, kernels = fused_kernels(matmul_with_epilogue(silu))
    assert len(kernels) == 1 and cubin.spill_bytes == 0, kernels
    assert "T_add_ptr" not in src and "C_ptr" not in src


def test_reverse_compute_inline_is_refused_where_another_block_reads_the_value():
    """TVM 0.27's reverse_compute_inline inlines B into A although C reads A's output too,
    leaving C reading a buffer nothing writes; base.reverse_compute_inline refuses instead."""
    a = te.placeholder((16,), "float32", name="a")
    x = te.compute((16,), lambda i: a[i] + 1.0, name="x")
    y = te.compute((16,), lambda i: x[i] * 2.0, name="y")
    z = te.compute((16,), lambda i: x[i] * y[i], name="z")
    sch = s_tir.Schedule(te.create_prim_func([a, z]))
    with pytest.raises(ValueError, match="read by another block"):
        reverse_compute_inline(sch, sch.get_sblock("y"))
    sch.compute_inline(sch.get_sblock("y"))  # the legal order: y into z, then z into x
    reverse_compute_inline(sch, sch.get_sblock("z"))
    assert str(sch.get(sch.get_sblock("x")).writes[0].source.name) == "z"


def test_wrong_family_returns_none():
    template = MatmulTemplate()
    add = ops.elementwise((1024, 1024), "float32", "add")
    assert template.apply_config(add.func, mm(block=(32, 32), thread=(1, 4), rstep=())) is None
    red = ops.reduce((1024, 1024), "float32", "sum")
    assert template.apply_config(red.func, mm(block=(32,), thread=(1,), rstep=(32,))) is None


def test_other_kind_or_rank_returns_none():
    op = ops.matmul(256, 256, 256, "float32")
    template = MatmulTemplate()
    assert template.apply_config(op.func, Config("reduction", block=(32, 32), thread=(4, 4), rstep=(8,))) is None
    # a batch config (three spatial axes) does not fit a plain matmul
    assert template.apply_config(op.func, mm(block=(1, 32, 32), thread=(1, 4, 4), rstep=(8,))) is None


def test_uses_dynamic_shared_memory_beyond_48k():
    op = ops.matmul(1024, 1024, 1024, "float32")
    config = mm(**BIG, rstep=(16,), pipeline_stages=3, use_async_copy=True)  # 3 x 33 KB
    sch = MatmulTemplate().apply_config(op.func, config)
    assert "shared.dyn" in sch.mod.script()


def test_default_policy_configs_schedule_and_compile():
    default = pytest.importorskip("fastdlight.policies.default")

    arch = CUDA(H100)
    for op, topk in ((ops.matmul(1024, 1024, 1024, "float32"), 2), (ops.conv2d_nhwc(8, 28, 28, 64, 64, dtype="float32"), 1)):
        configs = [c for c in default.DefaultPolicy(op.func, arch).emit_config(topk) if c.kind == "matmul"]
        assert configs, f"DefaultPolicy emitted no matmul config for {op.name}"
        for config in configs:
            sch = MatmulTemplate().apply_config(op.func, config)
            assert sch is not None, config
            _, cubin = compile_mod_to_cubin(sch.mod, H100)
            assert cubin.spill_bytes == 0 and stack_bytes(cubin) == 0, config


def test_an_nchw_resnet_layer_with_batch_norm_schedules_on_cuda_cores():
    """ResNet-18's NCHW layer as FuseOps leaves it (batch norm parameters broadcast with
    expand_dims inside the function): the epilogue's other producers move with it, so the
    CUDA-core template schedules it instead of the fallback."""
    arch = CUDA(H100)
    fixture = pathlib.Path(__file__).parents[1] / "relax" / "fixtures" / "resnet18_nchw_b16.py"
    funcs = prim_funcs(prepare(arch.target)(for_inference(tvm.script.from_source(fixture.read_text()), layout=None)))
    name = next(n for n in sorted(funcs) if n.startswith("fused_conv2d") and "expand_dims" in n and "relu" in n)
    func = funcs[name].with_attr("global_symbol", "conv")
    config = next(c for s in candidate_sets(func, arch, 4) for c in s.configs if c.kind == "matmul")
    with arch.target:
        result = dispatch_config(func, config, allow_fallback=False)
    assert result.template == "matmul"
    _, cubin = compile_mod_to_cubin(result.schedule.mod, H100)
    assert cubin.spill_bytes == 0
