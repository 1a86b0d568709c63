"""Split-KV decode attention: which layouts the ``decode_attention`` template should try for the
chunk step, and which warps a CTA for the merge (``decode_combine``).

A config is ``block = (tile,)`` keys a CTA loads a step, ``thread = (values a lane,)`` of each
key (16 or 32 bytes), ``warp = (warps,)``. The kernel is a stream: what it needs is enough
loads in flight per SM (HBM's latency times its bandwidth: about 30 KB an SM on an H100 or
H200) without spilling registers, and few keys loaded past a chunk's end. The cost ranks by
the bytes a thread has in flight, capped where the SM's resident CTAs cover the latency, and by
the chunk's padding to whole tiles.
"""

from __future__ import annotations

import dataclasses

from fastdlight.analysis.decode_attention import (
    DecodeAttentionShape,
    block_rows,
    chunk_of,
    combine_fits,
    key_lanes,
    layout_fits,
    mma_step_fits,
    row_blocks,
    split_fits,
    staged_fits,
)
from fastdlight.arch import CUDA
from fastdlight.config import Config

#: registers a thread may hold in fragments (q, K, V, scores, the output rows) beside addresses
MAX_FRAGMENT_REGS = 176
#: bytes in flight an SM needs to cover HBM's latency
SM_BYTES_IN_FLIGHT = 32 * 1024
#: a cache length to rank by when the function's is symbolic
TYPICAL_LENGTH = 4096
#: the best layouts also tried with their tiles staged in shared memory, and the deepest ring:
#: a CTA streams its chunk one tile round trip at a time, and one tile in flight a CTA (four
#: CTAs an SM) is about 3.5 TB/s at HBM's latency (H200: 3.3-3.6 TB/s measured at B1)
STAGED_LAYOUTS = 2
MAX_STAGES = 4
#: CTA sizes of the tensor-core step
MMA_WARPS = (1, 2, 4)


def fragment_regs(shape: DecodeAttentionShape, loads: int, per_lane: int) -> int:
    """32-bit registers of a thread's fragments: q and the output rows (its CTA's block of
    them) in fp32, two sets of ``loads`` keys' K and V values (16-bit pairs: the next tile's
    arrive while one is used), their scores."""
    rows = block_rows(shape.rows)
    return 2 * rows * per_lane + 2 * loads * per_lane + loads * rows


def cost(shape: DecodeAttentionShape, seq_kv: int, tile: int, per_lane: int, warps: int, arch: CUDA) -> float:
    loads = tile // (warps * (32 // key_lanes(shape.head_dim, per_lane)))
    in_flight = loads * per_lane * 2 * 2 * warps * 32  # K and V bytes of a tile a CTA has requested
    regs = fragment_regs(shape, loads, per_lane) + 40
    resident = max(1, min(arch.max_threads_per_sm // (warps * 32), 65536 // (regs * warps * 32)))
    chunk = chunk_of(seq_kv, shape.splits, shape.appended)
    padding = -(-chunk // tile) * tile / chunk
    ctas = shape.batch * shape.kv_heads * shape.splits * row_blocks(shape.rows)
    per_sm = min(resident, -(-ctas // arch.sm_count))
    starved = max(1.0, SM_BYTES_IN_FLIGHT / (in_flight * per_sm))
    return padding * starved


def decode_attention_configs(found: tuple[DecodeAttentionShape, object], arch: CUDA, topk: int = 8) -> list[Config]:
    """Configs for the chunk step ``found`` (``(shape, seq_kv)`` of
    :func:`~fastdlight.analysis.decode_attention.match_decode_split`), cheapest predicted first."""
    shape, seq_kv = found
    if not split_fits(shape):
        return []
    length = seq_kv if isinstance(seq_kv, int) else TYPICAL_LENGTH
    options = []
    for warps in (4, 2, 8):
        for per_lane in (8, 16):
            for loads in (1, 2, 4, 8):
                if shape.head_dim % per_lane or fragment_regs(shape, loads, per_lane) > MAX_FRAGMENT_REGS:
                    continue
                lanes = key_lanes(shape.head_dim, per_lane)
                if lanes > 32:
                    continue
                tile = loads * warps * (32 // lanes)
                if layout_fits(shape, tile, per_lane, warps):
                    options.append((cost(shape, length, tile, per_lane, warps, arch), tile, per_lane, warps))
    options.sort(key=lambda o: o[0])
    configs = [Config("decode_attention", block=(tile,), thread=(per_lane,), warp=(warps,), cost=c)
               for c, tile, per_lane, warps in options[:topk]]
    staged = staged_variants(shape, configs[:STAGED_LAYOUTS]) if arch.has_async_copy else []
    return configs + staged + (mma_configs(shape) if arch.has_async_copy else [])


def mma_configs(shape: DecodeAttentionShape) -> list[Config]:
    """The tensor-core chunk step (``decode_attention_mma``, sm_80+) for two or more rows a
    K/V head, in CTAs of 1, 2 and 4 warps, measured beside the CUDA-core layouts (the cost does not model it). A warp holds 16
    keys' K and V twice over (the next tile's in flight) in 128 registers at D = 128, so
    CTAs of one or two warps are what keep enough of them resident an SM."""
    if block_rows(shape.rows) < 2:
        # one row a head: the CUDA-core step waits on HBM, not on its instructions (H200, B1 H32
        # L4096: 0.0214 ms on tensor cores against 0.0190), and a static one-chunk step spills here
        return []
    return [Config("decode_attention_mma", block=(16,), warp=(w,), cost=float(i))
            for i, w in enumerate(w for w in MMA_WARPS if mma_step_fits(shape, w))]


def staged_variants(shape: DecodeAttentionShape, configs: list[Config]) -> list[Config]:
    """``configs`` with their tiles staged in shared memory: the deepest ring that fits (up to
    :data:`MAX_STAGES`), more of a CTA's loads in flight than its registers hold, and a ring of
    three where that is shallower. Deeper is not always faster: at B1 H32 L4096 (16 chunks,
    16-key tiles; H200, 2026-12-02) a ring of 3 ran 0.3 us ahead of one of 4, and 5 and 6 were
    slower still. Measured beside the register-pipelined ones (the cost does not model the ring)."""
    out = []
    for c in configs:
        deepest = next((s for s in range(MAX_STAGES, 2, -1) if staged_fits(shape, c.block[0], c.warp[0], s)), 0)
        rings = (deepest, 3) if deepest > 3 else (deepest,) if deepest else ()
        out += [dataclasses.replace(c, pipeline_stages=stages) for stages in rings]
    return out


def decode_combine_configs(shape: DecodeAttentionShape, topk: int = 4) -> list[Config]:
    """Configs of the merge of ``shape``'s chunks: warps sharing the chunks of one output row,
    enough that each folds a few (the chunks are L2 hits: latency, not bandwidth)."""
    options = [w for w in (1, 2, 4, 8) if combine_fits(shape, w)]
    options.sort(key=lambda w: abs(-(-shape.splits // w) - 8))
    per_lane = -(-shape.head_dim // 32)
    return [Config("decode_combine", block=(shape.head_dim,), thread=(per_lane,), warp=(w,), cost=float(i))
            for i, w in enumerate(options[:topk])]
