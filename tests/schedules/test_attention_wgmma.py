"""Fused attention template, CPU only: every config the attention policy emits for prefill
shapes (head dims 64 and 128, causal or not, GQA, bf16, ragged sequence ends) compiles for
sm_90a to a cubin without spills, with wgmma from shared memory for the scores and from
registers for P·V, TMA loads and a producer warpgroup; shapes the template does not take get
no config."""

import dataclasses
import heapq
from concurrent.futures import ThreadPoolExecutor

import pytest
import tvm
from tvm import tirx

from fastdlight import ops
from fastdlight.analysis.attention import AttentionShape, attention_func, fused_fits, match_attention, wgmma_padded_dim
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.config import Config, StockSchedule
from fastdlight.policies.attention import attention_configs, consumer_regs, fits, key_padding
from fastdlight.policies.select import candidate_sets
from fastdlight.policies.wgmma import consumer_regs as wgmma_consumer_regs
from fastdlight.schedules import apply_config
from fastdlight.schedules.attention.plan import AttentionPlan
from fastdlight.schedules.attention.template import AttentionTemplate, plan_for

H100 = CUDA("nvidia/nvidia-h100")
A100 = CUDA("nvidia/nvidia-a100")

SHAPES = {
    "causal_d128": ((1, 8, 1000, 1000, 128), dict(causal=True)),
    "causal_d64_bottom_right": ((2, 4, 300, 4097, 64), dict(causal=True)),
    "gqa_bf16": ((1, 8, 1000, 1000, 128), dict(kv_heads=2, dtype="bfloat16")),
    # head dims short of whole 64-column chunks (P·V over the padded dim) and Gemma's 256
    "causal_d96": ((1, 8, 1000, 1000, 96), dict(causal=True)),
    "cross_d40": ((2, 8, 512, 77, 40), {}),
    "gqa_causal_d256": ((1, 8, 1000, 1000, 256), dict(kv_heads=4, causal=True)),
}
LAYOUTS = {  # the heads as models hold them before splitting: 4-D tensor maps
    "bthd_gqa": AttentionShape(2, 8, 300, 300, 64, 2, causal=True, layout="bthd"),
    "packed_qkv": AttentionShape(1, 12, 1000, 1000, 128, 12, causal=True, layout="packed"),
    "mixed_v_unsplit": AttentionShape(1, 8, 512, 512, 128, 2, causal=True, layout="bhtd,bhtd,bthd"),
    "bthd_d80": AttentionShape(2, 8, 300, 300, 80, 2, causal=True, layout="bthd"),
}


def compile_kernel(func, config):
    with H100.target:
        kernel = apply_config(func, config)
    src = cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))
    return kernel, src, compile_cubin(src, H100.target)


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_config_compiles_without_spills(name):
    args, kw = SHAPES[name]
    op = ops.attention(*args, **kw)
    configs = [c for c in attention_configs(match_attention(op.func), H100, 8) if c.kind == "attention_wgmma"]
    assert {c.block[0] for c in configs} >= {128}
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda c: compile_kernel(op.func, c), configs))
    t = "bf16" if kw.get("dtype") == "bfloat16" else "f16"
    for config, (kernel, src, cubin) in zip(configs, built):
        bn, d = config.block[1], wgmma_padded_dim(args[4])
        assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{t}.{t}" in src  # scores, from shared memory
        assert f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.{t}.{t}" in src  # P V, P from registers
        assert "cp.async.bulk.tensor.3d" in src and "setmaxnreg" in src and "__shfl_xor_sync" in src
        assert cubin.spill_bytes == 0, f"{config}: {cubin.spill_bytes} bytes spilled"
        assert [tuple(int(x) for x in p.shape) for p in kernel.params] == \
            [tuple(int(x) for x in p.shape) for p in op.func.params]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_unsplit_layouts_load_with_four_dimensional_maps(name):
    func = attention_func(LAYOUTS[name])
    config = attention_configs(LAYOUTS[name], H100, 1)[0]
    kernel, src, cubin = compile_kernel(func, config)
    shape = LAYOUTS[name]
    loads = "cp.async.bulk.tensor.{}d.shared::cluster"  # (the output is [B, H, TQ, D]: a 3-D store map)
    assert loads.format(4) in src
    assert (loads.format(3) in src) == ("bhtd" in shape.operand_layouts)
    assert cubin.spill_bytes == 0
    assert [p.name for p in kernel.params] == [p.name for p in func.params]


def test_the_attention_policy_goes_first_from_sm80():
    """... and stock Dlight's schedule (its fallback, three orders of magnitude slower) is a set
    of its own after the template's, measured only if all of the template's configs fail."""
    func = ops.attention(1, 8, 512, 512, 64, causal=True).func
    assert next(candidate_sets(func, H100, 8)).policy == "AttentionPolicy"
    stock = (StockSchedule("sm_90a"),)
    sets = list(candidate_sets(func, H100, 8, stock))
    assert [s.policy for s in sets] == ["AttentionPolicy", "stock Dlight"] and sets[-1].configs == stock
    assert not any(c.is_stock for c in sets[0].configs)
    first = next(candidate_sets(func, A100, 8))  # the mma.sync template's configs
    assert first.policy == "AttentionPolicy" and {c.kind for c in first.configs} == {"attention_mma"}
    assert all(s.policy != "AttentionPolicy" for s in candidate_sets(func, CUDA("nvidia/nvidia-t4"), 8))
    odd = ops.attention(1, 8, 512, 512, 96).func  # a head dim both templates cover: both measured
    assert {c.kind for c in next(candidate_sets(odd, H100, 8)).configs} == {"attention_wgmma", "attention_mma"}
    odd = ops.attention(1, 8, 512, 512, 20).func  # one neither covers
    assert all(s.policy != "AttentionPolicy" for s in candidate_sets(odd, H100, 8))


def test_the_shape_travels_with_the_function_and_is_checked():
    shape = AttentionShape(2, 8, 100, 200, 64, 2, causal=True)
    func = attention_func(shape)
    assert match_attention(func) == shape and fused_fits(shape, 90) and fused_fits(shape, 80)
    assert not fused_fits(shape, 75)
    assert match_attention(ops.softmax(4, 8).func) is None
    other = attention_func(AttentionShape(2, 8, 100, 300, 64, 2, causal=True))
    assert match_attention(other.with_attr("fastdlight.attention", func.attrs["fastdlight.attention"])) is None
    with pytest.raises(ValueError, match="kv_heads"):
        AttentionShape(1, 8, 4, 4, 64, 3)
    with pytest.raises(ValueError, match="seq_q <= seq_kv"):
        AttentionShape(1, 8, 8, 4, 64, 8, causal=True)


def test_configs_the_template_does_not_take_are_refused():
    func = ops.attention(1, 8, 512, 512, 64).func
    with pytest.raises(ValueError):
        Config("attention_wgmma", block=(100, 64))
    with H100.target:
        assert AttentionTemplate().apply_config(func, Config("attention_wgmma", block=(128, 72))) is None
        assert AttentionTemplate().apply_config(ops.softmax(4, 8).func, Config("attention_wgmma", block=(128, 64))) \
            is None


def test_where_tiles_outnumber_the_sms_each_tile_also_comes_on_a_persistent_grid():
    """GPT-2's causal shape (768 tiles of 128 rows on 132 SMs): each tile twice, a CTA per tile
    and a CTA per SM walking the tiles; the persistent kernel compiles without spills and
    launches one CTA per SM. A batch-1 short prompt (fewer tiles than SMs) gets no twins."""
    func = ops.attention(8, 12, 1024, 1024, 64, causal=True).func
    configs = attention_configs(match_attention(func), H100, 4)
    assert [c.persistent for c in configs] == [False, True, False, True]
    assert configs[0].block == configs[1].block and "persistent" in repr(configs[1])
    assert Config.from_dict(configs[1].to_dict()) == configs[1] and "persistent" not in configs[0].to_dict()
    kernel, src, cubin = compile_kernel(func, configs[1])
    assert cubin.spill_bytes == 0
    persistent, per_tile = (plan_for(func, c, H100.sm_count) for c in configs[1::-1])
    assert (persistent.ctas, per_tile.ctas) == (H100.sm_count, per_tile.tiles) and persistent.tiles_per_cta == 6
    few = ops.attention(1, 8, 1000, 1000, 128, causal=True).func
    assert not any(c.persistent for c in attention_configs(match_attention(few), H100, 8))
    with pytest.raises(ValueError, match="persistent"):
        Config("matmul", block=(64, 64), thread=(8, 8), persistent=True).validate()


def test_the_causal_mask_counts_in_a_tiles_registers():
    """A causal mask's test takes registers of its own: the three-consumer 192x128 tile is not
    offered where it would spill (d64 causal: 72 bytes at 160 registers), and is where it fits.
    The consumers' registers are what the producer frees of the CTA's launch share."""
    assert (consumer_regs(2), consumer_regs(3)) == (240, 160)
    assert (wgmma_consumer_regs(2, 40), wgmma_consumer_regs(3, 40), wgmma_consumer_regs(2, 32)) == (232, 152, 232)
    for consumers, producer in ((2, 24), (2, 32), (2, 40), (3, 24), (3, 40)):
        threads = 128 * (consumers + 1)
        assert 128 * (producer + consumers * wgmma_consumer_regs(consumers, producer)) <= \
            threads * (65536 // threads // 8 * 8)
    gpt2 = match_attention(ops.attention(8, 12, 1024, 1024, 64, causal=True).func)
    plain = match_attention(ops.attention(8, 12, 1024, 1024, 64).func)
    assert not fits(gpt2, 192, 128, 3) and fits(plain, 192, 128, 3) and fits(gpt2, 192, 64, 3)
    assert all(c.block != (192, 128) for c in attention_configs(gpt2, H100, 64))


def test_consumers_take_turns_and_release_k_and_v_apart():
    """Two consumers (128 rows) take turns at the tensor cores: each waits on its own named
    barrier (1 + its index, 256 threads) and passes the turn to the other's; one consumer (64
    rows) has no one to take turns with. Each stage has two empty barriers (K back after the
    scores, V after P·V)."""
    func = ops.attention(1, 8, 1000, 1000, 128, causal=True).func
    two = plan_for(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=2))
    one = plan_for(func, Config("attention_wgmma", block=(64, 128), pipeline_stages=2))
    assert (two.pingpong, one.pingpong) == (True, False)
    with pytest.raises(ValueError, match="turns"):
        AttentionPlan(one.shape, 64, 128, 2, pingpong=True)
    _, src, cubin = compile_kernel(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=2))
    assert cubin.spill_bytes == 0
    assert "bar.sync" in src and "bar.arrive" in src and "(uint)256" in src
    inits = src.count("tvm_builtin_ptx_mbarrier_init_init_shared_b64(") - 1  # less its definition
    assert inits == 2 + 4 * two.stages  # Q full and empty; per stage K full, V full, K empty, V empty
    _, src_one, _ = compile_kernel(func, Config("attention_wgmma", block=(64, 128), pipeline_stages=2))
    assert "bar.arrive" not in src_one


def test_o_leaves_through_tma_stores_where_its_tile_fits_beside_the_ring():
    """128x128 with two stages has room for O's 32 KB beside Q and the ring: O is staged in
    128-byte-swizzled rows and stored by TMA (a 3-D map of [B*H, TQ, D]); with three stages it
    has not, and O leaves from registers in 32-bit pairs. The staged words of a consumer's rows
    are distinct, inside its own rows, and swizzled as TMA's 128-byte mode reads them."""
    func = ops.attention(1, 8, 1000, 1000, 128, causal=True).func
    staged = plan_for(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=2), 132, 227 * 1024)
    direct = plan_for(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=3), 132, 227 * 1024)
    assert (staged.stage_o, direct.stage_o) == (True, False)
    assert staged.smem_bytes() <= 227 * 1024 < dataclasses.replace(direct, stage_o=True).smem_bytes()
    _, src, cubin = compile_kernel(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=2))
    assert cubin.spill_bytes == 0
    assert "cp.async.bulk.tensor.3d.global.shared::cta" in src and "wait_group.read 0" in src
    assert "*(half2*)(out_ptr" not in src
    _, src3, cubin3 = compile_kernel(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=3))
    assert "*(half2*)(out_ptr" in src3 and "global.shared::cta" not in src3 and cubin3.spill_bytes == 0
    for cw in range(staged.consumers):
        words = [staged.staged_word(cw, r, c) for r in range(64) for c in range(0, 128, 2)]
        assert len(set(words)) == len(words)
        assert min(words) == cw * 64 * 64 and max(words) == (cw + 1) * 64 * 64 - 1
    # row 3's first 16 bytes sit in 16-byte slot 3 of the row: 128-byte swizzle, as the loads use
    assert staged.staged_word(0, 3, 0) == 3 * 32 + 3 * 4


@pytest.mark.parametrize("shape", [(1, 32, 4096, 4096, 128), (8, 12, 1024, 1024, 64), (4, 32, 2048, 2048, 128)])
def test_a_persistent_grid_takes_every_tile_once_and_evens_out_the_causal_work(shape):
    """Rounds of tiles dealt to the CTAs in a snake: every tile once, and the key tiles each CTA
    reads (its work, causal) within one tile's worth of the mean, and spread less than dealt in
    order, where the first CTAs' rounds were all heavier than the last ones'."""
    func = ops.attention(*shape, causal=True).func
    config = next(c for c in attention_configs(match_attention(func), H100, 8) if c.persistent)
    plan = plan_for(func, config, H100.sm_count)
    n, ctas = int(plan.tiles), int(plan.ctas)

    def key_tiles(tile: int) -> int:  # the key tiles a tile reads, by the plan's expressions
        return int(plan.kv_tiles(plan.query_tile(tile)))

    tiles = [[int(plan.tile_of(cta, it)) for it in range(plan.tiles_per_cta)] for cta in range(ctas)]
    assert sorted(t for row in tiles for t in row if t < n) == list(range(n))
    work = [sum(key_tiles(t) for t in row if t < n) for row in tiles]
    assert max(work) - sum(work) / ctas <= key_tiles(0)
    in_order = [sum(key_tiles(t) for t in range(cta, n, ctas)) for cta in range(ctas)]
    assert max(work) <= max(in_order) and max(work) - min(work) < max(in_order) - min(in_order)


def test_without_a_causal_mask_the_ctas_running_at_once_read_few_heads():
    """Non-causal tiles come a head at a time (the K/V the CTAs of a round stream stays in L2);
    causal ones on a persistent grid every head's heaviest first, so each round's work is even."""
    for causal, most_heads in ((False, 3), (True, 32)):
        func = ops.attention(1, 32, 8192, 8192, 128, causal=causal).func
        config = next(c for c in attention_configs(match_attention(func), H100, 8) if c.persistent)
        plan = plan_for(func, config, H100.sm_count)
        for it in range(int(plan.tiles_per_cta)):
            tiles = [int(plan.tile_of(cta, it)) for cta in range(int(plan.ctas))]
            heads = {int(plan.head_of(t)) for t in tiles if t < int(plan.tiles)}
            assert len(heads) <= most_heads
        every = {(int(plan.head_of(t)), int(plan.query_tile(t))) for t in range(int(plan.tiles))}
        assert len(every) == int(plan.tiles)


@pytest.mark.parametrize("shape", [(1, 32, 4096, 4096, 128), (8, 12, 1024, 1024, 64), (4, 32, 2048, 2048, 128),
                                   (1, 32, 1000, 1000, 128), (3, 5, 700, 700, 64)])
def test_causal_tiles_of_a_cta_each_come_in_blocks_of_heads_heaviest_first(shape):
    """A CTA a tile, causal: the first wave reads a few heads' K/V, every tile comes once, and
    the SMs, each taking the next tile as it frees up, end within 3.5% of the mean work (or
    the heaviest tile's, where the tiles are fewer than the SMs)."""
    func = ops.attention(*shape, causal=True).func
    plan = plan_for(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=2), H100.sm_count)
    n, sms = int(plan.tiles), H100.sm_count
    order = [(int(plan.head_of(t)), int(plan.query_tile(t))) for t in range(n)]
    assert len(set(order)) == n
    assert len({h for h, _ in order[:sms]}) <= plan.head_block + 1
    free = [(0, sm) for sm in range(sms)]
    for _, qt in order:  # the next tile to the SM that frees up first
        work, sm = heapq.heappop(free)
        heapq.heappush(free, (work + int(plan.kv_tiles(qt)), sm))
    works = [w for w, _ in free]
    assert max(works) <= max(1.035 * sum(works) / sms + 1, int(plan.kv_tiles(plan.q_tiles - 1)))


def test_the_cost_counts_the_keys_a_wide_tile_computes_for_nothing():
    """Keys computed per key needed: the sequence end's padding, and (causal) the diagonal
    tiles' masked keys, which grow with the key tile."""
    full = match_attention(ops.attention(1, 32, 8192, 8192, 128).func)
    assert key_padding(full, 128, 128) == 1.0
    assert key_padding(full, 128, 176) == 47 * 176 / 8192
    causal = match_attention(ops.attention(1, 32, 4096, 4096, 128, causal=True).func)
    assert 1.0 < key_padding(causal, 128, 128) < key_padding(causal, 128, 192)


def test_a_head_dim_short_of_whole_chunks_is_computed_over_them():
    """d96: the tiles load as two 64-column chunks (TMA fills columns 96-127 with zeros), the
    scores step over the 96 columns, P·V computes 128 of which O keeps 96."""
    func = ops.attention(1, 8, 1000, 1000, 96, causal=True).func
    plan = plan_for(func, Config("attention_wgmma", block=(128, 128), pipeline_stages=2))
    assert plan.padded and plan.d_chunks == 2 and plan.d_steps == 6 and plan.o_regs == 64
    assert "m64n128k16" in plan.o_mma and plan.dims(0)[0] == 96 and plan.out_dims[0] == 96
    assert plan.q_bytes == 128 * 128 * 2  # the whole boxes land, zero columns included
    row, col = tirx.Var("row", "int32"), tirx.Var("col", "int32")
    assert "col < 96" in str(plan.stored(row, col))
    full = plan_for(ops.attention(1, 8, 1000, 1000, 128).func, Config("attention_wgmma", block=(128, 128),
                                                                          pipeline_stages=2))
    assert not full.padded and "col" not in str(full.stored(row, col))
