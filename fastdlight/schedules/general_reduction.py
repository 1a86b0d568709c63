"""Reduction-chain template (``kind == "general_reduction"``; also tried for ``"reduction"``):
softmax, layer/RMS norm and a reduction followed by an elementwise epilogue — several blocks
that all reduce (or map) the same rows — fused into one kernel.

Layout: the rows of the config's spatial axes are tiled ``[grid, threads (threadIdx.y), serial]``
(``block`` rows per block, ``thread`` rows per thread); ``reduce_thread`` threads
(``threadIdx.x``) split each row. Every reduction is ``compute_at`` the block loop with the same
row split and combined across ``threadIdx.x`` by TVM's allreduce; its per-row result goes to
the threads of that row (shared memory when a block has one row, see ``_reductions_at_block``
for why). When the block's rows of the input fit in shared memory (``smem_limit``), they are
fetched once with 128-bit cooperative loads and every block of the chain reads them from there,
so the input crosses DRAM once. The last (elementwise) block
stores vectors (up to 128 bit, fewer lanes when it computes in float32).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import (
    MAX_THREADS,
    buffers_indexed_innermost_by,
    ScheduleTemplate,
    config_fits_axes,
    cooperative_fetch,
    dtype_bits,
    inline_injective,
    largest_pow2_divisor,
    prepare,
    tile_spatial_axes,
    unroll,
    vector_width,
)

#: default shared-memory budget for the cached rows (bytes): the 48 KB every CUDA GPU allows
#: without opt-in, minus room for the per-row results and the allreduce scratch.
SMEM_LIMIT = 40 * 1024


#: the last block's row loop is unrolled up to this many steps: a 32000-wide softmax row is 250
#: steps, 7,400 lines of CUDA unrolled and 1.2-2.7 s of nvcc a candidate
MAX_UNROLLED_ROW_STEPS = 64


class GeneralReductionTemplate(ScheduleTemplate):
    kinds = ("general_reduction", "reduction")
    name = "general_reduction"

    def __init__(self, smem_limit: int = SMEM_LIMIT):
        self.smem_limit = smem_limit

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        sch, blocks, anchor, spatial, reduce = prepare(func)
        if not reduce or not config_fits_axes(config, spatial, reduce):
            return None
        threads_y = math.prod(config.threads_per_axis)
        rt = min(math.prod(config.reduce_thread or (1,)), MAX_THREADS)
        if threads_y * rt > MAX_THREADS:
            return None
        inline_injective(sch, blocks, keep=[b for b in blocks if b.is_reduction()])
        _row_loops_of_one_row(sch, blocks, spatial)
        chain = _chain(sch, blocks, spatial, reduce)
        if chain is None:
            return None
        reductions, last = chain
        r_extent = math.prod(a.extent for a in reduce)
        bx = _tile_last_block(sch, last, spatial, config, rt, r_extent)
        _reductions_at_block(sch, reductions, last.block_rv, bx, config, len(spatial), rt)
        self._cache_rows(sch, [i.block_rv for i in reductions] + [last.block_rv], bx, config, threads_y, rt, r_extent)
        return sch

    def _cache_rows(self, sch, readers, bx, config: Config, threads_y: int, rt: int, r_extent: int) -> None:
        """Read each input that is read whole-row by several blocks of the chain into shared
        memory once per thread block (if the block's rows fit ``smem_limit``); and so each one
        the last block alone reads (a norm's weight, a residual), fetched with the others
        before the reductions: read where it is used, its load would wait for the reductions
        (a memory round trip after them, of a 1.2 us RMSNorm of a decode step)."""
        rows = math.prod(config.block)
        counts: dict = {}
        for blk in readers:
            for region in sch.get(blk).reads:
                buf = region.source
                if buf.scope() == "global" and _numel(buf) >= r_extent:
                    entry = counts.setdefault(buf.name, [buf, []])
                    if not any(b.same_as(blk) for b in entry[1]):
                        entry[1].append(blk)
        used = 0
        last = readers[-1]
        for name, (buf, consumers) in counts.items():
            # read by the last block alone, after reductions: fetched ahead, at the block's start
            ahead = len(readers) > 1 and len(consumers) == 1 and consumers[0].same_as(last)
            if len(consumers) < 2 and not ahead:
                continue  # read once, by a reduction, anyway: caching would only add a copy
            size = min(rows * r_extent, _numel(buf)) * dtype_bits(buf.dtype) // 8  # (a weight: one row)
            if used + size > self.smem_limit:
                continue
            used += size
            idx = [r.source.name for r in sch.get(consumers[0]).reads].index(name)
            cache = sch.cache_read(consumers[0], idx, "shared", consumer_blocks=consumers)
            # (index -2: the first place it may go, the start of the block, before the reductions)
            sch.compute_at(cache, bx, preserve_unit_loops=True, index=-2 if ahead else -1)
            bits = dtype_bits(buf.dtype)
            vec = largest_pow2_divisor(r_extent, max(1, 128 // bits))
            cooperative_fetch(sch, cache, [threads_y, rt], vec)


def _tile_last_block(sch, last, spatial, config: Config, rt: int, r_extent: int):
    """Tile the chain's last block: its rows -> [grid (blockIdx.x), threadIdx.y, serial], the row
    -> [serial, threadIdx.x, vector lane]. Returns the block loop, where the rest goes."""
    n_s = len(spatial)
    loops = sch.get_loops(last.block_rv)
    row_loops, col_loops = loops[:n_s], loops[n_s:]
    vec = _last_block_vector(sch, last, config, rt, r_extent)
    grids, ser, thr, units = tile_spatial_axes(sch, row_loops, spatial, config, interleave=False)
    col = sch.fuse(*col_loops) if len(col_loops) > 1 else col_loops[0]
    co, tx, lane = sch.split(col, [None, rt, vec], preserve_unit_iters=True)
    sch.reorder(*grids, *thr, *ser, *units, co, tx, lane)
    bx = sch.fuse(*grids) if n_s > 1 else grids[0]
    ty = sch.fuse(*thr) if n_s > 1 else thr[0]
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if not last.is_reduction() and vec > 1:
        sch.vectorize(lane)
    unroll(sch, co, max_step=MAX_UNROLLED_ROW_STEPS)
    return bx


def _last_block_vector(sch, last, config: Config, rt: int, r_extent: int) -> int:
    """Vector lanes of the last block along the row: what ``vector_width`` allows for the buffers
    its innermost iterator indexes innermost (its outputs when none), given the row's columns per
    thread."""
    stmt = sch.get(last.block_rv)
    buffers = buffers_indexed_innermost_by(stmt, stmt.iter_vars[-1].var)
    buffers = buffers or [w.source for w in stmt.writes]
    per_thread_cols = math.prod(config.rstep or (rt * 8,)) // max(rt, 1)
    return vector_width(config, buffers, max(per_thread_cols, 1), r_extent, stmt)


def _reductions_at_block(sch, reductions, last_rv, bx, config: Config, n_s: int, rt: int) -> None:
    """Every reduction but the last block runs at the block loop ``bx`` for the block's rows,
    with the same (threadIdx.y, serial) row split as the last block, each row combined across
    threadIdx.x.

    Where its per-row result lives: with several rows per block, "local": TVM's allreduce then
    hands the result to every thread of the row (read back from its shared scratch after a
    barrier), exactly the threads that consume it. A "shared" result is written by
    threadIdx.x == 0 only, and TVM 0.27's barrier insertion misses that write→read hazard when
    both index by threadIdx.y (wrong results on an H200 with 2 rows × 4 warps). With one row per
    block the index is constant, TVM does insert the barrier, and "shared" is ~10% faster
    (measured 3044 vs 2685 GB/s, softmax 4096² fp16 on H200): the "local" result is re-read from
    volatile shared scratch at every use."""
    result_scope = "shared" if math.prod(config.block) == 1 else "local"
    for info in reversed(reductions):
        if info.block_rv.same_as(last_rv):
            continue
        blk = info.block_rv
        for i in range(len(sch.get(blk).writes)):  # a norm's block keeps sum and sum of squares
            sch.set_scope(blk, i, result_scope)
        sch.compute_at(blk, bx, preserve_unit_loops=True)
        _split_rows_and_row(sch, blk, config, n_s, rt)


def _split_rows_and_row(sch, blk, config: Config, n_s: int, rt: int) -> None:
    """Inside the block loop: ``blk``'s rows -> [threadIdx.y, serial] (``thread`` rows a thread),
    its row -> [threadIdx.x, serial] (``rt`` threads, each a strided part, unrolled)."""
    loops = sch.get_loops(blk)[1:]
    b_rows, b_cols = loops[:n_s], loops[n_s:]
    thr, ser = [], []
    for i, loop in enumerate(b_rows):
        t, s_ = sch.split(loop, [config.block[i] // config.thread[i], config.thread[i]], preserve_unit_iters=True)
        thr.append(t)
        ser.append(s_)
    r = sch.fuse(*b_cols) if len(b_cols) > 1 else b_cols[0]
    ro, rtx = sch.split(r, [None, rt], preserve_unit_iters=True)
    sch.reorder(*thr, *ser, rtx, ro)
    sch.bind(sch.fuse(*thr) if n_s > 1 else thr[0], "threadIdx.y")
    sch.bind(rtx, "threadIdx.x")
    unroll(sch, ro)


def _numel(buf) -> int:
    return math.prod(int(d) for d in buf.shape)


def _row_loops_of_one_row(sch, blocks, spatial) -> None:
    """A function of one row (a batch-1 decode step's RMSNorm of ``[1, 1, K]``): an inlined block
    may have lost its unit row loops, which every step below indexes (``loops[:n_s]``); give
    them back, outermost."""
    if math.prod(a.extent for a in spatial) != 1:
        return
    for info in blocks:
        missing = len(spatial) + 1 - len(sch.get_loops(info.block_rv))
        for _ in range(max(0, missing)):
            sch.add_unit_loop(sch.get_loops(info.block_rv)[0])


def _chain(sch, blocks, spatial, reduce):
    """Check the remaining blocks form a row-wise chain: reductions over the same rows (leading
    spatial iters equal to the anchor's) followed by at most one injective block whose leading
    loops are those rows. Returns (reductions, last block) or None."""
    n_s = len(spatial)
    extents = [a.extent for a in spatial]
    r_total = math.prod(a.extent for a in reduce)
    reductions = [b for b in blocks if b.is_reduction()]
    if not reductions or len(blocks) - len(reductions) > 1:
        return None
    last = blocks[-1]
    if not last.is_reduction() and not last.is_injective():
        return None
    for info in blocks:
        loops = sch.get_loops(info.block_rv)
        lead = [int(sch.get(lp).extent) for lp in loops[:n_s]]
        rest = math.prod(int(sch.get(lp).extent) for lp in loops[n_s:])
        if lead != extents or rest != r_total:
            return None
        if info.is_reduction() and any(it.kind != "S" for it in info.iters[:n_s]):
            return None
    if any(not b.is_reduction() for b in blocks[:-1]):
        return None
    return reductions, last
