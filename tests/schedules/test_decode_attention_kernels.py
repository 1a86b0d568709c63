"""The split-KV decode attention template (CPU): its policy's layouts for the chunk step, each
compiled to a cubin without spills, for static and symbolic cache lengths, head dims 32-256,
1-8 query rows, bf16, with and without the appended token; a symbolic length's dispatcher
runs the template's kernel at every length."""

import dataclasses
import re

import pytest
import tvm
from tvm import tirx

from fastdlight import ops
from fastdlight.analysis.decode_attention import (
    MAX_ROWS,
    DecodeAttentionShape,
    block_rows,
    decode_combine_func,
    decode_paged_func,
    decode_split_func,
    default_splits,
    key_lanes,
    lane_width,
    layout_fits,
    match_decode_split,
    row_blocks,
    split_fits,
    staged_fits,
)
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import compile_mod_to_cubin
from fastdlight.config import Config
from fastdlight.policies.decode_attention import MAX_STAGES, STAGED_LAYOUTS, decode_attention_configs
from fastdlight.policies.select import candidate_sets
from fastdlight.schedules.decode_attention import DecodeAttentionTemplate
from fastdlight.schedules.decode_attention_mma import DecodeAttentionMmaTemplate
from fastdlight.schedules.symbolic import generalize

H100 = CUDA(tvm.target.Target("nvidia/nvidia-h100"))
SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def kernels(func, configs):
    for config in configs:
        template = DecodeAttentionMmaTemplate() if config.kind == "decode_attention_mma" else DecodeAttentionTemplate()
        with SM90A:
            kernel = template.apply_config(func, config)
        assert kernel is not None, config
        assert [str(p.name) for p in kernel.params] == [str(p.name) for p in func.params]
        yield config, kernel


def compile_together(func, configs):
    """Every config's kernel in one module, one compiler run (the compiler's start-up paid once):
    each kernel named by its place, none spilling. Returns the module's CUDA source."""
    mod = tvm.IRModule({f"k{i}": kernel.with_attr("global_symbol", f"k{i}")
                        for i, (_config, kernel) in enumerate(kernels(func, configs))})
    src, cubin = compile_mod_to_cubin(mod, SM90A)
    assert cubin.spill_bytes == 0, (configs, cubin.log)
    return src


def assert_one_ticket_a_kernel(src, configs):
    """A merged step's module: each kernel takes one ticket, by one acquire-release add (the
    helper defined once), and fences nothing else."""
    assert src.count("fdl_take_ticket(") == len(configs) + 1 and "thread_fence" not in src
    assert src.count("atom.acq_rel.gpu.global.add.s32") == 1


@pytest.mark.parametrize("batch, kv_heads, rows, head_dim, splits, appended, dtype, symbolic, merged", [
    (1, 8, 4, 128, 33, True, "float16", True, True),  # LLaMA-3-8B's decode step, merged in the step
    (1, 8, 4, 128, 66, False, "float16", True, False),  # the same attention as a pair with a merge kernel
    (16, 32, 1, 128, 1, False, "float16", False, False),  # no GQA, a batch of 16: one chunk each
    (2, 4, 8, 64, 16, True, "bfloat16", True, False),
    (1, 2, 8, 256, 8, False, "float16", False, False),
    (1, 2, 4, 32, 64, True, "float16", True, False),
    # head dims no power of two: a key's lanes rounded up to one, those past D holding zeros
    (1, 32, 1, 96, 17, False, "float16", False, False),  # Phi-3
    (2, 4, 8, 40, 16, True, "bfloat16", True, False),
    # more rows than a CTA holds: blocks of them (MQA's 32 query heads; 12 as two of 6)
    (1, 1, 32, 128, 64, False, "float16", True, False),
    (2, 4, 12, 64, 9, True, "float16", False, False),
    (2, 4, 12, 64, 9, True, "float16", False, True),
])  # fmt: skip
def test_every_config_compiles_to_a_cubin(batch, kv_heads, rows, head_dim, splits, appended, dtype, symbolic, merged):
    """Both templates' configs (the tensor-core step's where a K/V head has two or more rows and
    the head dim is 64 or 128), compiled without spills."""
    shape = DecodeAttentionShape(batch, kv_heads, rows, head_dim, splits, appended, dtype=dtype, merged=merged)
    func = decode_split_func(shape, tirx.Var("n", "int64") if symbolic else 1000)
    configs = decode_attention_configs(match_decode_split(func), H100)
    assert len(configs) >= 2
    src = compile_together(func, configs)
    assert "uint4" in src  # 16-byte loads of the cache
    mma = [c.warp[0] for c in configs if c.kind == "decode_attention_mma"]
    assert mma == ([1, 2, 4] if rows > 1 and head_dim in (64, 128) else [])
    assert ("mma.sync.aligned.m16n8k16" in src and "__byte_perm" in src) == bool(mma)
    if merged:
        assert_one_ticket_a_kernel(src, configs)


def test_the_step_gets_the_template_and_stock_only():
    op = ops.decode_attention(1, 8, 4, 2048, 128, splits=33)
    sets = list(candidate_sets(op.func, H100, 20))
    assert [s.policy for s in sets] == ["DecodeAttentionPolicy"]
    assert {c.kind for c in sets[0].configs} == {"decode_attention", "decode_attention_mma"}  # (four rows a head)


def test_a_symbolic_length_keeps_the_kernel_that_reads_it_at_run_time():
    shape = DecodeAttentionShape(1, 8, 4, 128, 33)
    length = tirx.Var("n", "int64")
    symbolic, static = decode_split_func(shape, length), decode_split_func(shape, 512)
    config = decode_attention_configs(match_decode_split(static), H100)[0]
    with SM90A:
        kernel = generalize(symbolic, static, DecodeAttentionTemplate().apply_config(static, config), config)
    assert kernel is not None and kernel.params[1].shape[2].same_as(length)
    compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)


@pytest.mark.parametrize("head_dim, splits", [(128, 66), (64, 3), (256, 128), (80, 33)])
def test_the_merge_gets_its_kernel_and_compiles(head_dim, splits):
    shape = DecodeAttentionShape(2, 4, 4, head_dim, splits)
    func = decode_combine_func(shape)
    sets = list(candidate_sets(func, H100, 20))
    assert [s.policy for s in sets] == ["DecodeAttentionPolicy"]
    compile_together(func, sets[0].configs)


@pytest.mark.parametrize("symbolic", [False, True])
def test_the_paged_step_compiles_for_every_config(symbolic):
    shape = DecodeAttentionShape(1, 8, 4, 128, 33, appended=False, page_size=16)
    pages, width = (tirx.Var("pages", "int64"), tirx.Var("width", "int64")) if symbolic else (600, 512)
    func = decode_paged_func(shape, pages, width)
    configs = decode_attention_configs(match_decode_split(func), H100)
    assert len(configs) >= 3
    src = compile_together(func, configs)
    assert "lengths" in src and "uint4" in src


def test_a_merged_paged_step_compiles_for_every_config_with_its_ticket():
    """The merged step: each CTA releases its chunk's writes with its ticket; the last merges
    (contiguous caches: the merged cases of the test of every config)."""
    shape = DecodeAttentionShape(1, 8, 4, 128, 33, appended=False, page_size=16, merged=True)
    func = decode_paged_func(shape, 600, 512)
    configs = decode_attention_configs(match_decode_split(func), H100)
    assert_one_ticket_a_kernel(compile_together(func, configs), configs)


def test_a_merged_step_of_one_chunk_writes_its_output_without_tickets():
    """One chunk a (batch, K/V head): nothing to merge, so no fence, no ticket, no last CTA."""
    shape = DecodeAttentionShape(16, 32, 1, 128, 1, appended=False, merged=True)
    func = decode_split_func(shape, tirx.Var("n", "int64"))
    configs = decode_attention_configs(match_decode_split(func), H100)
    src = compile_together(func, configs)
    assert "atomicAdd" not in src and "fdl_take_ticket" not in src and "thread_fence" not in src
    assert src.count("merged_ptr[1] / merged_ptr[2]") >= len(configs) and "out_ptr[" in src


@pytest.mark.parametrize("page_size, appended, symbolic", [(0, False, True), (0, True, False), (16, False, False)])
@pytest.mark.parametrize("stages", [3, 4])
def test_a_staged_step_copies_its_tiles_asynchronously_without_spills(page_size, appended, symbolic, stages):
    """Tiles staged in shared memory: each thread's own values by cp.async, a commit group a
    tile, a wait before a tile is used and once at the end."""
    shape = DecodeAttentionShape(1, 8, 4, 128, 33, appended=appended, page_size=page_size)
    length = tirx.Var("n", "int64") if symbolic else 1000
    func = decode_paged_func(shape, 600, 512) if page_size else decode_split_func(shape, length)
    config = Config("decode_attention", block=(16,), thread=(8,), warp=(4,), pipeline_stages=stages)
    ((_, kernel),) = kernels(func, [config])
    src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
    assert cubin.spill_bytes == 0, cubin.log
    assert "cp.async.cg.shared.global" in src and f"cp.async.wait_group {stages - 2};" in src
    assert "cp.async.wait_group 0;" in src and "cp.async.commit_group;" in src


@pytest.mark.parametrize("head_dim, merged", [(96, True), (80, True), (128, False)])
def test_the_staged_ring_starts_on_a_128_byte_boundary(head_dim, merged):
    """Whatever shared memory the warps' partial results take before it (their size follows the
    head dim), every cp.async destination of the ring is 128-byte aligned at thread 0."""
    shape = DecodeAttentionShape(1, 32, 1, head_dim, 17, appended=False, merged=merged)
    func = decode_split_func(shape, tirx.Var("n", "int64"))
    config = Config("decode_attention", block=(16,), thread=(8,), warp=(4,), pipeline_stages=4)
    ((_, kernel),) = kernels(func, [config])
    src, _ = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
    starts = {int(n) for n in re.findall(r"pool_buf_ptr\)\[\(\(\(\(int\)threadIdx\.x\) \* 8\) \+ (\d+)\)\]", src)}
    assert starts and all(n * 2 % 128 == 0 for n in starts), sorted(starts)


def test_staged_variants_of_the_best_layouts_that_fit():
    func = decode_split_func(DecodeAttentionShape(1, 32, 1, 128, 17, appended=False), 4096)
    shape, _ = match_decode_split(func)
    configs = decode_attention_configs(match_decode_split(func), H100)
    plain = [c for c in configs if c.pipeline_stages == 1]
    staged = [c for c in configs if c.pipeline_stages > 1]
    assert 1 <= len(staged) <= 2 * STAGED_LAYOUTS
    for c in staged:
        assert c.pipeline_stages <= MAX_STAGES and staged_fits(shape, c.block[0], c.warp[0], c.pipeline_stages)
        assert dataclasses.replace(c, pipeline_stages=1) in plain[:STAGED_LAYOUTS]  # one of the best, staged
    # the deepest ring that fits and a ring of three beside it, once each
    rings = [(c.block[0], c.thread[0], c.warp[0], c.pipeline_stages) for c in staged]
    assert len(set(rings)) == len(rings) and {r[3] for r in rings} == {3, MAX_STAGES}
    assert not [c for c in decode_attention_configs(match_decode_split(func), CUDA("nvidia/nvidia-t4"))
                if c.pipeline_stages > 1]  # no cp.async before sm_80
    assert not staged_fits(shape, 16, 4, 2)  # two stages are the register sets' pipeline
    assert not staged_fits(shape, 128, 4, 3)  # 192 KB of ring


def test_a_head_dim_no_power_of_two_spreads_a_key_over_a_power_of_two_lanes():
    """Phi-2's 80 at 8 values a lane: 10 lanes hold a key's values, 16 add its dot product (the
    6 past D load nothing and hold zeros), two keys a warp; the merge kernel's lanes past D hold
    nothing either."""
    assert key_lanes(80, 8) == 16 and key_lanes(96, 16) == 8 and key_lanes(128, 8) == 16 and key_lanes(40, 8) == 8
    assert lane_width(96) == 128 and lane_width(40) == 64 and lane_width(256) == 256
    shape = DecodeAttentionShape(1, 32, 1, 80, 17, appended=True)
    assert split_fits(shape) and layout_fits(shape, 16, 8, 4) and not layout_fits(shape, 16, 32, 4)
    assert not split_fits(DecodeAttentionShape(1, 32, 1, 84, 17))  # no whole 16-byte loads
    assert not split_fits(DecodeAttentionShape(1, 32, 1, 264, 17))
    func = decode_split_func(shape, 1000)
    config = decode_attention_configs(match_decode_split(func), H100)[0]
    ((_, kernel),) = kernels(func, [config])
    src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
    assert cubin.spill_bytes == 0 and "< 80)" in src  # the lanes past D: no loads


def test_more_rows_than_a_cta_holds_come_in_blocks_of_at_most_eight():
    """A K/V head's rows in blocks of at most 8, a CTA each (evenly: 12 as two of 6, 20 as three
    of 7, the last short); the chunks count their blocks' CTAs, and a merged step's last CTA
    waits for every block of every chunk."""
    assert [(row_blocks(r), block_rows(r)) for r in (1, 8, 12, 20, 32, 71)] == \
        [(1, 1), (1, 8), (2, 6), (3, 7), (4, 8), (9, 8)]
    assert block_rows(71) <= MAX_ROWS
    assert default_splits(8, 1, 132, 32) == 16 and default_splits(8, 1, 132) == 66  # four CTAs an SM, blocks counted
    shape = DecodeAttentionShape(2, 4, 20, 128, 5, appended=True, merged=True)
    func = decode_split_func(shape, 1000)
    config = decode_attention_configs(match_decode_split(func), H100)[0]
    ((_, kernel),) = kernels(func, [config])
    src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
    assert cubin.spill_bytes == 0 and "] == 14) {" in src  # the last ticket: 5 chunks x 3 blocks
    assert "((int)blockIdx.x) % 3) * 896)" in src  # a block's first row (7 rows of 128 values)


def test_the_tensor_core_step_takes_no_paged_cache_no_odd_head_dim_and_no_single_row():
    for shape in (DecodeAttentionShape(1, 8, 4, 128, 17, False, page_size=16), DecodeAttentionShape(1, 8, 4, 96, 17),
                  DecodeAttentionShape(1, 32, 1, 128, 17)):
        func = (decode_paged_func(shape, 64, 8) if shape.page_size else decode_split_func(shape, 1000))
        assert not [c for c in decode_attention_configs(match_decode_split(func), H100)
                    if c.kind == "decode_attention_mma"]
        if shape.page_size or shape.head_dim == 96:
            with SM90A:
                assert DecodeAttentionMmaTemplate().apply_config(func, Config("decode_attention_mma", block=(16,),
                                                                              warp=(2,))) is None
