"""Dequantizing GEMV for 4- and 8-bit weights: which CTA shapes the ``gemv_dequant`` template
should try.

A config is ``block = (rows a CTA,)``, ``thread = (rows a warp,)``: 4 or 8 warps, each owning
1, 2 or 4 weight rows, and ``persistent`` (the CTAs the SMs hold at once walk the row blocks).
Every shape reads the same weight bytes; what differs is how the last wave of CTAs fills the
SMs, how often the activations are staged (once a CTA: 22 KB of L2 reads for K = 11008 against
a block's 44 KB of weights) and re-read from shared memory (once a row), so the prediction is
coarse and the tuner times the top few.
"""

from __future__ import annotations

import dataclasses
import math

from fastdlight.analysis.weight_only import WeightOnlyShape, dequant_gemv_fits, resident_ctas
from fastdlight.arch import CUDA
from fastdlight.config import Config

WARPS = (4, 8)
#: a persistent config's predicted cost over its plain twin's
PERSISTENT_PENALTY = 1.05
ROWS_PER_WARP = (1, 2, 4)


def dequant_gemv_configs(shape: WeightOnlyShape, arch: CUDA, topk: int = 8) -> list[Config]:
    """Configs for ``shape`` on ``arch``, cheapest predicted first; none where the template does
    not take the shape (:func:`~fastdlight.analysis.weight_only.dequant_gemv_fits`). Where the row blocks
    outnumber the CTAs the SMs hold at once, each shape also comes persistent (those CTAs walk
    the blocks, staging the activations once each instead of once a block)."""
    if not dequant_gemv_fits(shape):
        return []
    out = []
    for warps in WARPS:
        for per_warp in ROWS_PER_WARP:
            rows = warps * per_warp
            blocks = -(-shape.n // rows)
            slots = arch.sm_count * resident_ctas(shape, warps, arch)
            waves = blocks / slots
            tail = math.ceil(waves) / waves
            # staging X costs a CTA about what reading its rows does when they are few
            staging = shape.x_bytes / (rows * shape.row_bytes)
            cost = tail * (1.0 + 0.1 / per_warp) + 0.2 * min(staging, 2.0)
            plain = Config("gemv_dequant", block=(rows,), thread=(per_warp,), rstep=(32 * shape.lane_weights,),
                           reduce_thread=(32,), cost=cost)
            out.append(plain)
            if blocks > slots:
                # ranked after its plain twin: on an H200 neither 4-bit decode GEMV of a LLaMA
                # layer was won by a persistent config (2026-11-29)
                out.append(dataclasses.replace(plain, persistent=True, cost=cost * PERSISTENT_PENALTY))
    return sorted(out, key=lambda c: c.cost)[:topk]
