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

from fastdlight.analysis.weight_only import (MMA_MAX_SMEM, X_GLOBAL_WIDTH, WeightOnlyShape, dequant_gemv_fits,
                                             mma_gemv_fits, mma_gemv_smem, resident_ctas, x_global_fits)
from fastdlight.arch import CUDA
from fastdlight.config import Config

#: warps a CTA: CTAs of 16 warps stage the activations half as often as those of 8 (H200,
#: 1x4096x11008: 16 rows of 1 a warp 9.0 us against 9.5 for the best of 8 warps, 2026-12-01)
WARPS = (4, 8, 16)
#: CTAs of a split-K cluster (each a slice of K) the policy tries
SPLITS = (2, 4)
#: split-K configs, and configs reading the activations from global memory, added after the
#: plain ones' top k where asked (see :func:`dequant_gemv_variants`)
SPLIT_VARIANTS, GLOBAL_X_VARIANTS = 3, 3
#: a persistent config's predicted cost over its plain twin's
PERSISTENT_PENALTY = 1.05
ROWS_PER_WARP = (1, 2, 4)
#: tensor-core configs (``gemv_dequant_mma``): (rows a CTA, warps splitting K, steps of K loaded
#: ahead), in the order tried
MMA_SHAPES = ((16, 8, 2), (16, 4, 2), (16, 16, 2), (32, 8, 2), (16, 8, 4))
#: the first GPU generation with ``mma.sync`` m16n8k16 in fp16 with fp32 accumulation
MMA_MIN_CC = (8, 0)
#: the tensor-core configs' predicted cost: not modelled, ranked after every CUDA-core config
MMA_COST = 100.0


def _tail(blocks: int, slots: int, sm_count: int) -> float:
    """The time of the busiest SM over the mean's: whole waves of ``slots`` CTAs over the waves'
    worth of row blocks; within one wave (every block resident at once), the most blocks an SM
    holds over the mean (a one-wave grid does not wait for a last wave, only for its fullest SM)."""
    if blocks <= slots:
        per_sm = blocks / sm_count
        return math.ceil(per_sm) / per_sm
    waves = blocks / slots
    return math.ceil(waves) / waves


def dequant_gemv_configs(shape: WeightOnlyShape, arch: CUDA, topk: int = 8, variants: bool = False) -> list[Config]:
    """Configs for ``shape`` on ``arch``, cheapest predicted first; none where the template does
    not take the shape (:func:`~fastdlight.analysis.weight_only.dequant_gemv_fits`). Where the row blocks
    outnumber the CTAs the SMs hold at once, each shape also comes persistent (those CTAs walk
    the blocks, staging the activations once each instead of once a block). The top ``topk``
    of those; with ``variants``, then :func:`dequant_gemv_variants` (split-K clusters,
    activations from global memory), whatever ``topk``. The tuner does not ask for them: on an
    H200 each ran slower than the best plain config at both of a LLaMA layer's decode shapes
    (1x11008x4096: 9.7-11.7 us against 8.8; 1x4096x11008: 11.1-17.6 against 10.2; 2026-11-30)."""
    if not dequant_gemv_fits(shape):
        return []
    out = []
    for warps in WARPS:
        for per_warp in ROWS_PER_WARP:
            rows = warps * per_warp
            blocks = -(-shape.n // rows)
            slots = arch.sm_count * resident_ctas(shape, warps, arch)
            tail = _tail(blocks, slots, arch.sm_count)
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
    ranked = sorted(out, key=lambda c: c.cost)
    plain = ranked[:topk]
    return plain + dequant_gemv_variants(shape, arch, [c for c in ranked if not c.persistent]) if variants else plain


def dequant_gemv_mma_configs(shape: WeightOnlyShape, arch: CUDA) -> list[Config]:
    """The tensor-core form's configs (``gemv_dequant_mma``) where it takes ``shape``: CTAs of 16
    or 32 rows whose warps split K (the cost does not model the tensor pipe). A variant: on an
    H200 its best ran 0.0083 ms at 1x11008x4096 and 0.0101 at 1x4096x11008, against 0.0081 and
    0.0089 for the CUDA-core template's (2026-12-01)."""
    if not mma_gemv_fits(shape) or tuple(arch.compute_capability) < MMA_MIN_CC:
        return []
    return [Config("gemv_dequant_mma", block=(rows,), warp=(warps,), pipeline_stages=ahead, cost=MMA_COST + 0.01 * i)
            for i, (rows, warps, ahead) in enumerate(MMA_SHAPES) if mma_gemv_smem(shape, rows, warps) <= MMA_MAX_SMEM]


def dequant_gemv_variants(shape: WeightOnlyShape, arch: CUDA, plain: list[Config]) -> list[Config]:
    """The template's other forms, ranked after the plain configs (``plain``: those, best first):

    * split-K (``split_k`` S): a cluster of S CTAs shares a row block, each a slice of K, so
      that a CTA can own S times the rows at the same number of CTAs and still fill the SMs:
      each stages 1/S of the activations, and the layer's staging reads fall with the rows a
      CTA (K = 11008: 22 KB a CTA of 8 rows; 5.5 KB a CTA of 32 rows at S = 4, a quarter of
      those reads). Those whose CTAs fit the SMs in one wave, a slice at least a step of every
      lane, with the fewest staging reads (most rows a CTA) first;
    * the activations read from global memory through L1 at each step (``vectorize`` X 8):
      nothing staged, no barrier, no shared memory: the best plain shapes and the best split-K
      one so (4-bit weights, fp16 activations only);
    * the products on tensor cores (:func:`dequant_gemv_mma_configs`)."""
    if not dequant_gemv_fits(shape):
        return []
    chunks = shape.k // shape.lane_weights
    split = []
    for warps in WARPS:
        for per_warp in ROWS_PER_WARP:
            rows = warps * per_warp
            for s in SPLITS:
                ctas = -(-shape.n // rows) * s
                x_bytes = -(-shape.x_bytes // s) + 4 * rows * shape.m
                resident = max(1, min(arch.max_threads_per_sm // (32 * warps), arch.smem_per_sm // x_bytes))
                if -(-chunks // s) < 32 or ctas > arch.sm_count * resident or ctas < 2 * arch.sm_count:
                    continue  # a slice under a step of every lane; more than a wave; too few CTAs
                # staging's L2 reads over the weights' bytes (S cancels: a CTA stages and reads a
                # slice); the warps an SM holds
                staging = shape.x_bytes / (rows * shape.row_bytes)
                warps_resident = min(ctas / arch.sm_count, resident) * warps
                cost = 1.0 + 0.2 * min(staging, 2.0) + 0.1 / per_warp + 0.01 * s - 0.002 * warps_resident
                split.append(Config("gemv_dequant", block=(rows,), thread=(per_warp,),
                                    rstep=(32 * shape.lane_weights,), reduce_thread=(32,), split_k=s, cost=cost))
    split = sorted(split, key=lambda c: c.cost)[:SPLIT_VARIANTS]
    out = list(split) + dequant_gemv_mma_configs(shape, arch)
    if x_global_fits(shape):
        for c in plain[:GLOBAL_X_VARIANTS - 1] + split[:1]:
            out.append(dataclasses.replace(c, vectorize={"X": X_GLOBAL_WIDTH}, cost=c.cost))
    return out
