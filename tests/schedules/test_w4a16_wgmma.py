"""Weight-only 4-bit matmul on Hopper for prefill (``matmul_wgmma_dequant``), CPU only: the
policy's tiles fit the SM, compile to sm_90a cubins with register-A wgmma, TMA and setmaxnreg and
without spills (odd row counts and zero points included); the tuner measures them beside the
mma.sync tiles, and only for packed prefill functions on sm_90a; the fragment conversion's
constants give the reference's weights exactly."""

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.weight_only import match_weight_only
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.config import Config
from fastdlight.policies.select import candidate_sets
from fastdlight.policies.wgmma_dequant import dequant_wgmma_configs, dequant_wgmma_fits
from fastdlight.schedules import apply_config
from fastdlight.schedules.wgmma.dequant import DequantPlan, plan_of

H100 = CUDA("nvidia/nvidia-h100")
H200 = CUDA("nvidia/nvidia-h200")


def shape_of(m, n, k, group=128, zero_point=False):
    return match_weight_only(ops.matmul_int4(m, n, k, group, zero_point=zero_point).func)


def config(bw, bx, stages) -> Config:
    return Config("matmul_wgmma_dequant", block=(bw, bx), warp=(64, bx), rstep=(64,), pipeline_stages=stages,
                  use_async_copy=True)


def compile_all(jobs):
    """[(op, config)] -> [(source, cubin)]; nvcc two at a time."""
    kernels = []
    for op, cfg in jobs:
        with H100.target:
            kernels.append(apply_config(op.func, cfg, allow_fallback=False))
    sources = [cuda_source(build(tvm.IRModule({"main": k}), H100.target)) for k in kernels]
    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda s: compile_cubin(s, H100.target), sources))
    return list(zip(sources, cubins))


def check_kernel(src, cubin, bx):
    assert f"wgmma.mma_async.sync.aligned.m64n{bx}k16.f32.f16.f16" in src
    assert "wgmma_f16_rs_mma_async" in src  # A (the weights) from registers
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier" in src  # TMA loads
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in src  # TMA stores
    assert "setmaxnreg" in src and "__byte_perm" in src
    assert set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", src)) == {"matmul_int4_kernel"}
    assert cubin.spill_bytes == 0 and 0 < cubin.registers <= 255
    assert "serialized" not in cubin.log  # ptxas keeps the wgmmas asynchronous


def test_policy_tiles_fit_the_sm_and_rank_the_wide_tiles():
    for arch in (H100, H200):
        for m, n, k in ((2048, 11008, 4096), (2048, 4096, 11008), (1000, 4096, 4096)):
            configs = dequant_wgmma_configs(shape_of(m, n, k), arch, 8)
            assert configs and all(c.kind == "matmul_wgmma_dequant" for c in configs)
            costs = [c.cost for c in configs]
            assert costs == sorted(costs)
            for c in configs:
                plan = plan_of(shape_of(m, n, k), c, arch.sm_count, arch.smem_per_block_optin)
                assert plan is not None and plan.smem_bytes() <= arch.smem_per_block_optin
                assert c.num_threads == 128 * (1 + c.block[0] // 64)
            assert {c.block for c in configs} >= {(128, 256), (128, 128)}


def test_policy_offers_nothing_for_decode_other_archs_or_other_packings():
    assert dequant_wgmma_configs(shape_of(16, 4096, 4096), H100) == []  # the GEMV's rows
    assert dequant_wgmma_configs(shape_of(256, 4096, 4096), CUDA("nvidia/nvidia-a100")) == []
    assert dequant_wgmma_configs(shape_of(256, 4096, 4096), CUDA("nvidia/geforce-rtx-4090")) == []
    assert dequant_wgmma_configs(shape_of(256, 4096, 4096, group=32), H100) == []  # groups within a K step
    bf16 = match_weight_only(ops.matmul_int4(256, 4096, 4096, 128, dtype="bfloat16").func)
    int8 = match_weight_only(ops.matmul_int8(256, 4096, 4096, 128).func)
    assert not dequant_wgmma_fits(bf16) and not dequant_wgmma_fits(int8)
    assert dequant_wgmma_configs(bf16, H100) == [] and dequant_wgmma_configs(int8, H100) == []


def test_prefill_candidates_come_first_beside_the_mma_sync_tiles_and_nothing_else_changes():
    sets = list(candidate_sets(ops.matmul_int4(2048, 11008, 4096, 128).func, H200, 8))
    first = sets[0]
    kinds = [c.kind for c in first.configs]
    assert first.policy == "TensorCorePolicy" and kinds[0] == "matmul_wgmma_dequant" and "matmul_tc" in kinds
    assert kinds == sorted(kinds, key=lambda kd: kd != "matmul_wgmma_dequant")  # ranked first
    assert [c.cost for c in first.configs] == sorted(c.cost for c in first.configs)
    # decode, other archs, plain matmuls: as before
    for func, arch in ((ops.matmul_int4(1, 11008, 4096, 128).func, H200),
                       (ops.matmul_int4(2048, 11008, 4096, 128).func, CUDA("nvidia/nvidia-a100")),
                       (ops.matmul(512, 512, 512, "float16").func, H200),
                       (ops.matmul_int8(2048, 4096, 4096, 128).func, H200)):
        assert all(c.kind != "matmul_wgmma_dequant" for s in candidate_sets(func, arch, 8) for c in s.configs)


def test_every_policy_tile_compiles_without_spills():
    op = ops.matmul_int4(2048, 11008, 4096, 128)
    configs = dequant_wgmma_configs(shape_of(2048, 11008, 4096), H100, 8)
    assert len(configs) >= 4
    for cfg, (src, cubin) in zip(configs, compile_all([(op, c) for c in configs])):
        check_kernel(src, cubin, cfg.block[1])


def test_odd_rows_long_k_and_zero_points_compile():
    """M not a multiple of the tile (TMA zero-fills X past the end and clips Y's stores), K =
    11008 (86 groups), and a zero point a group."""
    jobs = [(ops.matmul_int4(1000, 4096, 4096, 128), config(128, 256, 5)),
            (ops.matmul_int4(1000, 4096, 4096, 128), config(192, 128, 8)),
            (ops.matmul_int4(2048, 4096, 11008, 128), config(128, 192, 6)),
            (ops.matmul_int4(300, 1024, 2048, 128, zero_point=True), config(128, 128, 8)),
            (ops.matmul_int4(77, 1088, 512, 256), config(128, 64, 8))]
    for (op, cfg), (src, cubin) in zip(jobs, compile_all(jobs)):
        check_kernel(src, cubin, cfg.block[1])
    assert "fdl_w4z_frag" in compile_all(jobs[3:4])[0][0]


@pytest.mark.parametrize("cfg", [
    config(128, 320, 4),  # wider than wgmma's n256
    config(256, 128, 4),  # four consumer warpgroups
    config(192, 256, 4),  # three warpgroups of 128 accumulators: past their registers
    config(128, 256, 8),  # a ring past the shared memory
    Config("matmul_wgmma_dequant", block=(128, 128), warp=(64, 128), rstep=(128,), pipeline_stages=4),
])
def test_what_does_not_fit_is_refused(cfg):
    assert plan_of(shape_of(2048, 4096, 4096), cfg, 132, H100.smem_per_block_optin) is None
    with H100.target, pytest.raises(Exception, match="no template could schedule"):
        apply_config(ops.matmul_int4(2048, 4096, 4096, 128).func, cfg, allow_fallback=False)


def test_a_plain_matmul_is_not_taken():
    with H100.target, pytest.raises(Exception, match="no template could schedule"):
        apply_config(ops.matmul(256, 256, 256, "float16", "float16", "NT").func, config(128, 128, 4),
                     allow_fallback=False)


def _emulate_fragment(word: int, lane: int, scale: np.float16, zero=None) -> tuple[np.float16, np.float16]:
    """The two fp16 weights the kernel's fragment conversion makes of ``word`` for ``lane``:
    prmt (byte lane % 4 into bytes 0 and 2), lop3, hfma2 (exact: one rounding of an exact
    value), hsub2 (zero point), hmul2."""
    b = (word >> (8 * (lane % 4))) & 0xFF
    x = b | b << 8 | b << 16 | b << 24
    t = (x & 0x00F0000F) | 0x64006400
    lo, hi = (np.array([t & 0xFFFF, t >> 16], dtype=np.uint16).view(np.float16)).astype(np.float64)
    add = (-1032.0, -72.0) if zero is None else (-1024.0, -64.0)
    v = [np.float16(lo * 1.0 + add[0]), np.float16(hi * (1 / 16) + add[1])]
    if zero is not None:
        v = [np.float16(np.float64(e) - np.float64(zero)) for e in v]
    return tuple(np.float16(np.float64(e) * np.float64(scale)) for e in v)


def test_fragment_conversion_gives_the_reference_weights():
    """Each 32-bit register holds weights k = 2c, 2c + 1 of the word (byte c = lane % 4), as
    ``(q - 8) * s`` (or ``(q - z) * s``) rounded once to fp16 as the reference rounds them."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        word = int(rng.integers(0, 2**32))
        scale = np.float16(rng.normal() * 0.05)
        zero = np.float16(rng.uniform(0, 15))
        for lane in range(4):
            q0, q1 = (word >> (8 * lane)) & 0xF, (word >> (8 * lane + 4)) & 0xF
            assert _emulate_fragment(word, lane, scale) == (
                np.float16((np.float16(q0) - np.float16(8)) * scale), np.float16((np.float16(q1) - np.float16(8)) * scale))
            assert _emulate_fragment(word, lane, scale, zero) == (
                np.float16(np.float16(np.float16(q0) - zero) * scale), np.float16(np.float16(np.float16(q1) - zero) * scale))


def test_plan_walks_every_tile_once():
    plan = DequantPlan(shape_of(1000, 4096, 4096), 128, 256, 5, 132)
    seen = sorted((plan.tile_w(t), plan.tile_x(t)) for c in range(plan.ctas)
                  for t in range(c, plan.tiles, plan.ctas))
    assert seen == sorted((w, x) for w in range(32) for x in range(4))
    assert plan.k_steps % 2 == 0 and plan.stage_bytes == 256 * 128 + 128 * 32
