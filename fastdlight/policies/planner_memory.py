"""Planners of the memory-bound families: elementwise, reductions (row, column, general) and GEMV."""

from __future__ import annotations

import math

from fastdlight.policies.planner import BASE_REGS, ROW_CACHE_BYTES, Planner, pow2_upto, words
from fastdlight.policies.roller import candidate_sizes, ceil_div, largest_pow2_divisor

# -- elementwise ---------------------------------------------------------------------------------


#: lanes of a vector whose values are gathered (a transpose: the input is not contiguous along
#: the vectorized axis) when they are narrower than 32 bits: TVM 0.27 packs 8 gathered fp16
#: lanes with an 8-argument make_uint4, which nvcc rejects; 4 lanes compile
GATHER_MAX_LANES = 4


#: most elements of an elementwise function for which one element a thread is also planned
ONE_ELEMENT_A_THREAD_MAX = 1 << 16


class ElementwisePlanner(Planner):
    """Block = threads × vector elements; thread tile = whole vectors along the innermost axis."""

    kind = "elementwise"
    preferred = (256, 512)

    def __init__(self, info, arch):
        super().__init__(info, arch)
        last = info.spatial_iters[-1]
        inner = [a for a in (*info.reads, info.write) if a.is_param and a.innermost_axis() == last]
        bits = max((a.tensor.bits for a in inner), default=info.write.tensor.bits)
        self.vec = largest_pow2_divisor(self.extents[-1], self.vector_cap(bits))
        gathered = [a.tensor.bits for a in info.reads if a.is_param and a.innermost_axis() != last]
        #: the lanes of every vector (the stores' too: a store packs the gathered values)
        self.lane_cap = GATHER_MAX_LANES if gathered and min(gathered) < 32 else None
        if self.lane_cap:
            self.vec = min(self.vec, self.lane_cap)
        self.nbufs = [a.tensor.bits for a in (*info.reads, info.write) if a.is_param]

    def widths(self, per_iter_run):
        out = super().widths(per_iter_run)
        return {k: min(w, self.lane_cap) for k, w in out.items()} if self.lane_cap else out

    def parallelism(self):
        return math.prod(self.extents) // self.vec

    def axis_candidates(self):
        t = self.arch.max_threads_per_block
        cands = [candidate_sizes(e, t) for e in self.extents[:-1]]
        last = [c for c in candidate_sizes(self.extents[-1], t * self.vec * 4) if c % self.vec == 0 or c < self.vec]
        return [*cands, last]

    def start(self):
        return (1,) * (len(self.extents) - 1) + (min(self.vec, self.extents[-1]),)

    def plans(self, tile):
        base = largest_pow2_divisor(tile[-1], self.vec)
        last = self.info.spatial_iters[-1]
        runs = [base * mult for mult in (1, 2, 4)]
        if self.lane_cap and base > 1 and math.prod(self.extents) <= ONE_ELEMENT_A_THREAD_MAX:
            # a gather (a rotary's halves swapped) may not vectorize at all; then a thread's
            # elements are loaded one after another, and a small function is faster with one
            # element a thread (a decode step's rotary, 3,072 elements: 0.9 against 1.1 us)
            runs.insert(0, 1)
        for run in runs:
            if tile[-1] % run:
                continue
            thread = (1,) * (len(tile) - 1) + (run,)
            regs = BASE_REGS + sum(words(run, b) for b in self.nbufs)
            yield tile, thread, (), (), 1, regs, 0, self.widths({last: run}), (run // base if run >= base else 0,)


# -- reductions ----------------------------------------------------------------------------------


class ReductionPlanner(Planner):
    """Row reductions (the dominant input contiguous along a reduction axis: reduce_thread threads
    split the row, few rows per block) and column reductions (contiguous along a spatial axis:
    vectorized outputs per thread, a serial reduction loop, optionally split over threads)."""

    kind = "reduction"
    #: most rows one block reduces in the row layout
    MAX_ROWS = 64

    def __init__(self, info, arch):
        super().__init__(info, arch)
        dom = info.read(info.dominant_read)
        self.dom = dom
        it = dom.innermost_axis()
        self.inner = it in info.reduce_iters
        self.acc_bits = info.write.tensor.bits
        self.in_bits = [a.tensor.bits for a in info.reads if a.is_param]
        if self.inner:
            self.rk = info.reduce_iters.index(it)
        else:
            self.rk = len(self.rextents) - 1
            self.sc = info.spatial_iters.index(it) if it in info.spatial_iters else len(self.extents) - 1

    def parallelism(self):
        vec = self.vector_cap(self.dom.tensor.bits)
        return math.prod(self.extents) * max(1, math.prod(self.rextents) // vec)

    def axis_candidates(self):
        if self.inner:
            return [candidate_sizes(e, self.MAX_ROWS) for e in self.extents]
        t = self.arch.max_threads_per_block
        cands = [candidate_sizes(e, 16) for e in self.extents]
        # whole vectors of the contiguous output axis per block (a block never splits a sector)
        ext = self.extents[self.sc]
        vj = largest_pow2_divisor(ext, self.vector_cap(self.dom.tensor.bits))
        cands[self.sc] = [c for c in candidate_sizes(ext, t * vj) if c % vj == 0] or [ext]
        return cands

    def _rstep(self, step):
        r = [1] * len(self.rextents)
        r[self.rk] = step
        return tuple(r)

    def _rthreads(self, rt):
        r = [1] * len(self.rextents)
        r[self.rk] = rt
        return tuple(r)

    def plans(self, tile):
        yield from (self._inner(tile) if self.inner else self._outer(tile))

    def _smem(self, threads, outputs, rt):
        # cross-thread reduction scratch: one partial per warp and output (allreduce)
        if rt <= 1:
            return 0
        return ceil_div(threads, self.arch.warp_size) * outputs * self.acc_bits // 8 * 2

    def _inner(self, tile):
        k = self.rextents[self.rk]
        vk = largest_pow2_divisor(k, self.vector_cap(self.dom.tensor.bits))
        rk_iter = self.info.reduce_iters[self.rk]
        max_t = self.arch.max_threads_per_block
        for rows_per_thread in (1, 2, 4):
            if tile[-1] % rows_per_thread:
                continue
            thread = (1,) * (len(tile) - 1) + (rows_per_thread,)
            spatial_threads = math.prod(tile) // rows_per_thread
            for rt in pow2_upto(1, max_t // spatial_threads):
                if rt > k:
                    break
                w = min(vk, largest_pow2_divisor(k // rt if k % rt == 0 else 1, vk))
                for u in (1, 2, 4):
                    step = rt * w * u
                    if step > k or (u > 1 and k % step):
                        continue
                    threads = spatial_threads * rt
                    loads = rows_per_thread * w * u
                    regs = BASE_REGS + words(rows_per_thread, 32) + sum(words(loads, b) for b in self.in_bits)
                    smem = self._smem(threads, math.prod(tile), rt)
                    vec = self.widths({rk_iter: w})
                    yield tile, thread, self._rstep(step), self._rthreads(rt), 1, regs, smem, vec, (u, rows_per_thread)

    def _outer(self, tile):
        k = self.rextents[self.rk] if self.rextents else 1
        vj = largest_pow2_divisor(self.extents[self.sc], self.vector_cap(self.dom.tensor.bits))
        sc_iter = self.info.spatial_iters[self.sc]
        max_t = self.arch.max_threads_per_block
        base = largest_pow2_divisor(tile[self.sc], vj)
        for mult in (1, 2):
            tj = base * mult
            if tile[self.sc] % tj:
                continue
            thread = [1] * len(tile)
            thread[self.sc] = tj
            thread = tuple(thread)
            spatial_threads = math.prod(b // t for b, t in zip(tile, thread))
            for rt in pow2_upto(1, max_t // spatial_threads):
                if rt > k:
                    break
                for u in (1, 4, 8):
                    step = rt * u
                    if step > k:
                        continue
                    threads = spatial_threads * rt
                    regs = BASE_REGS + words(tj, 32) + sum(words(tj * u, b) for b in self.in_bits)
                    smem = self._smem(threads, math.prod(tile), rt)
                    yield tile, thread, self._rstep(step), self._rthreads(rt), 1, regs, smem, self.widths(
                        {sc_iter: tj}
                    ), (mult, u)


class GeneralReductionPlanner(ReductionPlanner):
    """Softmax-like chains: the reduction layout on the last reduction block. The block's rows
    are read once when they fit the template's shared-memory row cache, else once per pass
    (every reduction, plus the trailing elementwise block)."""

    kind = "general_reduction"
    MAX_ROWS = 16

    def __init__(self, info, arch):
        super().__init__(info, arch)
        trailing = info.blocks[-1] != info.output_block
        self.passes = len(info.reduction_blocks) + int(trailing)

    def row_cache(self, tile) -> int:
        """Shared bytes of the block's input rows when they fit the row cache, else 0."""
        ext = self.info.iter_extents(tile)
        b = sum(math.prod(a.region(ext)) * a.tensor.bits // 8 for a in self.info.reads if a.is_param)
        return b if b <= min(ROW_CACHE_BYTES, self.arch.smem_per_block) else 0

    def traffic(self, tile, rstep) -> int:
        base = super().traffic(tile, rstep)
        return base if self.row_cache(tile) else base * self.passes

    def plans(self, tile):
        cache = self.row_cache(tile)
        for plan in super().plans(tile):
            *head, smem, vec, pref = plan
            yield (*head, smem + cache, vec, pref)


# -- GEMV ----------------------------------------------------------------------------------------


class GemvPlanner(Planner):
    """Y[m, n] = X[m, k] W[n, k]: all of M in every block, 1–16 rows of N per block, reduce_thread
    threads along k with 128-bit loads of W."""

    kind = "gemv"
    MAX_ROWS = 16
    #: accumulators one thread may hold (all M rows × its N rows)
    MAX_OUTPUTS_PER_THREAD = 16

    def __init__(self, info, arch):
        super().__init__(info, arch)
        self.w = info.read(info.gemv_weight)
        w_deps = {i for i in info.spatial_iters if self.w.depends_on(i)}
        self.n_axes = [j for j, i in enumerate(info.spatial_iters) if i in w_deps]
        self.k = self.rextents[0]
        self.in_bits = {a.name: a.tensor.bits for a in info.reads if a.is_param}

    def parallelism(self):
        n = math.prod(self.extents[j] for j in self.n_axes)
        return n * max(1, self.k // self.vector_cap(self.w.tensor.bits))

    def axis_candidates(self):
        return [
            candidate_sizes(e, self.MAX_ROWS) if j in self.n_axes else [e] for j, e in enumerate(self.extents)
        ]

    def plans(self, tile):
        vk = largest_pow2_divisor(self.k, self.vector_cap(self.w.tensor.bits))
        m_rows = math.prod(t for j, t in enumerate(tile) if j not in self.n_axes)
        k_iter = self.info.reduce_iters[0]
        n_tile = math.prod(tile[j] for j in self.n_axes)
        options = [False, True] if n_tile > 1 else [False]
        for whole_n in options:  # each thread computes all N rows of the block, or one
            if whole_n and m_rows * n_tile > self.MAX_OUTPUTS_PER_THREAD:
                continue
            thread = tuple(t if (j not in self.n_axes or whole_n) else 1 for j, t in enumerate(tile))
            n_threads = 1 if whole_n else n_tile
            # a warp along k at least, unless k itself is shorter (a 2x2 GEMV has k = 2)
            first = min(self.arch.warp_size, 1 << (self.k.bit_length() - 1))
            for rt in pow2_upto(first, self.arch.max_threads_per_block // n_threads):
                if rt > max(first, self.k // vk) or rt > 256:
                    break
                w = largest_pow2_divisor(self.k // rt if self.k % rt == 0 else 1, vk)
                for u in (1, 2, 4):
                    step = rt * w * u
                    if step > self.k:
                        continue
                    threads = n_threads * rt
                    outs = m_rows * (n_tile if whole_n else 1)
                    rows_n = n_tile if whole_n else 1
                    regs = (
                        BASE_REGS
                        + words(outs, 32)
                        + words(rows_n * w * u, self.w.tensor.bits)
                        + sum(words(m_rows * w * u, b) for name, b in self.in_bits.items() if name != self.w.name)
                    )
                    smem = ceil_div(threads, self.arch.warp_size) * math.prod(tile) * 4
                    vec = self.widths({k_iter: w})
                    yield tile, thread, (step,), (rt,), 1, regs, smem, vec, (u, int(whole_n))
