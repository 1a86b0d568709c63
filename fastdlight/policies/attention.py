"""Fused attention: which tiles the ``attention_wgmma`` template (Hopper) or, on other GPUs from
sm_80, the ``attention_mma`` one should try, from the SM's shared memory and registers and the
shape's work per CTA.

A config is ``block = (bm, bn)``: ``bm`` query rows per CTA (one consumer warpgroup per 64)
and ``bn`` keys per step of the K/V ring, ``pipeline_stages`` steps deep; ``persistent``: a CTA
per SM walks the tiles (emitted beside each tile where the tiles outnumber the SMs). What bounds it:

* registers: a consumer thread holds the scores of its rows (``bn / 2`` fp32), the output rows
  (``D / 2``) and the probabilities as 16-bit pairs (``bn / 4``); their sum stays under what
  ``setmaxnreg`` gives a consumer (the producer keeps 24) with room for addresses and row
  statistics. ptxas allocates the consumers' code to that count. Key tiles of 144-192
  (FlashAttention-3 takes 128x176 at head dim 128) compile so, but ran slower than 128x128 at
  B1 H32 T8192 d128 on an H200 (2026-11-30: 1.85 against 1.81 ms, three stages; 2.05-2.14
  against 1.99 before the tile order kept K/V in L2) and are not emitted;
* shared memory: the Q tile and ``stages`` K and V tiles;
* the grid: a tile of fewer rows makes more CTAs where there are few (batch 1, short prompts).
"""

from __future__ import annotations

import dataclasses

from fastdlight.analysis.attention import (AttentionShape, fused_fits, mma_padded_dim, q_in_registers,
                                           wgmma_padded_dim)
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.policies.wgmma import SM90_SMEM_OPTIN
from fastdlight.policies.wgmma import consumer_regs as wgmma_consumer_regs

#: registers a consumer thread needs beside its fragments (addresses, row statistics, loop state)
OVERHEAD_REGS = 8
#: registers a producer thread keeps (setmaxnreg): it only issues TMA loads. On a persistent grid
#: it also works out each round's tile, which spills 8-32 bytes at 24 (sm_90a builds,
#: 2026-11-30); 32 would leave two consumers 232, not 240 (not yet timed)
PRODUCER_REGS = 24
TILES = ((128, 128), (128, 64), (192, 64), (192, 128), (64, 128))
#: the mma.sync kernel's tiles (query rows, keys a step): FlashAttention-2 runs 128 x 64 at head
#: dim 128 and 128 x 128 at 64 on sm_80, warps of 32 rows
MMA_TILES = ((128, 64), (64, 64), (128, 32), (128, 128), (64, 128), (64, 32))
#: query rows a warp: one m16 tile (Q's fragments held in registers) or two (sharing each K and V
#: fragment: half the shared-memory reads a product, Q's fragments re-read each step)
MMA_WARP_ROWS = (32, 16)
#: registers an mma.sync attention thread may hold in fragments (Q's, the scores, O and P), under
#: 255 with room for addresses. At 200, d96's 128x64 in warps of 32 took 254 registers built for
#: sm_90a and spilled 8 bytes for sm_80; on the H200 it was d96's fastest tile (0.88x torch's
#: FlashAttention-2 against 0.82x for the best under 192; 2026-11-30), so it is offered and timed
MMA_FRAGMENT_REGS = 200
#: head dims where Hopper gets the wgmma template's configs alone (H200, 2026-11-30: 1.06-1.27x
#: torch's FlashAttention at d64 and d128, where mma.sync's best ran 0.55-0.84x)
WGMMA_ALONE_HEAD_DIMS = (64, 128)
#: mma.sync configs measured beside the wgmma ones on Hopper at the other head dims
BESIDE_WGMMA_TOPK = 4
#: their predicted cost against the wgmma tiles' (H200, 2026-11-30: the wgmma kernel won d40,
#: d80, d96 and d256 by 1.19-1.65x)
MMA_BESIDE_WGMMA_COST = 1.2


def consumer_regs(consumers: int) -> int:
    """Registers ``setmaxnreg`` gives a consumer thread beside the producer's 24: a multiple of
    8, at most 240 (two consumers: 240; three: 160)."""
    return min(240, wgmma_consumer_regs(consumers, PRODUCER_REGS))


def fits(shape: AttentionShape, bm: int, bn: int, stages: int, smem: int = SM90_SMEM_OPTIN) -> bool:
    # scores, O, P as 16-bit pairs; a causal mask's test holds about one more register for every
    # four scores (192x128 d64 causal spilled 72 bytes at 160 registers, the same tile without
    # the mask none)
    d = wgmma_padded_dim(shape.head_dim)
    fragments = bn // 2 + d // 2 + bn // 4 + (bn // 4 if shape.causal else 0)
    smem_bytes = 2 * d * (bm + 2 * stages * bn) + 1024 + 64
    return fragments + OVERHEAD_REGS <= consumer_regs(bm // 64) and smem_bytes <= smem


def query_tiles(shape: AttentionShape, bm: int) -> int:
    """Tiles of ``bm`` query rows over every (batch, head): a CTA each, or a persistent grid's work."""
    return -(-shape.seq_q // bm) * shape.batch * shape.heads


def key_padding(shape: AttentionShape, bm: int, bn: int) -> float:
    """Keys computed per key a row needs: the last tile's past the sequence end, and (causal)
    the tiles that straddle each query tile's diagonal, which grow with ``bn``."""
    tiles_of = lambda last_key: min(-(-last_key // bn), -(-shape.seq_kv // bn))  # noqa: E731
    if not shape.causal:
        return tiles_of(shape.seq_kv) * bn / shape.seq_kv
    q_tiles = -(-shape.seq_q // bm)
    computed = sum(tiles_of((qt + 1) * bm + shape.offset) * bn * bm for qt in range(q_tiles))
    return computed / max(shape.pairs, 1)


def cost(shape: AttentionShape, bm: int, bn: int, stages: int, sm_count: int) -> float:
    """Waves of CTAs, weighted by how much of each step is useful: a narrow key tile pays the
    softmax's fixed costs (max, exp, shuffles) and a barrier round trip per fewer keys, a wide
    one computes more masked keys at the diagonal and the sequence end, and a shallow ring
    exposes load latency."""
    waves = -(-query_tiles(shape, bm) // sm_count)
    padding = -(-shape.seq_q // bm) * bm / shape.seq_q  # rows computed for nothing at the tail
    per_step = 1.0 + 16.0 / bn + (0.1 if stages < 3 else 0.0)
    # one consumer warpgroup has no other's GEMMs to hide its softmax behind
    alone = 1.4 if bm == 64 else 1.0
    return waves * bm * padding * key_padding(shape, bm, bn) * per_step * alone


def mma_fits(shape: AttentionShape, bm: int, bn: int, stages: int, smem: int, wm: int = 16) -> bool:
    """Whether the mma.sync kernel's tile fits: its fragments in registers (``wm // 16`` m16 tiles
    a warp), Q and the K/V ring in ``smem``, and the K/V copies even over its threads (16 bytes a
    thread a step)."""
    d, mt = mma_padded_dim(shape.head_dim), wm // 16
    fragments = (d // 4 if q_in_registers(d, wm) else 4 * mt) + mt * (bn // 2 + d // 2 + bn // 4)
    row = -(-d // 64) * 64  # shared-memory rows pad to whole swizzle groups
    return (fragments <= MMA_FRAGMENT_REGS and 2 * row * (bm + 2 * stages * bn) <= smem and bm % wm == 0
            and bn * d // 8 % (32 * bm // wm) == 0)


def mma_attention_configs(shape: AttentionShape, arch: CUDA, topk: int = 8) -> list[Config]:
    """``attention_mma`` configs for ``shape`` on ``arch`` (sm_80 and later), cheapest predicted
    first (the wgmma template's estimate: waves, padding and a step's fixed costs; warps of 32
    rows first among equals)."""
    options = []
    for bm, bn in MMA_TILES:
        for wm in MMA_WARP_ROWS:
            for stages in (2, 3):
                if mma_fits(shape, bm, bn, stages, arch.smem_per_block_optin, wm):
                    options.append((cost(shape, bm, bn, stages, arch.sm_count), -wm, bm, bn, stages))
    return [Config("attention_mma", block=(bm, bn), warp=(-neg,), pipeline_stages=stages, cost=c)
            for c, neg, bm, bn, stages in sorted(options)[:topk]]


def attention_configs(shape: AttentionShape, arch: CUDA, topk: int = 8) -> list[Config]:
    """Configs for ``shape`` on ``arch``, cheapest predicted first: the wgmma template's on
    Hopper (``sm_90a``), the mma.sync one's on other GPUs from sm_80; none where neither takes
    the shape (an older GPU, a head dim or dtype neither covers: :func:`fused_fits`). At head
    dims other than :data:`WGMMA_ALONE_HEAD_DIMS` Hopper gets both: the wgmma template computes
    P·V over whole 64-column chunks (96 over 128), mma.sync over whole 16-column steps."""
    major, minor = arch.compute_capability
    if not fused_fits(shape, 10 * major + minor):
        return []
    if not arch.has_wgmma:
        return mma_attention_configs(shape, arch, topk)
    wgmma = wgmma_attention_configs(shape, arch, topk)
    if shape.head_dim in WGMMA_ALONE_HEAD_DIMS:
        return wgmma
    # predicted slower than the wgmma tile of the same size (what a run without a GPU ranks by)
    return wgmma + [dataclasses.replace(c, cost=c.cost * MMA_BESIDE_WGMMA_COST)
                    for c in mma_attention_configs(shape, arch, BESIDE_WGMMA_TOPK)]


def wgmma_attention_configs(shape: AttentionShape, arch: CUDA, topk: int = 8) -> list[Config]:
    """``attention_wgmma`` configs for ``shape`` on a Hopper ``arch``, cheapest predicted first
    (each tile also on a persistent grid where the tiles outnumber the SMs)."""
    options = []
    for bm, bn in TILES:
        for stages in (2, 3, 4):
            if fits(shape, bm, bn, stages, arch.smem_per_block_optin):
                options.append((cost(shape, bm, bn, stages, arch.sm_count), bm, bn, stages))
    options.sort()
    configs = []
    for c, bm, bn, stages in options:
        configs.append(Config("attention_wgmma", block=(bm, bn), pipeline_stages=stages, cost=c))
        # where the tiles outnumber the SMs, the same tile on a persistent grid: measured either
        # way round by shape (H200: 18% faster on GPT-2's d64 causal shape, 2-9% slower at d128)
        if query_tiles(shape, bm) > arch.sm_count:
            configs.append(Config("attention_wgmma", block=(bm, bn), pipeline_stages=stages, persistent=True, cost=c))
    return configs[:topk]
