"""Roller's hardware-aligned cost model, shared by DefaultPolicy and TensorCorePolicy.

Stable API (keep signatures; everything takes plain ints/tuples plus ``FuncInfo``/``Access`` from
:mod:`.analysis` and an ``arch.CUDA``):

* ``candidate_sizes(extent, limit)`` – tile sizes worth trying for one axis: factors of the
  extent plus powers of two below it (those pad), ascending; ``prime_factors(n)`` – the factors
  it builds them from, by trial division bounded for huge extents.
* ``largest_pow2_divisor(n, cap)`` – vector-width helper.
* ``contiguous_run(access, region)`` – elements of the longest run contiguous in memory.
* ``coalesced_bytes(access, region, transaction)`` – bytes moved when every run is rounded up to
  whole memory transactions.
* ``coalescing_score(access, region, arch)`` – 1.0 when a run fills a read transaction
  (``arch.transaction_bytes_read``), proportionally less otherwise.
* ``block_traffic(info, tile, rstep, arch)`` – global-memory bytes one thread block moves for its
  output tile over the whole reduction, loading ``rstep`` per step (runs rounded to 32-byte
  sectors, ``arch.transaction_bytes_write``).
* ``blocks_per_sm(arch, threads, regs_per_thread, smem_bytes)`` – occupancy bound.
* ``num_blocks(extents, tile)``, ``waves(arch, blocks, per_sm)``.
* ``roller_score(traffic, waves)`` – ``(traffic + 1) * waves``, lower is better.
* ``best_first(start, neighbors, evaluate, limit)`` – the tile search driver.

Footprints themselves live on the analysis result: ``analyze(func).footprint(tile, rstep)`` /
``.footprint_bytes(...)`` (per input, closed form) and ``.iter_extents(tile, rstep)`` (what
``Access.region`` takes).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Sequence

from fastdlight.analysis.func_info import Access, FuncInfo

#: widest global-memory vector access (LDG.128 / STG.128), in bits
MAX_VECTOR_BITS = 128


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def largest_pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two <= cap that divides n (1 for n == 0 is avoided by callers)."""
    w = 1
    while w * 2 <= cap and n % (w * 2) == 0:
        w *= 2
    return w


#: trial division stops at this factor: the factors found are exact below TRIAL_FACTOR_CAP ** 2
#: (2^32), and above it a cofactor left over is taken as one factor. Dividing all the way to the
#: square root took 137 s for an extent of 2^62.
TRIAL_FACTOR_CAP = 1 << 16


def prime_factors(n: int, cap: int = TRIAL_FACTOR_CAP) -> list[int]:
    """``n``'s prime factors below ``cap`` (with repeats), then what is left of ``n`` if above 1
    (a prime when ``n < cap ** 2``)."""
    factors = []
    d = 2
    while d < cap and d * d <= n:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        factors.append(n)
    return factors


def candidate_sizes(extent: int, limit: int | None = None) -> list[int]:
    """Factors of ``extent`` and powers of two below it (a padded tile), up to ``limit``. The
    factors come from :func:`prime_factors`, so a huge extent costs no more than a small one."""
    limit = extent if limit is None else min(limit, extent)
    divisors = {1}
    for f in prime_factors(extent):
        divisors |= {d * f for d in divisors if d * f <= limit}
    p = 1
    while p < extent and p <= limit:
        divisors.add(p)
        p *= 2
    return sorted(s for s in divisors if s <= limit) or [1]


def contiguous_run(access: Access, region: Sequence[int]) -> int:
    """Elements of one contiguous run of ``region`` in ``access``'s buffer (row-major): the
    innermost extent when some iterator walks it with unit stride, merged with outer dims while
    the inner ones are fully covered."""
    shape = access.tensor.shape
    if not region:
        return 1
    unit = access.linear is None or all(
        any(abs(c) == 1 for c in load[-1][:-1]) or not any(load[-1][:-1]) for load in access.linear
    )
    run = region[-1] if unit else 1
    for d in range(len(region) - 2, -1, -1):
        if region[d + 1] != shape[d + 1] or run != math.prod(region[d + 1 :]):
            break
        run *= region[d]
    return run


def coalesced_bytes(access: Access, region: Sequence[int], transaction: int) -> int:
    elems = math.prod(region)
    run = max(1, contiguous_run(access, region))
    run_bytes = run * access.tensor.bits // 8 or 1
    return ceil_div(elems, run) * ceil_div(run_bytes, transaction) * transaction


def coalescing_score(access: Access, region: Sequence[int], arch) -> float:
    run_bytes = contiguous_run(access, region) * access.tensor.bits / 8
    return min(1.0, run_bytes / arch.transaction_bytes_read)


def block_traffic(info: FuncInfo, tile: Sequence[int], rstep: Sequence[int] | None, arch) -> int:
    """Global bytes one block moves: every parameter input, loaded ``rstep`` at a time over the
    whole reduction (each step rounded to read transactions), plus its output tile written."""
    ext = info.iter_extents(tile, rstep)
    steps = 1
    for i, a in zip(info.reduce_iters, info.reduce_axes):
        steps *= ceil_div(a.extent, ext[i])
    # DRAM and L2 move 32-byte sectors (the write transaction size): a run is rounded up to
    # whole sectors; the 128-byte read line only matters for the coalescing *score* (rstep).
    sector = arch.transaction_bytes_write
    total = 0
    for acc in info.reads:
        if not acc.is_param:
            continue
        b = coalesced_bytes(acc, acc.region(ext), sector)
        if steps > 1 and any(acc.depends_on(i) for i in info.reduce_iters):
            b *= steps
        total += b
    if info.write.is_param:
        total += coalesced_bytes(info.write, info.write.region(ext), sector)
    return total


def blocks_per_sm(arch, threads: int, regs_per_thread: int = 0, smem_bytes: int = 0) -> int:
    """Resident blocks per SM, bounded by the block cap, threads, registers and shared memory."""
    lanes = ceil_div(max(threads, 1), arch.warp_size) * arch.warp_size
    limit = min(arch.max_blocks_per_sm, arch.max_threads_per_sm // lanes)
    if regs_per_thread:
        limit = min(limit, arch.regs_per_sm // (regs_per_thread * lanes))
    if smem_bytes:
        limit = min(limit, arch.smem_per_sm // smem_bytes)
    return max(0, limit)


def num_blocks(extents: Iterable[int], tile: Iterable[int]) -> int:
    return math.prod(ceil_div(e, t) for e, t in zip(extents, tile))


def waves(arch, blocks: int, per_sm: int) -> int:
    return ceil_div(blocks, max(1, per_sm) * arch.sm_count)


def roller_score(traffic: float, n_waves: int) -> float:
    return (traffic + 1.0) * n_waves


def best_first(
    start: Hashable,
    neighbors: Callable[[Hashable], Iterable[Hashable]],
    evaluate: Callable[[Hashable], float | None],
    limit: int,
) -> int:
    """Roller's tile search: pop the best-scored tile, evaluate each enlargement of it, keep the
    ones that fit (``evaluate`` returns a score, or None to prune: over budget, never grown).
    Stops after ``limit`` visited tiles; returns how many were visited. Ties pop in insertion
    order, so the search is deterministic."""
    seen = {start}
    score = evaluate(start)
    if score is None:
        return 1
    heap = [(score, 0, start)]
    order = 1
    while heap and len(seen) < limit:
        _, _, tile = heapq.heappop(heap)
        for nb in neighbors(tile):
            if nb in seen or len(seen) >= limit:
                continue
            seen.add(nb)
            s = evaluate(nb)
            if s is not None:
                heapq.heappush(heap, (s, order, nb))
                order += 1
    return len(seen)
