"""Hopper wgmma matmul: which tiles the TMA + wgmma template should try (``WgmmaPolicy``), from
the SM's shared memory and registers; which functions it takes is :mod:`.wgmma_match`'s
``match_wgmma``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.analysis.wgmma_match import WgmmaMatch, match_wgmma

#: fraction of the datasheet tensor peak a well-fed wgmma kernel sustains
WGMMA_EFFICIENCY = 0.80
CLOCK_HZ = 1.5e9
#: registers a thread of the 128-thread producer warpgroup keeps (setmaxnreg); the consumers
#: share the rest of the SM's 64K
PRODUCER_REGS = 40


def consumer_warpgroups(bm: int, wm: int) -> int:
    """Consumer warpgroups of a ``bm``-row tile of ``wm`` rows each: they split the tile
    (cooperative: two of 64 or 128 rows, or three of 64), or take alternate tiles (ping-pong,
    ``bm == wm``: two)."""
    return 2 if bm == wm else bm // wm


def consumer_regs(consumers: int, producer_regs: int = PRODUCER_REGS) -> int:
    """Registers a consumer thread gets (setmaxnreg: a multiple of 8) beside a producer
    warpgroup of ``producer_regs`` a thread: 232 for two warpgroups, 152 for three.
    ``setmaxnreg`` only moves registers within what the CTA got at launch, each thread's share
    of the 64K rounded down to 8 (168 at 384 threads: 64512 in all, not 65536); asking the
    consumers for more than the producer freed would wait forever."""
    threads = 128 * (consumers + 1)
    pool = threads * (65536 // threads // 8 * 8)
    return (pool - 128 * producer_regs) // (128 * consumers) // 8 * 8


def max_acc_regs(consumers: int) -> int:
    """fp32 accumulator registers a consumer thread may hold: 192 of 232 (two warpgroups: two
    m64n192 slices), 96 of 152 (three: a 192-row tile up to 192 columns). ptxas lets a
    ``setmaxnreg`` region keep that many values live, but checks each instruction against the
    kernel's entry budget (65536 / threads: 168 for 384 threads, 128 for 512), and one
    m64n256 f32 wgmma needs 154: so three warpgroups stay within m64n192."""
    return 192 if consumers == 2 else 96


#: the shared memory an sm_90 block may opt in to (H100, H200: 227 KB)
SM90_SMEM_OPTIN = 227 * 1024
#: stage rings shallower than this trade an epilogue staging buffer for a stage (see
#: :func:`ring`): cuBLAS's 192 x 192 tile on an H100 runs a 4-stage ring
MIN_RING = 4


def staging_bytes(consumers: int, buffers: int = 2) -> int:
    """Shared memory besides the stage ring: ``buffers`` 8 KB epilogue staging chunks per
    consumer warpgroup, barriers and the 1 KB alignment of the swizzled tiles."""
    return consumers * buffers * 64 * 128 + 2048


def staging_buffers(consumers: int, stages: int, stage_bytes: int, smem: int) -> int:
    """Epilogue staging buffers per consumer warpgroup: two (a chunk's TMA store overlaps the
    next chunk's writes) where the ring leaves room for them, else one."""
    return 2 if stages * stage_bytes + staging_bytes(consumers, 2) <= smem else 1


def ring(consumers: int, stage_bytes: int, smem: int, most: int = 8) -> int:
    """The deepest stage ring beside two staging buffers a warpgroup, or beside one where two
    leave fewer than :data:`MIN_RING` stages and one gives a stage more (192 x 192: 3 -> 4)."""
    two, one = ((smem - staging_bytes(consumers, b)) // stage_bytes for b in (2, 1))
    return min(one if two < MIN_RING and one > two else two, most)


# -- the policy ------------------------------------------------------------------------------
#: per-tile cost of the epilogue and the pipeline fill, in cycles (cooperative: exposed; ping-pong:
#: the other warpgroup's main loop runs meanwhile, only the fill shows)
TILE_OVERHEAD_CYCLES = {"cooperative": 2500, "pingpong": 800}
#: the rate at which TMA loads reach an SM's tiles, in multiples of DRAM bandwidth shared out over
#: the SMs. Concurrent CTAs load the same A and B tiles at about the same time, and the L2 serves
#: them with fewer sector reads than the tiles hold (36% fewer for 128x256 on 4096³; ncu, H100 80GB
#: HBM3, 2026-11-27). At 2.5 the estimate had 128x192 and 128x256 L2-bound and ranked 192x192 ahead
#: of both on 8192³; at one clock they ran 6% ahead of it, and at the power limit 4.5% (H100 80GB
#: HBM3, 2026-11-27)
L2_LOAD_FACTOR = 4.0
#: the rate, in bytes a cycle, at which ``smem_cycles`` charges a K step's TMA writes and wgmma
#: reads. A fit, not a bandwidth: a K step of 128x256 writes 48 KB and reads 80 KB in its 1024
#: tensor-core cycles, and its traced main loops ran 1.03-1.05 of the tensor cores' time; 256x128
#: (144 bytes a cycle at this rate) 1.12 (trace_wgmma, H100 80GB HBM3, 2026-11-27). Without the
#: TMA loads they ran the same, so what slows the taller and narrower tiles is wgmma on their
#: slices, which this charge tracks within 4%. Small tiles pay most: 128x128 ping-pong comes to 160
SMEM_BYTES_PER_CYCLE = 128
#: CTAs of a cluster along M: each loads half of the B tile they share and multicasts it. On an
#: H100 (2026-11-26) 3000x5120x1000 went from 0.0697 to 0.0579 ms (128x256); LLaMA's gate/up
#: GEMM stayed within 3%; the tuner measures both. Tiles taller than wide come as a cluster
#: along N instead, sharing A, the larger of their two loads (as cuBLAS's 256x128 NN kernels
#: do). 256x128 along N against along M, CUDA graphs on an H100 (2026-11-26): 0.2176 against
#: 0.2155 ms on 4096^3 NN, 0.2162/0.2192 NT, 0.1072/0.1088 LLaMA o, 1.706/1.755 8192^3 NN
CLUSTER = 2
#: tiles (the best by estimate) that also get a cluster variant
CLUSTER_VARIANTS = 3


#: tiles estimated at more than this many times the best tile are not emitted. Where they
#: occur, a small GEMM's tiles all fit in one wave and a larger tile gives fewer CTAs the same
#: K loop with more tensor-core work each (196x384x64: 256x192 at 4.3x the estimate of 64x64);
#: such a CTA's time cannot beat the smaller tile's, and the gap between this estimate and the
#: hot timings recorded above is at most 17% (cluster twins). They are also the slowest builds:
#: 256x192 took 9.1 s and 128x128 ping-pong 5.8 s against 1.1 s for 64x64 (schedule, TIRx
#: pipeline, NVRTC, export, one CPU, 2026-11-29); mobilenet_v2 and resnet50 at batch 1 emitted
#: 136 and 248 wgmma tiles, 286 and 619 CPU seconds of builds, before this cut. A GEMM that
#: fills several waves has every tile within 1.9x (4096^3, 8192^3, 2048x11008x4096, 3000x5120x1000),
#: so its tiles are unchanged. No GPU timing of the tiles cut was made: 2x is a conservative
#: margin over that 17%
MAX_COST_SPREAD = 2.0


def within_spread(ranked: list, cost) -> list:
    """``ranked`` (best first) without the entries ``cost`` puts beyond ``MAX_COST_SPREAD`` times
    the first's."""
    if not ranked:
        return ranked
    limit = MAX_COST_SPREAD * cost(ranked[0])
    return [t for t in ranked if cost(t) <= limit]


@dataclass(frozen=True)
class _Tile:
    bm: int
    bn: int
    wm: int  # rows per consumer warpgroup: bm = 2 wm or 3 wm (cooperative), or bm = wm (ping-pong)
    stages: int
    cluster: int = 1  # CTAs sharing (multicasting) each B tile (along M) or A tile (along N)
    cluster_axis: str = "m"

    @property
    def schedule(self) -> str:
        return "pingpong" if self.bm == self.wm else "cooperative"


class WgmmaPolicy:
    """Tiles for the wgmma template: two consumer warpgroups of 64 or 128 rows (or three of 64)
    by 64..256 columns, sharing each tile (cooperative) or taking turns (ping-pong), the deepest
    stage ring the SM's shared memory holds; scored by an estimated time: waves of persistent
    tiles x (K steps x the longest of the step's tensor-core time, its L2 load time and its
    shared-memory time) + a per-tile overhead; padding waste included. The best few also come
    as 2-CTA clusters sharing B (and, taller than wide, A), whose load time counts half of the
    shared tile."""

    WARP_M = (64, 128)
    BLOCK_N = (256, 192, 128, 64)

    #: the one width of three-warpgroup tiles: 192 x 128 timed well on an idle GPU but ran 3-10%
    #: slower hot than the best two-warpgroup tiles (H100, gated b4 and MLP up, 2026-11-26)
    THREE_WG_N = 192

    #: accumulators a thread of a ping-pong warpgroup holds (the template takes 192). Ping-pong
    #: 128 x 192 won the tuner's hot timing on 3000x5120x1000 and ran 3% behind 128 x 256 at the
    #: power limit, spending 4-8% more energy a GEMM (H100 80GB HBM3, 2026-11-27): a warpgroup's
    #: tile alone loads its A and B for fewer outputs a stage than two sharing a wider one
    PINGPONG_ACC = 128

    @staticmethod
    def block_m(wm: int) -> tuple[int, ...]:
        """Tile heights for warpgroups of ``wm`` rows: cooperative two, ping-pong, and three of
        64 rows (192 x 192: on 2048 rows with N = 11008 its 638 tiles fill 4.8 waves of 132
        SMs, where 128 x 256 tiles leave a sixth wave 21% full; hot, it ran 7% ahead of them)."""
        return (2 * wm, wm) + ((3 * wm,) if wm == 64 else ())

    def __init__(self, func, arch: CUDA, match: WgmmaMatch | None = None):
        self.arch = arch if isinstance(arch, CUDA) else CUDA(arch)
        if match is None:
            match, reason = match_wgmma(func)
            if match is None:
                raise ValueError(f"no wgmma path: {reason}")
        self.match = match

    def tiles(self) -> list[_Tile]:
        out = []
        mt = self.match
        for wm in self.WARP_M:
            for bm in self.block_m(wm):
                consumers = consumer_warpgroups(bm, wm)
                if consumers > 2 and mt.conv is not None:
                    continue  # the conv tiles' row geometry is for two warpgroups
                for bn in self.BLOCK_N:
                    if bn % mt.bn_multiple or (not mt.b_k_major and bn % 64):
                        continue
                    if consumers > 2 and bn != self.THREE_WG_N:
                        continue
                    acc = wm // 64 * bn // 2
                    if acc > max_acc_regs(consumers) or bm == wm and acc > self.PINGPONG_ACC:
                        continue
                    if bn > 64 and bn >= 2 * mt.n or bm > 64 and bm >= 2 * mt.m:  # tiles that only pad
                        continue
                    if not mt.views_fit(bm, bn):
                        continue
                    tile = self.tile(bm, bn, wm)
                    if tile.stages >= 2:
                        out.append(tile)
        # cluster twins of the best few (each a candidate more to compile)
        best = sorted(out, key=self.cost)[:CLUSTER_VARIANTS]
        twins = [self.tile(t.bm, t.bn, t.wm, CLUSTER) for t in best]
        return out + [t for t in twins if self._clusters(t.bm, t.bn, t.cluster_axis)]

    def tile(self, bm: int, bn: int, wm: int, cluster: int = 1, cluster_axis: str | None = None) -> _Tile:
        """A tile of this shape with the deepest stage ring the SM holds beside its staging
        buffers; a cluster along :meth:`cluster_axis` unless ``cluster_axis`` is given."""
        stages = ring(consumer_warpgroups(bm, wm), (bm + bn) * self.match.bk * self.match.in_bytes,
                      self.arch.smem_per_block_optin)
        axis = cluster_axis or (self.cluster_axis(bm, bn) if cluster > 1 else "m")
        return _Tile(bm, bn, wm, stages, cluster, axis)

    @staticmethod
    def cluster_axis(bm: int, bn: int) -> str:
        """The axis a tile's cluster runs along: the one whose CTAs share the larger operand
        tile (N, sharing A, for tiles taller than wide)."""
        return "n" if bm > bn else "m"

    def _clusters(self, bm: int, bn: int, axis: str) -> bool:
        """Whether two CTAs along ``axis`` should share this tile's B (along M) or A (along N):
        two rows (columns) of tiles at least, and whole 64-column chunks each where the shared
        operand is MN-major. Halves of chunks along K (192 columns) are correct but ran slow
        hot: 192x192 NN 0.334 ms with a cluster, 0.278 without (H100, 2026-11-26);
        ``config_fits`` still takes them."""
        mt = self.match
        tiles = mt.m_tiles(bm) if axis == "m" else -(-mt.n // bn)
        return (isinstance(mt.m, int) and tiles >= CLUSTER and not mt.splits_chunks(bm, bn, CLUSTER, axis)
                and mt.cluster_fits(bm, bn, CLUSTER, axis))

    def cost(self, t: _Tile) -> float:
        mt, arch = self.match, self.arch
        tiles = mt.batch * mt.m_tiles(t.bm) * -(-mt.n // t.bn)
        waves = -(-tiles // arch.sm_count)
        steps = -(-mt.k // mt.bk)
        peak = (arch.tc_peak(mt.in_dtype) or max(arch.peak_tc_tflops.values())) * 1e12
        per_sm_flops_per_cycle = peak * WGMMA_EFFICIENCY / (arch.sm_count * CLOCK_HZ)
        mma = 2 * t.bm * t.bn * mt.bk / per_sm_flops_per_cycle
        l2_per_cycle = L2_LOAD_FACTOR * arch.dram_bandwidth_gbs * 1e9 / (arch.sm_count * CLOCK_HZ)
        shared_a, shared_b = (t.cluster, 1) if t.cluster_axis == "n" else (1, t.cluster)
        load = (t.bm / shared_a + t.bn / shared_b) * mt.bk * mt.in_bytes / l2_per_cycle
        cycles = waves * (steps * max(mma, load, self.smem_cycles(t)) + TILE_OVERHEAD_CYCLES[t.schedule])
        return cycles / CLOCK_HZ

    def smem_cycles(self, t: _Tile) -> float:
        """Cycles a K step keeps shared memory busy: the TMA writes of the stage, and each
        64-row slice's wgmma reading its A rows and all of B."""
        rows = t.bm // 64 * (64 + t.bn) + t.bm + t.bn
        return rows * self.match.bk * self.match.in_bytes / SMEM_BYTES_PER_CYCLE

    def group_m(self, t: _Tile) -> int:
        """Rows of work items per rasterization group: 16 M tiles (8 where the output has fewer
        than 32) for L2 reuse of B. A cluster along M makes a row a pair of tiles, so it gets
        half the rows: 4096³ in 128x256 pairs took 2.4% less energy a GEMM with 8 rows than
        with 16, which span all 32 M tiles (H100 80GB HBM3, 2026-11-27)."""
        grid_m = self.match.m_tiles(t.bm)
        tiles = 16 if grid_m >= 32 else 8 if grid_m >= 8 else 1
        return max(1, tiles // (t.cluster if t.cluster_axis == "m" else 1))

    def emit_config(self, topk: int = 8) -> list[Config]:
        ranked = sorted(self.tiles(),
                        key=lambda t: (self.cost(t), -t.bm * t.bn, t.bm != t.wm, t.cluster, t.cluster_axis))
        return [self.config(t) for t in within_spread(ranked, self.cost)[:topk]]

    def config(self, t: _Tile) -> Config:
        """The template's config of tile ``t``, with its rasterization group and estimated cost."""
        return Config("matmul_wgmma", block=(t.bm, t.bn), warp=(t.wm, t.bn), rstep=(self.match.bk,), pipeline_stages=t.stages,
                      use_async_copy=True, rasterization=self.group_m(t), cluster=t.cluster,
                      cluster_axis=t.cluster_axis, cost=self.cost(t))


def wgmma_eligible(func, arch: CUDA) -> tuple[WgmmaMatch | None, str]:
    """The match when ``arch`` has wgmma (``sm_90a``) and the template takes ``func``."""
    if not getattr(arch, "has_wgmma", False):
        return None, f"{arch.arch} has no wgmma (needs sm_90a)"
    return match_wgmma(func)


