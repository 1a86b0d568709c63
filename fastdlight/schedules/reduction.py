"""Single-reduction template (``kind == "reduction"``): sum/max/... over some axes.

Two layouts, picked from which iterator indexes the dominant input innermost:

* **inner reduction** (row sum: the reduced axis is contiguous). ``reduce_thread`` threads
  (``threadIdx.x``) split a row; each loads 128-bit vectors of it into registers, accumulates
  them serially, then the threads combine with TVM's cross-thread allreduce (warp shuffles +
  shared memory). ``block // thread`` rows per block run side by side on ``threadIdx.y``;
  each thread owns ``thread`` rows, loaded in the same loop step for memory-level parallelism.
* **outer reduction** (column sum: a spatial axis is contiguous). Threads (``threadIdx.x``)
  own ``thread`` contiguous outputs each (one vector) and loop over the reduction;
  ``reduce_thread`` > 1 splits the reduction over ``threadIdx.y`` and combines across threads.

Both use ``rfactor`` over the thread loop of the reduction: the per-thread partial results live
in registers (``local``). Accumulation uses the op's own dtype (TVM's ``unsafe_set_dtype`` would only
add conversions around a half-precision add); the rfactor tree keeps fp16 error small.
``rstep`` is the reduction elements one block consumes per loop step (unrolled).
"""

from __future__ import annotations

import math

import tvm_ffi
from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import (
    MAX_THREADS,
    ScheduleTemplate,
    config_fits_axes,
    dominant_read_is_contiguous_in,
    inline_injective,
    iter_loops,
    prepare,
    tile_spatial_axes,
    unroll,
    vector_width,
)


class ReductionTemplate(ScheduleTemplate):
    kinds = ("reduction",)
    name = "reduction"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        sch, blocks, anchor, spatial, reduce = prepare(func)
        if not reduce or not config_fits_axes(config, spatial, reduce):
            return None
        if math.prod(config.threads_per_axis) * math.prod(config.reduce_thread or (1,)) > MAX_THREADS:
            return None
        inline_injective(sch, blocks, keep=[anchor])
        epilogue = output_epilogue(sch, blocks, anchor, spatial)
        if epilogue is False:
            return None  # reduction chains / broadcasting epilogues: general_reduction's job
        stmt = sch.get(anchor.block_rv)
        if len(stmt.writes) != 1 or not _is_simple_reduction(stmt):
            return None
        if dominant_read_is_contiguous_in(sch, anchor, "R"):
            return schedule_inner_reduction(sch, anchor, spatial, reduce, config, epilogue)
        return schedule_outer_reduction(sch, anchor, spatial, reduce, config, epilogue)


def output_epilogue(sch: s_tir.Schedule, blocks, anchor, spatial):
    """After inlining, the blocks must be the reduction alone (returns None) or the reduction
    followed by one injective block over exactly the reduction's outputs, e.g. a cast from a
    float32 accumulator (returns its SBlockInfo). Anything else returns False."""
    if len(blocks) == 1:
        return None
    if len(blocks) != 2 or not blocks[0].block_rv.same_as(anchor.block_rv) or not blocks[1].is_injective():
        return False
    epi = blocks[1]
    extents = [int(sch.get(lp).extent) for lp in sch.get_loops(epi.block_rv)]
    extents = [e for e in extents if e != 1]
    if extents != [a.extent for a in spatial]:
        return False
    return epi


def schedule_epilogue(sch: s_tir.Schedule, block, epilogue, bx, threads: tuple[int, int]) -> None:
    """Run the injective epilogue of a reduction inside the same kernel: the reduction result
    goes to shared memory and the block's threads (``threads`` = extents of threadIdx.y,
    threadIdx.x) apply the epilogue to the block's outputs, one element per thread."""
    if epilogue is None:
        return
    sch.set_scope(block, 0, "shared")
    sch.reverse_compute_at(epilogue.block_rv, bx, preserve_unit_loops=True)
    loops = sch.get_loops(epilogue.block_rv)[1:]
    _, ty, tx = sch.split(_fuse(sch, loops), [None, *threads], preserve_unit_iters=True)
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _is_simple_reduction(block: tirx.SBlock) -> bool:
    """``X[...] = X[...] op f(...)`` with an init: what rfactor can split."""
    return block.init is not None and isinstance(block.body, tirx.BufferStore)


def _reduction_split(config: Config, extent: int, vec: int) -> tuple[int, int]:
    """(threads, serial vectors per step) for a reduction axis: ``reduce_thread`` threads, each
    taking ``rstep / (threads * vec)`` vectors of ``vec`` per loop step."""
    threads = min(math.prod(config.reduce_thread or (1,)), extent // vec)
    step = math.prod(config.rstep or (threads * vec,))
    per_thread = max(1, step // (max(threads, 1) * vec))
    return max(threads, 1), per_thread


def _spatial_tiles(sch, anchor, spatial, config, vec_last: int = 1):
    return tile_spatial_axes(sch, iter_loops(anchor, "S"), spatial, config, vec_last, interleave=False)


def _fuse(sch, loops):
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def schedule_inner_reduction(sch, anchor, spatial, reduce, config: Config, epilogue=None) -> s_tir.Schedule:
    block = anchor.block_rv
    r_loops = iter_loops(anchor, "R")
    r_extent = math.prod(a.extent for a in reduce)
    inputs = [r.source for r in sch.get(block).reads]
    # Vector width along the row: 128 bit, what the config allows, dividing the row length.
    vec = vector_width(config, inputs, math.prod(config.rstep or (8,)), r_extent)
    rt, per_thread = _reduction_split(config, r_extent, vec)

    grids, serials, threads, lanes = _spatial_tiles(sch, anchor, spatial, config)
    r = _fuse(sch, r_loops)
    r, v = sch.split(r, [None, vec], preserve_unit_iters=True)
    ro, u, tr = sch.split(r, [None, per_thread, rt], preserve_unit_iters=True)
    sch.reorder(*grids, *threads, tr, ro, u, *serials, *lanes, v)
    rf = sch.rfactor(tr, 0)
    sch.set_scope(rf, 0, "local")
    # rfactor rebuilt the loop nest: re-fetch it (same order as the reorder above).
    n = len(spatial)
    loops = sch.get_loops(rf)
    grids, threads, (tr, ro, u) = loops[:n], loops[n : 2 * n], loops[2 * n : 2 * n + 3]

    bx = _fuse(sch, grids)
    sch.bind(bx, "blockIdx.x")
    ty = _fuse(sch, threads)
    sch.bind(ty, "threadIdx.y")
    sch.bind(tr, "threadIdx.x")
    if vec > 1:
        # Per step, registers receive one vector of each row the thread owns, for every input
        # read along the row (gemv: W rows and the X vector(s)): 128-bit loads.
        for name in _row_inputs(sch, rf):
            idx = [r.source.name for r in sch.get(rf).reads].index(name)
            cache = sch.cache_read(rf, idx, "local")
            sch.compute_at(cache, u, preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(cache)[-1])
    unroll(sch, ro)
    sch.decompose_reduction(rf, ro)

    # Write-back: thread (ty, tx) combines its rows' partials across threadIdx.x.
    sch.reverse_compute_at(block, bx, preserve_unit_loops=True)
    ser_all, thr_all, r_loop = _writeback_loops(sch, block, config, vec=1)
    sch.reorder(*ser_all, *thr_all, *r_loop)
    sch.bind(_fuse(sch, thr_all), "threadIdx.y")
    sch.bind(r_loop[0], "threadIdx.x")
    schedule_epilogue(sch, block, epilogue, bx, (math.prod(config.threads_per_axis), rt))
    return sch


def _writeback_loops(sch, block, config: Config, vec: int):
    """After ``reverse_compute_at(write-back, bx)``: split each block-local spatial loop like the
    rfactor block's tiling (threads outer, the thread's own elements inner) so every thread reads
    back exactly the register partials it produced. Returns (serial loops, thread loops,
    [reduction loop])."""
    loops = sch.get_loops(block)[1:]
    r_loop = [lp for lp in loops if _binds_reduction(sch, block, lp)]
    s_loops = [lp for lp in loops if lp not in r_loop]
    assert len(s_loops) == len(config.block) and len(r_loop) == 1
    ser_all, thr_all = [], []
    for i, lp in enumerate(s_loops):
        thr, ser = sch.split(lp, [config.block[i] // config.thread[i], config.thread[i]], preserve_unit_iters=True)
        ser_all.append(ser)
        thr_all.append(thr)
    return ser_all, thr_all, r_loop


def schedule_outer_reduction(sch, anchor, spatial, reduce, config: Config, epilogue=None) -> s_tir.Schedule:
    block = anchor.block_rv
    r_loops = iter_loops(anchor, "R")
    r_extent = math.prod(a.extent for a in reduce)
    buffers = [r.source for r in sch.get(block).reads] + [w.source for w in sch.get(block).writes]
    vec = vector_width(config, buffers, config.thread[-1], spatial[-1].extent, sch.get(block))
    rt = min(math.prod(config.reduce_thread or (1,)), r_extent)
    per_thread = max(1, math.prod(config.rstep or (rt,)) // rt)

    grids, serials, threads, lanes = _spatial_tiles(sch, anchor, spatial, config, vec)
    r = _fuse(sch, r_loops)
    ro, u, tr = sch.split(r, [None, per_thread, rt], preserve_unit_iters=True)
    sch.reorder(*grids, *threads, tr, ro, u, *serials, *lanes)
    rf = sch.rfactor(tr, 0)
    sch.set_scope(rf, 0, "local")
    n = len(spatial)
    loops = sch.get_loops(rf)
    grids, threads, (tr, ro, u), lanes = loops[:n], loops[n : 2 * n], loops[2 * n : 2 * n + 3], loops[-n:]
    bx = _fuse(sch, grids)
    sch.bind(bx, "blockIdx.x")
    tx = _fuse(sch, threads)
    sch.bind(tx, "threadIdx.x")
    if rt > 1:
        sch.bind(tr, "threadIdx.y")
    if vec > 1:
        sch.vectorize(lanes[-1])
    unroll(sch, ro)
    sch.decompose_reduction(rf, ro)

    # Write-back: each thread combines the partials of its own outputs across threadIdx.y.
    sch.reverse_compute_at(block, bx, preserve_unit_loops=True)
    ser_all, thr_all, r_loop = _writeback_loops(sch, block, config, vec)
    sch.reorder(*ser_all, *thr_all, *r_loop)
    sch.bind(_fuse(sch, thr_all), "threadIdx.x")
    if rt > 1:
        sch.bind(r_loop[0], "threadIdx.y")
    schedule_epilogue(sch, block, epilogue, bx, (rt, math.prod(config.threads_per_axis)))
    return sch


def _row_inputs(sch: s_tir.Schedule, rf) -> list[str]:
    """Names of the global buffers ``rf`` reads whose innermost index moves with the reduction."""
    stmt = sch.get(rf)
    r_vars = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    names = []
    for region in stmt.reads:
        if region.source.scope() != "global" or not region.region:
            continue
        used = []
        tvm_ffi.structural_walk(region.region[-1].min, (tirx.Var, used.append), order="post")
        if any(any(v.same_as(r) for r in r_vars) for v in used) and region.source.name not in names:
            names.append(region.source.name)
    return names


def _binds_reduction(sch: s_tir.Schedule, block, loop) -> bool:
    """Whether ``loop`` drives a reduction iterator of ``block`` (the rfactor'ed thread axis)."""
    stmt = sch.get(block)
    loop_var = sch.get(loop).loop_var
    # reverse_compute_at creates one loop per block iterator, in iterator order.
    loops = sch.get_loops(block)
    own = loops[len(loops) - len(stmt.iter_vars) :]
    for iv, lp in zip(stmt.iter_vars, own):
        if sch.get(lp).loop_var.same_as(loop_var):
            return iv.iter_type == tirx.IterVar.CommReduce
    return False

