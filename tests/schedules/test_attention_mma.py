"""Fused attention with mma.sync, CPU only: the configs the attention policy emits on sm_80 and
sm_89 (head dims 64 and 128, causal or not, GQA, bf16, the heads' layouts, ragged ends) compile
to cubins without spills, with cp.async copies that zero-fill past the ends, ldmatrix (transposed
for V) and m16n8k16 mma.sync; tiles the kernel cannot take get no plan."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.attention import AttentionShape, attention_func, match_attention
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.config import Config
from fastdlight.policies.attention import attention_configs, mma_attention_configs
from fastdlight.schedules import apply_config
from fastdlight.schedules.base import ScheduleError
from fastdlight.schedules.attention.mma_plan import MmaAttentionPlan
from fastdlight.schedules.attention.mma_template import mma_plan_for

A100, L4 = CUDA("nvidia/nvidia-a100"), CUDA("nvidia/nvidia-l4")

SHAPES = {
    "causal_d128_tail": (A100, AttentionShape(1, 8, 1000, 1000, 128, 8, causal=True)),
    "gqa_bf16_bottom_right": (A100, AttentionShape(2, 8, 300, 4097, 64, 2, causal=True, dtype="bfloat16")),
    "bthd_sm89": (L4, AttentionShape(2, 8, 777, 777, 128, 2, layout="bthd")),
    "packed_qkv": (A100, AttentionShape(1, 12, 500, 500, 64, 12, causal=True, layout="packed")),
    # head dims other than 64 and 128, on Hopper too (rows padded to whole swizzle groups)
    "d96_hopper": (CUDA("nvidia/nvidia-h100"), AttentionShape(1, 32, 1000, 1000, 96, 8, causal=True)),
    "d80_sm89": (L4, AttentionShape(2, 8, 333, 333, 80, 8)),
    "d160_bf16": (A100, AttentionShape(1, 8, 512, 700, 160, 8, causal=True, dtype="bfloat16")),
    # Gemma's 256: Q's fragments re-read from shared memory, O's 128 registers held
    "d256_gqa": (A100, AttentionShape(1, 8, 1000, 1000, 256, 4, causal=True)),
    # Stable Diffusion 1.5's 40 (computed over 48, the padding zeros), its cross-attention's 77 keys
    "d40_cross": (A100, AttentionShape(2, 8, 4096, 77, 40, 8)),
}


def compile_kernel(arch, func, config):
    with arch.target:
        kernel = apply_config(func, config)
    src = cuda_source(build(tvm.IRModule({"main": kernel}), arch.target))
    return src, compile_cubin(src, arch.target)


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_best_configs_compile_without_spills(name):
    arch, shape = SHAPES[name]
    func = attention_func(shape)
    configs = mma_attention_configs(shape, arch, 2)
    assert configs and all(c.kind == "attention_mma" for c in configs)
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda c: compile_kernel(arch, func, c), configs))
    t = "bf16" if shape.dtype == "bfloat16" else "f16"
    for config, (src, cubin) in zip(configs, built):
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in src
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src
        assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in src  # src-size: zeros past the ends
        assert "wgmma" not in src and "__shfl_xor_sync" in src
        assert cubin.spill_bytes == 0 and cubin.registers <= 255, (config, cubin.spill_bytes)


def test_warps_of_32_rows_share_each_fragment_and_compile_without_spills():
    """Two m16 tiles a warp: each ldmatrix of V (and of K) feeds both tiles' mma.sync, twice the
    products a load of warps of 16 rows; Q's fragments are re-read at each step instead of held."""
    shape = AttentionShape(1, 8, 1000, 1000, 128, 2, causal=True)
    warp32 = [c for c in mma_attention_configs(shape, A100, 16) if c.warp == (32,)]
    assert warp32 and all(c.num_threads == c.block[0] for c in warp32)
    per_v_load = {}
    for rows in (16, 32):
        config = Config("attention_mma", block=(128, 32), warp=(rows,), pipeline_stages=2)
        src, cubin = compile_kernel(A100, attention_func(shape), config)
        body = src[src.index("__global__"):]
        per_v_load[rows] = body.count("mma_sync_aligned_m16n8k16") / body.count("ldmatrix_sync_aligned_m8n8_x4_trans")
        assert cubin.spill_bytes == 0 and cubin.registers <= 255
    assert per_v_load == {16: 4.0, 32: 8.0}  # S and P·V products over the V loads of a key tile


def test_the_plan_refuses_tiles_the_kernel_cannot_take():
    shape = AttentionShape(1, 8, 512, 512, 128, 8)
    func = attention_func(shape)
    for block, stages in (((128, 64), 1), ((144, 64), 2), ((128, 144), 2)):
        assert mma_plan_for(func, Config("attention_mma", block=block, pipeline_stages=stages)) is None
    d64 = attention_func(AttentionShape(1, 8, 512, 512, 64, 8))  # 16 keys of 8 chunks: 128 copies, 256 threads
    assert mma_plan_for(d64, Config("attention_mma", block=(128, 16), pipeline_stages=2)) is None
    assert mma_plan_for(func, Config("attention_mma", block=(128, 64), pipeline_stages=3), smem_bytes=99 * 1024) is None
    plan = mma_plan_for(func, Config("attention_mma", block=(128, 64), pipeline_stages=2))
    assert isinstance(plan, MmaAttentionPlan)
    assert (plan.threads, plan.q_regs, plan.s_regs, plan.o_regs) == (256, 32, 32, 64)
    assert mma_plan_for(ops.softmax(4, 8).func, Config("attention_mma", block=(128, 64), pipeline_stages=2)) is None


def test_hopper_gets_the_mma_kernel_beside_the_wgmma_one_at_head_dims_other_than_64_and_128():
    h100 = CUDA("nvidia/nvidia-h100")
    kinds = {d: {c.kind for c in attention_configs(AttentionShape(1, 8, 512, 512, d, 8), h100, 8)}
             for d in (64, 80, 96, 128, 192, 256, 40, 20, 264)}
    both = {"attention_wgmma", "attention_mma"}
    assert kinds == {64: {"attention_wgmma"}, 80: both, 96: both, 128: {"attention_wgmma"}, 192: both, 256: both,
                     40: both, 20: set(), 264: set()}
    configs = attention_configs(AttentionShape(1, 8, 512, 512, 96, 8, causal=True), h100, 8)
    ranked = sorted(configs, key=lambda c: c.cost)  # (an untimed run's order)
    assert ranked[0].kind == "attention_wgmma" and min(c.cost for c in configs if c.kind == "attention_mma") > \
        min(c.cost for c in configs if c.kind == "attention_wgmma")


def test_configs_fit_the_smaller_shared_memory_of_sm89_and_nothing_before_sm80():
    shape = match_attention(ops.attention(1, 32, 4096, 4096, 128, causal=True).func)
    for config in mma_attention_configs(shape, L4, 8):
        bm, bn = config.block
        assert 2 * 128 * (bm + 2 * config.pipeline_stages * bn) <= L4.smem_per_block_optin
    assert len(mma_attention_configs(shape, A100, 64)) > len(mma_attention_configs(shape, L4, 64))
    t4 = CUDA("nvidia/nvidia-t4")
    with t4.target, pytest.raises(ScheduleError, match="not applicable"):
        apply_config(attention_func(shape), Config("attention_mma", block=(128, 64), pipeline_stages=2))


@pytest.mark.parametrize("causal", [False, True])
def test_tiles_come_in_the_wgmma_templates_order(causal):
    """The same dealing as the wgmma template's CTA-a-tile grid: a head's tiles together without
    a causal mask, blocks of heads that fill the SMs with it (the K/V a wave streams stays in
    L2), every tile once."""
    shape = AttentionShape(1, 32, 4096, 4096, 128, 32, causal=causal)
    plan = mma_plan_for(attention_func(shape), Config("attention_mma", block=(128, 64), pipeline_stages=2), sms=132)
    n = int(plan.ctas)
    order = [(int(plan.head_of(t)), int(plan.query_tile(t))) for t in range(n)]
    assert len(set(order)) == n == 32 * 32
    assert len({h for h, _ in order[:132]}) == (5 if not causal else 8)  # 132 CTAs: 4.1 heads; blocks of 8
