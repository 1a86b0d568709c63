"""Which functions the Hopper wgmma template takes (match_wgmma) and the tiles WgmmaPolicy emits
(CPU only)."""

import dataclasses

import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.wgmma_match import match_wgmma
from fastdlight.arch import CUDA
from fastdlight.policies import wgmma
from fastdlight.policies.select import candidate_sets
from fastdlight.policies.wgmma import MAX_COST_SPREAD, WgmmaPolicy, wgmma_eligible
from fastdlight.schedules.wgmma.template import Plan, config_fits

H100 = CUDA("nvidia/nvidia-h100")  # sm_90a


def gemm(m, n, k, dtype="float16", layout="NN", batch=None, out=None):
    return ops.matmul(m, n, k, dtype, out or dtype, layout, batch, acc_dtype="float32").func


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layouts_and_dtypes(layout, dtype):
    match, reason = match_wgmma(gemm(256, 128, 64, dtype, layout))
    assert match is not None, reason
    assert (match.m, match.n, match.k, match.batch, match.in_dtype, match.out_dtype) == (256, 128, 64, 1, dtype, dtype)
    assert match.a_k_major == (layout[0] == "N") and match.b_k_major == (layout[1] == "T")
    assert (match.a_name, match.b_name) == ("A", "B")


def test_batched_operands_and_fp32_output():
    match, _ = match_wgmma(gemm(128, 64, 64, "float16", "NN", batch=3, out="float32"))
    assert match.batch == 3 and match.a_batched and match.b_batched and match.out_dtype == "float32"


@pytest.mark.parametrize("func,why", [
    (ops.matmul(256, 128, 64, "float32", "float32", "NN").func, "fp16, bf16 or fp8"),
    (gemm(256, 128, 68), "multiples of 16"),  # B rows of 128 fp16 are fine, A rows of 68 are not
    (gemm(16, 256, 256), "below one wgmma tile"),  # decode: the GEMV path
    (ops.elementwise((256, 256)).func, "reduction"),
])  # fmt: skip
def test_refusals_say_why(func, why):
    match, reason = match_wgmma(func)
    assert match is None and why in reason


def test_only_sm_90a_has_the_path():
    func = gemm(512, 512, 512)
    assert wgmma_eligible(func, H100)[0] is not None
    with pytest.warns(UserWarning, match="generic sm_90"):
        plain_sm_90 = CUDA(tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))  # wgmma is sm_90a-only PTX
    for arch in (CUDA("nvidia/nvidia-a100"), plain_sm_90):
        match, reason = wgmma_eligible(func, arch)
        assert match is None and "needs sm_90a" in reason


def test_policy_tiles_fit_the_sm_and_the_template():
    func = gemm(4096, 4096, 4096, layout="NT")
    policy = WgmmaPolicy(func, H100)
    configs = policy.emit_config(8)
    assert len(configs) == 8 and configs == sorted(configs, key=lambda c: c.cost)
    for c in configs:
        assert config_fits(policy.match, c), c
        plan = Plan(policy.match, *c.block, c.rstep[0], c.pipeline_stages, c.rasterization, H100.sm_count, c.warp[0])
        assert plan.smem_bytes() <= H100.smem_per_block_optin, c
        # a producer warpgroup and two consumer warpgroups, or three of 64 rows with fewer registers
        assert c.num_threads == 128 * (1 + plan.consumers) and plan.consumers in (2, 3)
        assert plan.acc_regs <= (192 if plan.consumers == 2 else 96)
    schedules = {"pingpong" if c.block[0] == c.warp[0] else "cooperative" for c in policy.emit_config(20)}
    assert schedules == {"pingpong", "cooperative"}
    # at 4096^3 the widest tile (two consumer warpgroups, 256 columns) is predicted fastest
    assert configs[0].block == (128, 256) and configs[0].pipeline_stages == 4


def test_narrow_n_gets_no_padding_tiles():
    policy = WgmmaPolicy(gemm(4096, 64, 4096, layout="NT"), H100)
    assert {c.block[1] for c in policy.emit_config(8)} == {64}


def test_candidate_set_holds_wgmma_and_mma_sync_on_sm_90a_only():
    func = gemm(2048, 2048, 2048)
    first = next(iter(candidate_sets(func, H100, 20)))
    kinds = [c.kind for c in first.configs]
    assert kinds[0] == "matmul_wgmma" and "matmul_tc" in kinds and len(kinds) <= 20
    a100 = next(iter(candidate_sets(func, CUDA("nvidia/nvidia-a100"), 20)))
    assert "matmul_wgmma" not in {c.kind for c in a100.configs}


def test_bf16_gets_wgmma_first_and_mma_sync_beside_it_where_nt():
    first = next(iter(candidate_sets(gemm(1024, 1024, 1024, "bfloat16", "NT"), H100, 8)))
    kinds = [c.kind for c in first.configs]
    assert first.policy == "TensorCorePolicy" and kinds[0] == "matmul_wgmma" and "matmul_tc" in kinds
    nn = next(iter(candidate_sets(gemm(1024, 1024, 1024, "bfloat16", "NN"), H100, 8)))
    assert {c.kind for c in nn.configs} == {"matmul_wgmma"}


def test_three_consumer_warpgroups_fill_the_waves_where_two_leave_a_tail():
    """LLaMA's up projection on 2048 tokens: 128 x 256 tiles are 688 for 132 SMs (a sixth wave
    21% full); 192 x 192 tiles (three 64-row consumer warpgroups) are 638, under five waves."""
    policy = WgmmaPolicy(gemm(2048, 11008, 4096, layout="NT"), H100)
    best = policy.emit_config(4)[0]
    assert best.block == (192, 192) and best.warp == (64, 192) and best.num_threads == 512
    plan = Plan(policy.match, *best.block, best.rstep[0], best.pipeline_stages, best.rasterization, H100.sm_count,
                best.warp[0])
    assert plan.consumers == 3 and plan.acc_regs == 96 and plan.smem_bytes() <= H100.smem_per_block_optin
    # two staging buffers a warpgroup would leave room for 3 stages: one buffer buys the fourth
    assert best.pipeline_stages == 4 and plan.out_buffers == 1
    three_stages = Plan(policy.match, 192, 192, 64, 3, 8, H100.sm_count, 64)
    assert three_stages.out_buffers == 2 and three_stages.smem_bytes() <= H100.smem_per_block_optin
    assert dataclasses.replace(plan, stages=5).smem_bytes() > H100.smem_per_block_optin
    # two-warpgroup tiles keep both buffers (their rings are 4 deep beside them)
    assert all(Plan(policy.match, *c.block, 64, c.pipeline_stages, 8, H100.sm_count, c.warp[0]).out_buffers == 2
               for c in policy.emit_config(20) if c.num_threads == 384)
    # setmaxnreg: the producer's 40 and three consumer warpgroups' registers fit the SM's 64K
    assert plan.consumer_regs == 152 and 128 * (plan.producer_regs + 3 * plan.consumer_regs) <= 65536
    # an m64n256 wgmma needs 154 registers, and a 512-thread kernel's instructions get 128
    three = dataclasses.replace(best, block=(192, 256), warp=(64, 256))
    assert not config_fits(policy.match, three)
    assert not config_fits(policy.match, dataclasses.replace(best, block=(384, 128), warp=(128, 128)))
    # where two warpgroups' tiles fill the waves (4096^3: 512 tiles of 128 x 256), they stay first
    assert WgmmaPolicy(gemm(4096, 4096, 4096, layout="NT"), H100).emit_config(1)[0].block == (128, 256)


def test_two_192_wide_slices_a_warpgroup_where_their_tiles_fill_the_waves():
    """LLaMA's qkv projection on 2048 tokens (N = 12288): 256 x 192 tiles (two consumer
    warpgroups of two m64n192 slices, 192 accumulators a thread) are 512, as many as 128 x 256
    ones, and load 12.5% fewer bytes a flop; where N = 4096 they pad a 22nd column of tiles."""
    policy = WgmmaPolicy(gemm(2048, 12288, 4096, layout="NT"), H100)
    best = policy.emit_config(4)[0]
    assert best.block == (256, 192) and best.warp == (128, 192) and best.num_threads == 384
    plan = Plan(policy.match, *best.block, best.rstep[0], best.pipeline_stages, best.rasterization, H100.sm_count,
                best.warp[0])
    assert plan.acc_regs == 192 <= plan.consumer_regs - 32 and plan.tiles == 512
    assert best.pipeline_stages == 3 and plan.smem_bytes() <= H100.smem_per_block_optin
    square = WgmmaPolicy(gemm(4096, 4096, 4096, layout="NT"), H100)
    assert square.emit_config(1)[0].block != (256, 192)
    # 256 accumulators do not fit beside the rest
    assert not config_fits(policy.match, dataclasses.replace(best, block=(256, 256), warp=(128, 256)))
    # ping-pong warpgroups of 128 x 192 fit the template but are not offered (slower at the power limit)
    pingpong = dataclasses.replace(best, block=(128, 192), warp=(128, 192), pipeline_stages=4)
    assert config_fits(policy.match, pingpong)
    assert all(c.block[0] != c.warp[0] or c.warp[0] * c.block[1] <= 128 * 128 for c in policy.emit_config(40))


def test_rasterization_groups_span_the_same_m_tiles_with_or_without_a_cluster_along_m():
    """Plan.coords counts a group in rows of work items; a cluster along M makes each row two M
    tiles, so its group has half the rows and still spans 16 tiles of 4096^3's 32."""
    policy = WgmmaPolicy(gemm(4096, 4096, 4096), H100)
    configs = policy.emit_config(40)
    spans = {(c.block, c.cluster, c.cluster_axis): c.rasterization * (c.cluster if c.cluster_axis == "m" else 1)
             for c in configs if c.block[0] == 128}
    assert any(cl == 2 and axis == "m" for _, cl, axis in spans) and any(cl == 1 for _, cl, _ in spans)
    assert set(spans.values()) == {16}


def test_the_estimate_orders_8192_cubed_tiles_as_they_ran():
    """8192³ NT on an H100 (2026-11-27), at one clock: 128x192 and 128x256 1.605 ms,
    192x192 1.701 (its 1849 tiles leave one for a fifteenth wave). Counted L2-bound (2.5x DRAM
    bandwidth), the two-warpgroup tiles estimated behind 192x192; shared memory (128 bytes a
    cycle) binds the tall 256x128 and the small tiles instead. (256x128 ran 1.611 ms there: the
    estimate puts it behind 192x192, the one tile of that run it misplaces.)"""
    policy = WgmmaPolicy(gemm(8192, 8192, 8192, layout="NT"), H100)
    cost = {(bm, bn): policy.cost(policy.tile(bm, bn, wm)) for bm, bn, wm in
            [(128, 256, 64), (128, 192, 64), (256, 128, 128), (192, 192, 64)]}
    assert max(cost[128, 256], cost[128, 192]) < min(cost[256, 128], cost[192, 192])
    # 128x256 is held by its tensor cores; 256x128 and 128x128 ping-pong by shared memory
    steps = {t: policy.smem_cycles(policy.tile(*t)) for t in [(128, 256, 64), (256, 128, 128), (128, 128, 128)]}
    assert steps[128, 256, 64] == 1024 and steps[256, 128, 128] == 1152 and steps[128, 128, 128] == 640
    assert wgmma.SMEM_BYTES_PER_CYCLE == 128


def test_a_small_gemm_drops_the_tiles_estimated_far_behind_the_best():
    # 196x384x64 (a pointwise convolution of mobilenet_v2 at batch 1): every tile fits one wave
    configs = WgmmaPolicy(gemm(196, 384, 64), H100).emit_config(20)
    assert configs and all(c.cost <= MAX_COST_SPREAD * configs[0].cost for c in configs)
    assert (256, 192) not in [tuple(c.block) for c in configs] and len(configs) < 16


def test_a_large_gemm_keeps_its_tiles():
    assert len(WgmmaPolicy(gemm(4096, 4096, 4096), H100).emit_config(16)) == 16
