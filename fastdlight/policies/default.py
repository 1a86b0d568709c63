"""DefaultPolicy: Roller for CUDA cores (every family except tensor-core matmul).

Per function (see :mod:`.analysis` for the families) it runs Roller's recipe:

1. best-first search over output tiles of the output-defining block (:func:`roller.best_first`),
   each step enlarging one axis to its next candidate size (factors of the extent, powers of two
   below it), at most ``MAX_VISITS`` tiles;
2. per tile, a family "planner" picks the reduction step (coalescing), the threads (prefer
   4–8 warps, split over spatial axes to minimize the per-thread footprint, leftover threads on
   the reduction) and vector widths, and discards what exceeds the arch's shared memory
   (``smem_per_block``: the 48 KB default, CUDA-core templates do not opt in), registers or
   threads;
3. every candidate config is scored ``(traffic + 1) × waves`` (:mod:`.roller`), with waves from
   the blocks per SM allowed by threads, registers, shared memory and ``max_blocks_per_sm``.

``emit_config(topk)`` returns the ``topk`` best distinct configs, cost ascending; equal costs are
ordered by a family preference (thread count in the preferred range, …) then by the config's
text, so the result is deterministic.
"""

from __future__ import annotations

import math

from .analysis import FuncInfo, analyze
from .config import Config
from .roller import (
    MAX_VECTOR_BITS,
    best_first,
    block_traffic,
    blocks_per_sm,
    candidate_sizes,
    ceil_div,
    coalescing_score,
    largest_pow2_divisor,
    num_blocks,
    roller_score,
    waves,
)

#: visited-tile budget of the search (Roller stops around 2000)
MAX_VISITS = 2000
#: registers a thread needs besides its data: indices, pointers, loop counters (estimate)
BASE_REGS = 16
#: the same for the shared-memory matmul template (3-axis nest; +4 per further axis)
MATMUL_BASE_REGS = 24
#: L2 bandwidth relative to DRAM bandwidth (model parameter, ~3x on A100/H100): matmul tiles
#: are re-read by neighbouring blocks, mostly from L2
L2_OVER_DRAM = 3.0
#: weight of memory time on top of max(compute, memory) (model parameter)
TRAFFIC_TIEBREAK = 0.1
#: throughput left when one block per SM idles the SM at every barrier (model parameter)
SINGLE_BLOCK_EFFICIENCY = 0.85
#: resident warps per SM below which memory latency is no longer hidden (model parameter)
LATENCY_HIDING_WARPS = 8
#: the matmul template pads every shared row to a multiple of a 32-bank line plus 16 bytes
SHARED_ROW_BYTES, SHARED_ROW_PAD = 128, 16
#: input rows the general-reduction template keeps in shared memory (its default budget):
#: when a block's rows fit, the input crosses DRAM once instead of once per pass
ROW_CACHE_BYTES = 40 * 1024


def _words(elems: int, bits: int) -> int:
    """32-bit registers holding ``elems`` values of ``bits``."""
    return ceil_div(elems * bits, 32)


def _pow2_upto(lo: int, hi: int) -> list[int]:
    out, p = [], 1
    while p <= hi:
        if p >= lo:
            out.append(p)
        p *= 2
    return out


class _Planner:
    """Family-specific part of the search: axis candidates, start tile, and for one tile the
    thread/reduction assignments (:meth:`plans`, each scored by :meth:`score`)."""

    kind = ""
    #: preferred threads per block (4–8 warps); outside it a config ranks lower on equal cost
    preferred = (128, 256)

    def __init__(self, info: FuncInfo, arch):
        self.info = info
        self.arch = arch
        self.extents = tuple(a.extent for a in info.spatial_axes)
        self.rextents = tuple(a.extent for a in info.reduce_axes)
        self._traffic: dict = {}
        self._min_threads = None

    def parallelism(self) -> int:
        """Threads the problem can keep busy (roughly: one per vector of work)."""
        return math.prod(self.extents)

    @property
    def min_threads(self) -> int:
        """Fewest threads an emitted config may have: the preferred minimum (4 warps; 8 for
        elementwise), halved down to one warp only when the problem is too small to give
        every SM a block that large."""
        if self._min_threads is None:
            lo, work = self.preferred[0], self.parallelism()
            while lo > self.arch.warp_size and work < lo * self.arch.sm_count:
                lo //= 2
            self._min_threads = lo
        return self._min_threads

    # -- to implement ---------------------------------------------------------------------
    def axis_candidates(self) -> list[list[int]]:
        raise NotImplementedError

    def start(self) -> tuple[int, ...]:
        return tuple(c[0] for c in self.axis_candidates())

    def plans(self, tile):
        """Yield ``(block, thread, rstep, reduce_thread, stages, regs, smem, vectorize, pref)``."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------
    def traffic(self, tile, rstep) -> int:
        key = (tile, rstep)
        t = self._traffic.get(key)
        if t is None:
            t = self._traffic[key] = block_traffic(self.info, tile, rstep if rstep else None, self.arch)
        return t

    def tier(self, threads: int) -> int:
        lo, hi = self.preferred
        if lo <= threads <= hi:
            return 0
        if lo // 2 <= threads <= hi * 2:
            return 1
        return 2

    def score(self, block, thread, rstep, reduce_thread, stages, regs, smem, vectorize, pref=(), async_copy=False):
        """(rank key, Config, emittable, resources) or None when over the arch's budget."""
        arch = self.arch
        threads = math.prod(b // t for b, t in zip(block, thread)) * math.prod(reduce_thread or (1,))
        if threads > arch.max_threads_per_block or smem > arch.smem_per_block:
            return None
        if regs > arch.max_regs_per_thread or regs * threads > arch.regs_per_block:
            return None
        per_sm = blocks_per_sm(arch, threads, regs, smem)
        if per_sm == 0:
            return None
        nblocks = num_blocks(self.extents, block)
        cost = self.cost(block, thread, rstep, threads, per_sm, nblocks)
        covers_all = all(b >= e for b, e in zip(block, self.extents))
        emittable = covers_all or (threads % arch.warp_size == 0 and threads >= self.min_threads)
        cfg = Config(
            kind=self.kind,
            block=tuple(block),
            thread=tuple(thread),
            rstep=tuple(rstep),
            reduce_thread=tuple(reduce_thread),
            vectorize=vectorize,
            pipeline_stages=stages,
            use_async_copy=async_copy,
            cost=float(cost),
        )
        res = {"threads": threads, "regs": regs, "smem": smem, "blocks_per_sm": per_sm, "blocks": nblocks}
        # on equal cost, a grid that leaves SMs idle ranks lower
        return (cost, nblocks < arch.sm_count, self.tier(threads), *pref), cfg, emittable, res

    def cost(self, block, thread, rstep, threads, per_sm, nblocks) -> float:
        """Roller's rank: (traffic + 1) × waves."""
        return roller_score(self.traffic(tuple(block), tuple(rstep)), waves(self.arch, nblocks, per_sm))

    def vector_cap(self, bits: int) -> int:
        return max(1, MAX_VECTOR_BITS // bits)

    def widths(self, per_iter_run: dict[int, int]) -> dict[str, int]:
        """Vector width per parameter buffer whose innermost index is walked with unit stride by
        block iter ``it`` holding a per-thread run of ``per_iter_run[it]`` elements: the largest
        power of two <= 128 bit dividing that run and the buffer's innermost dimension."""
        out = {}
        for acc in (*self.info.reads, self.info.write):
            if not acc.is_param:
                continue
            it = acc.innermost_axis()
            if it is None or it not in per_iter_run:
                continue
            # a constant offset in the innermost index must stay vector-aligned too
            offsets = [load[-1][-1] for load in acc.linear]
            run = math.gcd(per_iter_run[it], *offsets)
            w = largest_pow2_divisor(math.gcd(run, acc.tensor.shape[-1]), self.vector_cap(acc.tensor.bits))
            if w > 1:
                out[acc.name] = w
        return out


# -- elementwise ---------------------------------------------------------------------------------


#: lanes of a vector whose values are gathered (a transpose: the input is not contiguous along
#: the vectorized axis) when they are narrower than 32 bits: TVM 0.27 packs 8 gathered fp16
#: lanes with an 8-argument make_uint4, which nvcc rejects; 4 lanes compile
GATHER_MAX_LANES = 4


class _Elementwise(_Planner):
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
        for mult in (1, 2, 4):
            run = base * mult
            if tile[-1] % run:
                continue
            thread = (1,) * (len(tile) - 1) + (run,)
            regs = BASE_REGS + sum(_words(run, b) for b in self.nbufs)
            yield tile, thread, (), (), 1, regs, 0, self.widths({last: run}), (mult,)


# -- reductions ----------------------------------------------------------------------------------


class _Reduction(_Planner):
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
            for rt in _pow2_upto(1, max_t // spatial_threads):
                if rt > k:
                    break
                w = min(vk, largest_pow2_divisor(k // rt if k % rt == 0 else 1, vk))
                for u in (1, 2, 4):
                    step = rt * w * u
                    if step > k or (u > 1 and k % step):
                        continue
                    threads = spatial_threads * rt
                    loads = rows_per_thread * w * u
                    regs = BASE_REGS + _words(rows_per_thread, 32) + sum(_words(loads, b) for b in self.in_bits)
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
            for rt in _pow2_upto(1, max_t // spatial_threads):
                if rt > k:
                    break
                for u in (1, 4, 8):
                    step = rt * u
                    if step > k:
                        continue
                    threads = spatial_threads * rt
                    regs = BASE_REGS + _words(tj, 32) + sum(_words(tj * u, b) for b in self.in_bits)
                    smem = self._smem(threads, math.prod(tile), rt)
                    yield tile, thread, self._rstep(step), self._rthreads(rt), 1, regs, smem, self.widths(
                        {sc_iter: tj}
                    ), (mult, u)


class _GeneralReduction(_Reduction):
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


class _Gemv(_Planner):
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
            for rt in _pow2_upto(first, self.arch.max_threads_per_block // n_threads):
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
                        + _words(outs, 32)
                        + _words(rows_n * w * u, self.w.tensor.bits)
                        + sum(_words(m_rows * w * u, b) for name, b in self.in_bits.items() if name != self.w.name)
                    )
                    smem = ceil_div(threads, self.arch.warp_size) * math.prod(tile) * 4
                    vec = self.widths({k_iter: w})
                    yield tile, thread, (step,), (rt,), 1, regs, smem, vec, (u, int(whole_n))


# -- CUDA-core matmul / conv ---------------------------------------------------------------------


#: multiply-adds one thread's unrolled k step may hold (micro tile x rstep). nvcc time grows
#: with it: fp16 NHWC conv candidates of 8x8 x 32 took 11-19 s each on a 2-core machine, 8x8 x
#: 16 took 3-7 s; fp32 4096^3, the best CUDA-core GEMM, is 8x8 x 16
MAX_UNROLLED_FMAS = 1024


class _Matmul(_Planner):
    """Shared-memory tiled matmul: block tile over all spatial axes, a thread micro tile of
    1–8 × 1–8 on the last two (1 elsewhere), rstep 8–32 picked by coalescing, 1 or 2 stages."""

    kind = "matmul"
    MICRO = (1, 2, 4, 8)
    RSTEPS = (8, 16, 32)
    #: largest block tile per axis: the micro axes, and the others (batch, conv N/P)
    MAX_TILE_MICRO = 256
    MAX_TILE_OTHER = 64

    def __init__(self, info, arch):
        super().__init__(info, arch)
        self.inputs = [a for a in info.reads if a.is_param]
        self.micro = self._micro_axes()
        # the reduction axis rstep variants scale: the last one walked contiguously by an input
        inner = [info.reduce_iters.index(a.innermost_axis()) for a in self.inputs if a.innermost_axis() in info.reduce_iters]
        self.principal = max(inner) if inner else len(self.rextents) - 1
        self.acc_bits = info.write.tensor.bits
        self._rstep_cache: dict = {}
        self.base_regs = MATMUL_BASE_REGS + 4 * max(0, len(info.iter_kinds) - 3)

    def _micro_axes(self) -> tuple[int, ...]:
        """The two axes of the thread micro tile: GEMM's M and N, i.e. the innermost spatial
        axis only the first input (data) moves and the innermost only the others (weights)
        move: (i, j) of a matmul, (q, k) of an NHWC conv, (k, q) of an NCHW one, whose last two
        axes (p, q) are both the data's. Else the last two axes."""
        n = len(self.extents)
        fallback = tuple(range(max(0, n - 2), n))
        if len(self.inputs) < 2:
            return fallback
        data, weights = self.inputs[0], self.inputs[1:]
        iters = self.info.spatial_iters

        def only(acc, others):
            return [j for j, it in enumerate(iters) if acc.depends_on(it) and not any(o.depends_on(it) for o in others)]

        m = only(data, weights)
        nn = [j for w in weights for j in only(w, [data])]
        return tuple(sorted((max(m), max(nn)))) if m and nn else fallback

    def parallelism(self):
        return math.prod(self.extents) // 16  # a 4 x 4 micro tile per thread

    def axis_candidates(self):
        return [
            candidate_sizes(e, self.MAX_TILE_MICRO if j in self.micro else self.MAX_TILE_OTHER)
            for j, e in enumerate(self.extents)
        ]

    def start(self):
        cands = self.axis_candidates()
        return tuple(
            max([c for c in cands[j] if c <= 16] or [1]) if j in self.micro else 1 for j in range(len(self.extents))
        )

    def cost(self, block, thread, rstep, threads, per_sm, nblocks) -> float:
        """Predicted seconds on the busiest SM. Plain (traffic + 1) × waves ignores that the
        blocks resident on one SM share its bandwidth and FMA units, so it ranks small tiles
        (more blocks per wave) first; measured on an H200, 32×64 tiles ran at 0.59× cuBLAS
        and 128×128 ones at 0.92×. Here each block costs the larger of its memory time (its
        tile traffic over the SM's share of L2 bandwidth) and its compute time (FMAs plus the
        shared-memory loads feeding the micro tile), the busiest SM runs ceil(blocks / SMs)
        of them, and too few resident warps to hide latency scale the time up."""
        arch = self.arch
        flops = 2 * math.prod(block) * math.prod(self.rextents)
        micro = [thread[j] for j in self.micro] or [1]
        # per k step a thread issues prod(micro) FMAs and sum(micro) shared loads
        compute = flops / (arch.peak_fp32_tflops * 1e12 / arch.sm_count) * (1 + sum(micro) / math.prod(micro))
        bandwidth = arch.dram_bandwidth_gbs * 1e9 * L2_OVER_DRAM / arch.sm_count
        memory = self.traffic(tuple(block), tuple(rstep)) / bandwidth  # whole reduction
        per_busiest = ceil_div(nblocks, arch.sm_count)
        warps = min(per_sm, per_busiest) * ceil_div(threads, arch.warp_size)
        hide = min(1.0, warps / LATENCY_HIDING_WARPS)
        if min(per_sm, per_busiest) < 2:
            hide *= SINGLE_BLOCK_EFFICIENCY  # nothing runs while the lone block waits at a barrier
        # among compute-bound tiles, the one moving fewer bytes still wins (L2 contention)
        return per_busiest * (max(compute, memory) + TRAFFIC_TIEBREAK * memory) / hide * 1e6  # µs

    def _coalescing(self, tile, rstep) -> float:
        ext = self.info.iter_extents(tile, rstep)
        scores = [coalescing_score(a, a.region(ext), self.arch) for a in self.inputs]
        return sum(scores) / max(1, len(scores))

    def select_rstep(self, tile) -> tuple[int, ...]:
        """Roller's reduction step: grow reduction axes (factors / powers of two) while the
        mean coalescing score of the input tiles improves, capped at max(RSTEPS) elements."""
        key = tile
        if key in self._rstep_cache:
            return self._rstep_cache[key]
        cap = max(self.RSTEPS)
        cands = [candidate_sizes(e, cap) for e in self.rextents]
        r = [1] * len(self.rextents)
        best = self._coalescing(tile, r)
        while True:
            trial = None
            for ax in reversed(range(len(r))):  # prefer the innermost axes on ties
                nxt = [c for c in cands[ax] if c > r[ax]]
                if not nxt or math.prod(r) // r[ax] * nxt[0] > cap:
                    continue
                r2 = list(r)
                r2[ax] = nxt[0]
                s = self._coalescing(tile, r2)
                if s > best + 1e-9 and (trial is None or s > trial[0] + 1e-9):
                    trial = (s, r2)
            if trial is None:
                break
            best, r = trial
        # at least min(RSTEPS) elements per step when the reduction allows (fewer barriers)
        lo = min(self.RSTEPS)
        ax = self.principal
        while math.prod(r) < lo and r[ax] < self.rextents[ax]:
            nxt = [c for c in candidate_sizes(self.rextents[ax]) if c > r[ax]]
            r[ax] = nxt[0]
        self._rstep_cache[key] = tuple(r)
        return tuple(r)

    def _rsteps(self, tile):
        base = self.select_rstep(tile)
        out = [base]
        if self.rextents:
            ax = self.principal
            others = math.prod(base) // base[ax]
            for s in self.RSTEPS:
                if s <= self.rextents[ax] and s * others <= max(self.RSTEPS) * max(1, others):
                    r = list(base)
                    r[ax] = s
                    if tuple(r) not in out:
                        out.append(tuple(r))
        return out

    def _bounded_rsteps(self, tile, thread):
        """The rsteps whose unrolled body (outputs per thread x rstep multiply-adds) stays within
        MAX_UNROLLED_FMAS; the smallest one when none does."""
        rsteps = self._rsteps(tile)
        outs = math.prod(thread)
        kept = [r for r in rsteps if outs * math.prod(r) <= MAX_UNROLLED_FMAS]
        return kept or [min(rsteps, key=math.prod)]

    def _thread_tiles(self, tile):
        """Micro tiles minimizing the per-thread input footprint per output, among thread counts
        in the preferred range first: the best one and, when it is not square, its transpose
        (equal by every measure here, yet not equally fast: on an H100, fp32 1024³ with 64×64
        tiles and cp.async ran at 34.3 TFLOPS with 8×4 and 31.4 with 4×8). More rows per thread
        first. Each entry is (key, thread, regs, threads)."""
        found = []
        ones = (1,) * len(self.rextents)
        for t0 in self.MICRO:
            for t1 in self.MICRO:
                thread = [1] * len(tile)
                ok = True
                for j, t in zip(self.micro, (t0, t1) if len(self.micro) == 2 else (t1,)):
                    if tile[j] % t:
                        ok = False
                    thread[j] = t
                if not ok or (len(self.micro) == 1 and t0 != 1):
                    continue
                thread = tuple(thread)
                threads = math.prod(b // t for b, t in zip(tile, thread))
                if threads > self.arch.max_threads_per_block:
                    continue
                ext = self.info.iter_extents(thread, ones)
                frag = sum(_words(math.prod(a.region(ext)), a.tensor.bits) for a in self.inputs)
                outs = math.prod(thread)
                # fragments are double-buffered across the unrolled k loop; index math grows
                # with the loop nest (measured with nvcc on the matmul template: 4x4 ~56-63,
                # 8x8 ~126, conv 4x4 ~72-79 registers)
                regs = self.base_regs + _words(outs, max(32, self.acc_bits)) + 2 * frag
                if regs > self.arch.max_regs_per_thread:
                    continue
                # 4-8 outputs per thread along each micro axis where the block allows it: the
                # register reuse that makes CUDA-core matmul compute- rather than load-bound
                small = sum(t < min(4, tile[j]) for j, t in zip(self.micro, (thread[j] for j in self.micro)))
                key = (
                    small,
                    self.tier(threads),
                    threads % self.arch.warp_size != 0,
                    frag / outs,
                    -threads,
                )
                found.append((key, thread, regs, threads))
        if not found:
            return []
        top = min(f[0] for f in found)
        best = [f for f in found if f[0] == top]
        return sorted(best, key=lambda f: [-f[1][j] for j in self.micro])

    def plans(self, tile):
        for orient, (_, thread, regs, threads) in enumerate(self._thread_tiles(tile)):
            yield from self._plans(tile, thread, regs, threads, orient)

    def _plans(self, tile, thread, regs, threads, orient):
        last = self.info.spatial_iters[-1]
        for rstep in self._bounded_rsteps(tile, thread):
            ext = self.info.iter_extents(tile, rstep)
            stage_bytes = sum(self._shared_bytes(a, a.region(ext)) for a in self.inputs)
            stage_words = sum(_words(math.prod(a.region(ext)), a.tensor.bits) for a in self.inputs)
            vec = self._load_widths(ext, threads)
            out_w = self.widths({last: thread[-1]}).get(self.info.write.name)
            if out_w:
                vec[self.info.write.name] = out_w
            # K steps of 64 bytes per row measured fastest with double buffering (H200, fp32
            # 4096³: rstep 16 beat 8 and 32); Roller's coalescing pick is the fallback order
            step_bytes = rstep[self.principal] * self.inputs[0].tensor.bits // 8 if rstep else 64
            off = abs(math.log2(max(1, step_bytes) / 64))
            ratio = -min(1.0, self._coalescing(tile, rstep))
            # register-staged double buffering (one shared copy, each thread holds its share of
            # the next tile), cp.async double buffering (two shared copies), or none
            # ptxas overlaps the staged registers with dead fragment registers: the 128×128/8×8
            # rstep-16 config estimated at 136 used 117-127 (nvcc 13, sm_90a); count half of them
            staged = ceil_div(stage_words, 2 * threads)
            yield tile, thread, rstep, (), 2, regs + staged, stage_bytes, vec, (off, ratio, 0, orient)
            if self.arch.has_async_copy:
                yield tile, thread, rstep, (), 2, regs, 2 * stage_bytes, vec, (off, ratio, 1, orient), True
            yield tile, thread, rstep, (), 1, regs, stage_bytes, vec, (off, ratio, 2, orient)

    def _shared_bytes(self, acc, region) -> int:
        """Shared-memory bytes of one input tile as the matmul template lays it out: dims indexed
        only by reduction iterators outermost, rows padded to 128-byte bank lines + 16 bytes."""
        if acc.linear is None:
            return math.prod(region) * acc.tensor.bits // 8
        red = set(self.info.reduce_iters)
        only_r = [
            all(all(c == 0 or i in red for i, c in enumerate(load[d][:-1])) for load in acc.linear)
            for d in range(len(region))
        ]
        order = [d for d in range(len(region)) if only_r[d]] + [d for d in range(len(region)) if not only_r[d]]
        shape = [region[d] for d in order]
        nbytes = acc.tensor.bits // 8 or 1
        row = shape[-1]
        if len(shape) >= 2:
            factor, offset = SHARED_ROW_BYTES // nbytes, SHARED_ROW_PAD // nbytes
            row = ceil_div(row - offset, factor) * factor + offset if row > offset else offset
        return math.prod(shape[:-1]) * row * nbytes

    def _load_widths(self, ext, threads) -> dict[str, int]:
        """Vector width of each input's cooperative global->shared copy: divides the tile's
        innermost extent and the buffer's, and (when possible) splits evenly over the threads."""
        out = {}
        for a in self.inputs:
            region = a.region(ext)
            if a.innermost_axis() is None:
                continue
            cap = self.vector_cap(a.tensor.bits)
            w = largest_pow2_divisor(math.gcd(region[-1], a.tensor.shape[-1]), cap)
            while w > 1 and math.prod(region) % (w * threads):
                w //= 2
            if w > 1:
                out[a.name] = w
        return out


_PLANNERS = {
    "elementwise": _Elementwise,
    "reduction": _Reduction,
    "general_reduction": _GeneralReduction,
    "gemv": _Gemv,
    "matmul": _Matmul,
}


class DefaultPolicy:
    """Roller on CUDA cores. ``DefaultPolicy(func, arch, opt_shapes).emit_config(topk)``."""

    def __init__(self, func, arch, opt_shapes: dict | None = None, family: str | None = None):
        """``family``: plan for another template than the analysis picks, where it applies
        (a GEMV is also a matmul: benchmarks compare the two templates on decode shapes)."""
        self.arch = arch
        self.info = func if isinstance(func, FuncInfo) else analyze(func, opt_shapes)
        kind = family or self.info.kind
        if family == "matmul" and self.info.kind not in ("matmul", "gemv"):
            raise ValueError(f"a {self.info.kind} function cannot be planned as a matmul")
        planner = _PLANNERS.get(kind)
        if planner is None or (kind == "gemv" and self.info.gemv_weight is None):
            raise ValueError(f"DefaultPolicy cannot handle op family {kind!r} here")
        self.planner = planner(self.info, arch)
        self.visited = 0
        self._resources: dict = {}

    def emit_config(self, topk: int = 10) -> list[Config]:
        """The ``topk`` best distinct configs, best first (each carries its predicted ``cost``)."""
        if topk <= 0:
            return []
        best: dict[Config, tuple] = {}
        planner = self.planner
        cands = planner.axis_candidates()

        def evaluate(tile):
            top = None
            for plan in planner.plans(tile):
                scored = planner.score(*plan)
                if scored is None:
                    continue
                key, cfg, emittable, res = scored
                top = key[0] if top is None else min(top, key[0])
                if not emittable:
                    continue
                full = (*key, repr(cfg))
                if cfg not in best or full < best[cfg][0]:
                    best[cfg] = (full, cfg, res)
            return top

        def neighbors(tile):
            for j, c in enumerate(cands):
                nxt = [s for s in c if s > tile[j]]
                if nxt:
                    yield tile[:j] + (nxt[0],) + tile[j + 1 :]

        self.visited = best_first(planner.start(), neighbors, evaluate, MAX_VISITS)
        if not best:
            raise ValueError(
                f"DefaultPolicy found no config within {self.arch.name}'s limits for "
                f"{self.info.kind} {[a.extent for a in self.info.spatial_axes]}"
            )
        ranked = _diverse(sorted(best.values(), key=lambda kv: kv[0]), topk)
        self._resources = {cfg: res for _, cfg, res in ranked}
        return [cfg for _, cfg, _ in ranked]

    def resources(self, config: Config) -> dict:
        """What the policy assumed for an emitted config: threads, registers per thread (estimate),
        shared-memory bytes, resident blocks per SM and grid size."""
        return dict(self._resources[config])


def _diverse(ranked: list, topk: int) -> list:
    """The ``topk`` best entries, first taking one per (block tile, thread tile, pipelining) —
    variants of one such shape (reduction steps, vector widths) are usually close in speed, so
    measuring more shapes pays off — then filling up in rank order; returned in rank order."""
    picked, seen, rest = [], set(), []
    for entry in ranked:
        cfg = entry[1]
        key = (cfg.block, cfg.thread, cfg.pipeline_stages, cfg.use_async_copy)
        if key in seen:
            rest.append(entry)
            continue
        seen.add(key)
        picked.append(entry)
        if len(picked) == topk:
            break
    picked += rest[: topk - len(picked)]
    return sorted(picked, key=lambda kv: kv[0])


__all__ = ["DefaultPolicy"]
