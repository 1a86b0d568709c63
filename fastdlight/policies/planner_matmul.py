"""Planner of CUDA-core matmuls and convolutions (register-tiled, shared-memory staged)."""

from __future__ import annotations

import dataclasses
import math

from fastdlight.config import Config
from fastdlight.policies.planner import (
    L2_OVER_DRAM,
    LATENCY_HIDING_WARPS,
    MATMUL_BASE_REGS,
    SHARED_ROW_BYTES,
    SHARED_ROW_PAD,
    SINGLE_BLOCK_EFFICIENCY,
    TRAFFIC_TIEBREAK,
    Planner,
    words,
)
from fastdlight.policies.roller import candidate_sizes, ceil_div, coalescing_score, largest_pow2_divisor

# -- CUDA-core matmul / conv ---------------------------------------------------------------------


#: multiply-adds one thread's unrolled k step may hold (micro tile x rstep). nvcc time grows
#: with it: fp16 NHWC conv candidates of 8x8 x 32 took 11-19 s each on a 2-core machine, 8x8 x
#: 16 took 3-7 s; fp32 4096^3, the best CUDA-core GEMM, is 8x8 x 16
MAX_UNROLLED_FMAS = 1024


class MatmulPlanner(Planner):
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
                frag = sum(words(math.prod(a.region(ext)), a.tensor.bits) for a in self.inputs)
                outs = math.prod(thread)
                # fragments are double-buffered across the unrolled k loop; index math grows
                # with the loop nest (measured with nvcc on the matmul template: 4x4 ~56-63,
                # 8x8 ~126, conv 4x4 ~72-79 registers)
                regs = self.base_regs + words(outs, max(32, self.acc_bits)) + 2 * frag
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
            stage_words = sum(words(math.prod(a.region(ext)), a.tensor.bits) for a in self.inputs)
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

    def kernel_of(self, config: Config) -> Config:
        """A reduction done in one step has no next tile to prefetch: the template's pipelining
        (register-staged or cp.async) leaves its kernel as it is (the same CUDA source)."""
        one_step = len(config.rstep) == len(self.rextents) and all(
            r >= e for r, e in zip(config.rstep, self.rextents))
        if one_step and (config.pipeline_stages > 1 or config.use_async_copy):
            return dataclasses.replace(config, pipeline_stages=1, use_async_copy=False)
        return config

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
