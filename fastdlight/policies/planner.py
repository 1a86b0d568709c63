"""The planner shared by DefaultPolicy's op families: per output tile, the threads, reduction
step and vector widths of one family's template, checked against the SM's limits and scored
(see :mod:`.default` for the search that drives it)."""

from __future__ import annotations

import math

from fastdlight.analysis.func_info import FuncInfo
from fastdlight.config import Config
from fastdlight.policies.roller import (
    MAX_VECTOR_BITS,
    block_traffic,
    blocks_per_sm,
    ceil_div,
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


def words(elems: int, bits: int) -> int:
    """32-bit registers holding ``elems`` values of ``bits``."""
    return ceil_div(elems * bits, 32)


def pow2_upto(lo: int, hi: int) -> list[int]:
    out, p = [], 1
    while p <= hi:
        if p >= lo:
            out.append(p)
        p *= 2
    return out


class Planner:
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
    def kernel_of(self, config: Config) -> Config:
        """``config`` with the settings that do not change the kernel this family's template
        builds from it reset to their defaults: two configs with one kernel are built once."""
        return config

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
