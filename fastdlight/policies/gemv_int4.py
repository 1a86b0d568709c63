"""Dequantizing GEMV for 4-bit weights: which CTA shapes the ``gemv_int4`` template should try.

A config is ``block = (rows a CTA,)``, ``thread = (rows a warp,)``: 4 or 8 warps, each owning
1, 2 or 4 weight rows. Every shape reads the same bytes; what differs is how the last wave of
CTAs fills the SMs and how often a warp re-reads the activations from shared memory (once per
row it owns), so the prediction is coarse and the tuner times them all (six at most).
"""

from __future__ import annotations

import math

from fastdlight.analysis.int4 import LANE_WEIGHTS, Int4MatmulShape, dequant_gemv_fits
from fastdlight.arch import CUDA
from fastdlight.config import Config

WARPS = (4, 8)
ROWS_PER_WARP = (1, 2, 4)


def dequant_gemv_configs(shape: Int4MatmulShape, arch: CUDA, topk: int = 6) -> list[Config]:
    """Configs for ``shape`` on ``arch``, cheapest predicted first; none where the template does
    not take the shape (:func:`~fastdlight.analysis.int4.dequant_gemv_fits`)."""
    if not dequant_gemv_fits(shape):
        return []
    x_bytes = shape.m * shape.k * 2
    max_warps = arch.max_threads_per_sm // 32
    out = []
    for warps in WARPS:
        for per_warp in ROWS_PER_WARP:
            rows = warps * per_warp
            ctas = -(-shape.n // rows)
            resident = max(1, min(max_warps // warps, arch.smem_per_sm // x_bytes))
            waves = ctas / (arch.sm_count * resident)
            tail = math.ceil(waves) / waves
            cost = tail * (1.0 + 0.1 / per_warp)
            out.append(Config("gemv_int4", block=(rows,), thread=(per_warp,), rstep=(32 * LANE_WEIGHTS,),
                              reduce_thread=(32,), cost=cost))
    return sorted(out, key=lambda c: c.cost)[:topk]
