"""Hopper weight-only 4-bit matmul for prefill: which tiles the ``matmul_wgmma_dequant`` template
(:mod:`fastdlight.schedules.wgmma.dequant`) should try, from the SM's shared memory and registers.

A config is ``block = (weight rows, activation rows)``, ``warp = (64, activation rows)`` (a
consumer warpgroup per 64 weight rows: two or three), ``rstep = (64,)`` and the deepest stage ring
the shared memory holds beside the output staging. Ranked by an estimated time: waves of
persistent tiles x (K steps x the longest of the step's tensor-core time, its L2 load time, its
shared-memory time and the consumers' dequantization issue time) + a per-tile epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastdlight.analysis.weight_only import GEMV_MAX_ROWS, WeightOnlyShape
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.policies.wgmma import (
    CLOCK_HZ,
    L2_LOAD_FACTOR,
    SM90_SMEM_OPTIN,
    SMEM_BYTES_PER_CYCLE,
    WGMMA_EFFICIENCY,
    staging_bytes,
)

KIND = "matmul_wgmma_dequant"
#: weight rows a tile: two or three consumer warpgroups of 64
BLOCK_W = (128, 192)
#: the deepest ring tried
MOST_STAGES = 8
#: instructions a consumer warp issues a K step besides its wgmmas: four 16-byte shared loads,
#: 16 fragment registers of four instructions each (prmt, lop3, hfma2, hmul2), addressing
DEQUANT_INSTRUCTIONS = 80
#: cycles a tile's epilogue (transposed staging and TMA stores) keeps the consumers off the
#: tensor cores
EPILOGUE_CYCLES = 2500
#: K a stage holds: one 128-byte swizzled row of fp16 activations
BK = 64
#: activation rows a tile may take (wgmma n): whole 64-row output chunks
BLOCK_X = (64, 128, 192, 256)
#: fp32 accumulators a consumer thread may hold beside two K steps of A fragments (32), the
#: packed words (16) and the addressing: m64n256 with two consumer warpgroups (232 registers),
#: m64n128 with three (152)
MAX_ACC = {2: 128, 3: 64}
def dequant_wgmma_fits(shape: WeightOnlyShape) -> bool:
    """Whether the template takes ``shape`` (any number of rows; the policy offers it for prefill)."""
    return (shape.bits == 4 and shape.dtype == "float16" and shape.out_dtype == "float16"
            and shape.group_size % BK == 0 and shape.k % (2 * BK) == 0 and shape.n % 8 == 0)


@dataclass(frozen=True)
class DequantTile:
    """A tile of the dequantizing wgmma kernel and what it takes: ``bw`` weight rows (64 a
    consumer warpgroup) by ``bx`` activation rows, ``stages`` K steps of 64 in the ring,
    ``num_sms`` persistent CTAs; its shared memory, and whether it fits (:meth:`fits`). The
    template's plan (:class:`~fastdlight.schedules.wgmma.dequant.DequantPlan`) adds the code."""

    shape: WeightOnlyShape
    bw: int
    bx: int
    stages: int
    num_sms: int
    smem: int = SM90_SMEM_OPTIN

    @property
    def m(self) -> int:
        return self.shape.m

    @property
    def n(self) -> int:
        return self.shape.n

    @property
    def k(self) -> int:
        return self.shape.k

    @property
    def dtype(self) -> str:
        return self.shape.dtype

    @property
    def out_dtype(self) -> str:
        return self.shape.out_dtype

    @property
    def consumers(self) -> int:
        return self.bw // 64

    @property
    def grid_w(self) -> int:
        return -(-self.n // self.bw)

    @property
    def grid_x(self) -> int:
        return -(-self.m // self.bx)

    @property
    def tiles(self) -> int:
        return self.grid_w * self.grid_x

    @property
    def ctas(self) -> int:
        return min(self.num_sms, self.tiles)

    @property
    def tiles_per_cta(self) -> int:
        return -(-self.tiles // self.ctas)

    def tile_w(self, tile):
        """The weight tile of linear tile ``tile``: the activation tiles of one weight tile are
        consecutive."""
        return tile // self.grid_x

    def tile_x(self, tile):
        return tile % self.grid_x

    @property
    def k_steps(self) -> int:
        return self.k // BK

    @property
    def groups(self) -> int:
        return self.shape.groups

    @property
    def steps_per_group(self) -> int:
        return self.shape.group_size // BK

    @property
    def scale_regs(self) -> int:
        return 4 if self.shape.zero_point else 2

    @property
    def x_elems(self) -> int:
        return self.bx * BK

    @property
    def w_words(self) -> int:
        return self.bw * BK // 8

    @property
    def stage_bytes(self) -> int:
        return self.x_elems * 2 + self.w_words * 4

    @property
    def acc_regs(self) -> int:
        return self.bx // 2

    @property
    def chunks(self) -> int:
        return self.bx // 64

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + staging_bytes(self.consumers, 2)

    def fits(self) -> bool:
        return (dequant_wgmma_fits(self.shape) and self.bx in BLOCK_X and self.consumers in MAX_ACC
                and self.bw % 64 == 0 and self.acc_regs <= MAX_ACC[self.consumers] and self.stages >= 2
                and self.smem_bytes() <= self.smem)


def dequant_wgmma_configs(shape: WeightOnlyShape, arch: CUDA, topk: int = 8) -> list[Config]:
    """Configs for ``shape`` on ``arch`` (sm_90a), cheapest predicted first; none where the
    template does not take the shape, the rows are decode rows (the dequantizing GEMV's), or
    the arch has no wgmma."""
    if not getattr(arch, "has_wgmma", False) or not dequant_wgmma_fits(shape) or shape.m <= GEMV_MAX_ROWS:
        return []
    smem = arch.smem_per_block_optin
    ranked = []
    for bw in BLOCK_W:
        consumers = bw // 64
        for bx in BLOCK_X:
            if bx // 2 > MAX_ACC[consumers] or (bx > 64 and bx >= 2 * shape.m):
                continue  # too many accumulators, or a tile that only pads
            plan = None
            for stages in range(MOST_STAGES, 1, -1):
                candidate = DequantTile(shape, bw, bx, stages, arch.sm_count, smem)
                if candidate.fits():
                    plan = candidate
                    break
            if plan is None:
                continue
            ranked.append((_cost(plan, arch, BK), plan))
    ranked.sort(key=lambda cp: (cp[0], -cp[1].bw * cp[1].bx))
    return [Config(KIND, block=(p.bw, p.bx), warp=(64, p.bx), rstep=(BK,), pipeline_stages=p.stages,
                   use_async_copy=True, cost=cost) for cost, p in ranked[:topk]]


def _cost(plan, arch: CUDA, bk: int) -> float:
    """Estimated seconds of ``plan`` on ``arch``."""
    waves = -(-plan.tiles // arch.sm_count)
    peak = (arch.tc_peak("float16") or max(arch.peak_tc_tflops.values())) * 1e12
    flops_per_cycle = peak * WGMMA_EFFICIENCY / (arch.sm_count * CLOCK_HZ)
    mma = 2 * plan.bw * plan.bx * bk / flops_per_cycle
    l2_per_cycle = L2_LOAD_FACTOR * arch.dram_bandwidth_gbs * 1e9 / (arch.sm_count * CLOCK_HZ)
    load = plan.stage_bytes / l2_per_cycle
    # TMA writes of the stage, each consumer's wgmma reading the X tile, the packed words read
    smem = (plan.stage_bytes + plan.consumers * plan.x_elems * 2 + plan.w_words * 4) / SMEM_BYTES_PER_CYCLE
    # each scheduler runs one warp of every consumer warpgroup
    dequant = DEQUANT_INSTRUCTIONS * plan.consumers
    cycles = waves * (plan.k_steps * max(mma, load, smem, dequant) + EPILOGUE_CYCLES)
    return cycles / CLOCK_HZ
