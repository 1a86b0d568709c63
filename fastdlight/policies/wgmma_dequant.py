"""Hopper weight-only 4-bit matmul for prefill: which tiles the ``matmul_wgmma_dequant`` template
(:mod:`fastdlight.schedules.wgmma.dequant`) should try, from the SM's shared memory and registers.

A config is ``block = (weight rows, activation rows)``, ``warp = (64, activation rows)`` (a
consumer warpgroup per 64 weight rows: two or three), ``rstep = (64,)`` and the deepest stage ring
the shared memory holds beside the output staging. Ranked by an estimated time: waves of
persistent tiles x (K steps x the longest of the step's tensor-core time, its L2 load time, its
shared-memory time and the consumers' dequantization issue time) + a per-tile epilogue.
"""

from __future__ import annotations

from fastdlight.analysis.weight_only import GEMV_MAX_ROWS, WeightOnlyShape
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.policies.wgmma import (
    CLOCK_HZ,
    L2_LOAD_FACTOR,
    SMEM_BYTES_PER_CYCLE,
    WGMMA_EFFICIENCY,
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


def dequant_wgmma_configs(shape: WeightOnlyShape, arch: CUDA, topk: int = 8) -> list[Config]:
    """Configs for ``shape`` on ``arch`` (sm_90a), cheapest predicted first; none where the
    template does not take the shape, the rows are decode rows (the dequantizing GEMV's), or
    the arch has no wgmma."""
    from fastdlight.schedules.wgmma.dequant import (
        BK,
        BLOCK_X,
        MAX_ACC,
        DequantPlan,
        dequant_wgmma_fits,
        plan_fits,
    )

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
                candidate = DequantPlan(shape, bw, bx, stages, arch.sm_count, smem)
                if plan_fits(candidate):
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
