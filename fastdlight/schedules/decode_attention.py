"""Split-KV decode attention (``kind == "decode_attention"``): the chunk step of a
:func:`~fastdlight.analysis.decode_attention.decode_split_func` as one TIRx kernel on CUDA cores,
for any cache length (the function's own, symbolic or not: the kernel reads it at run time).

Decode reads every cached key and value once for a few query rows: 2 to 16 multiply-adds a
loaded element, far below what the CUDA cores sustain, so the kernel is a stream at HBM's
bandwidth and tensor cores would only add data movement. A CTA takes one (batch, K/V head,
chunk) and up to 8 of its rows (more, as MQA's 32 query heads on one K/V head, come in blocks
of rows, a CTA each; past a few rows the step is arithmetic-bound: H200, 32 rows 0.20x torch's
tensor-core kernel). Each key vector is split over ``head_dim / dims_per_lane`` lanes, 16 bytes
(8 values) a load, rounded up to a power of two (80 and 96 over 16 lanes at 8 values each, the
lanes past D holding zeros and loading nothing); the CTA's lanes cover ``slots`` keys at once,
and each thread issues the K and V loads of ``tile / slots`` keys before it uses any, into one
of two register sets: the next tile's loads are in flight while the current one is scored
(the bytes in flight that keep HBM busy). Every slot (a lane group) runs an online softmax of
its own, in the exp2 domain with the scale folded into Q: the lanes of a group add their
partial dot products with shuffles, so all of them hold each score and need no further
exchange; no synchronization until the chunk ends. Then the groups of a warp merge by
shuffles, the warps through shared memory, and the chunk's ``o``, ``m`` and ``l`` are written
for the merge.

A CTA streams its chunk a tile round trip at a time: with one tile in flight a CTA and four CTAs
an SM, HBM's latency bounds the step near 3.5 TB/s on an H200 (3.3-3.6 measured at batch 1).
With ``pipeline_stages`` 3-4 the tiles go through a ring of that many stages in shared memory
instead: each thread copies the values it will read with ``cp.async`` (so no barrier), a commit
group a tile, ``stages - 1`` tiles in flight while one is moved to registers and scored.

From a paged cache a key's address needs its page's table entry first: the register-set
stream reads a tile's entries a tile ahead (:func:`.decode_attention_parts.chunk_stream`), so
its K and V loads do not wait for a table load each round trip.

The merge is a kernel of its own (``kind == "decode_combine"``, :func:`.decode_combine.build_combine`:
a CTA per output row), or, for a merged shape, the chunk step's last CTA of each (batch, K/V
head); with one chunk each CTA writes its output itself (:func:`.decode_combine.merge_tails`).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from fastdlight.analysis.decode_attention import (
    VECTOR,
    DecodeAttentionShape,
    combine_fits,
    layout_fits,
    match_decode_combine,
    match_decode_split,
    split_fits,
    staged_fits,
)
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate
from fastdlight.schedules.decode_attention_parts import (
    ChunkLayout,
    chunk_smem,
    chunk_stream,
    online_softmax,
    step_buffers,
)
from fastdlight.schedules.decode_combine import build_combine, cta_place, write_chunk


def build_kernel(func: tirx.PrimFunc, shape: DecodeAttentionShape, seq_kv, tile: int, dims_per_lane: int,
                 warps: int, stages: int = 1) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` (the chunk step of ``shape`` over ``seq_kv`` cached keys):
    ``warps`` warps, ``dims_per_lane`` values of a key a lane, ``tile`` keys loaded a step;
    ``stages`` > 1: tiles staged in shared memory, ``stages - 1`` of them in flight (see
    :func:`~fastdlight.analysis.decode_attention.staged_fits`). Same parameters, same result."""
    body = _step_body(ChunkLayout.of(func, shape, seq_kv, tile, dims_per_lane, warps, stages))
    # the body reads the function's own parameters (symbolic ones included): the kernel takes
    # its place with the same signature, in a dispatcher's branch as well
    b = step_buffers(func, shape)

    @T.prim_func(check_well_formed=False)  # (its buffers are the function's parameters)
    def kernel():
        body(b.q, b.k, b.v, b.kn, b.vn, b.table, b.lengths, b.o, b.m, b.l, b.tickets, b.y)

    attrs = {"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True}
    return func.with_body(kernel.body).with_attrs(attrs)


def _slot_merge(lay: ChunkLayout):
    """The macro that merges the slots' online softmaxes of each warp by shuffles and leaves the
    warp's rows' max, sum and values in shared memory."""
    R, E, D, lanes = lay.rows, lay.per_lane, lay.shape.head_dim, lay.lanes
    merge_steps = lay.per_warp.bit_length() - 1

    @T.macro
    def merge_slots(mr, lr, acc, other, m_s, l_s, o_s, lane, warp, e0):
        # the warp's key groups merged (lanes ``lanes`` apart hold the same values of other keys)
        for o in T.unroll(merge_steps):
            for r in T.unroll(R):
                other[0] = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), mr[r], lanes << o, 32, 32)
                other[1] = T.max(mr[r], other[0])
                mine = T.meta_var(T.exp2(mr[r] - other[1]))
                theirs = T.meta_var(T.exp2(other[0] - other[1]))
                lr[r] = lr[r] * mine + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), lr[r], lanes << o, 32, 32) * theirs
                for e in T.unroll(E):
                    acc[r * E + e] = acc[r * E + e] * mine + T.tvm_warp_shuffle_xor(
                        T.uint32(0xFFFFFFFF), acc[r * E + e], lanes << o, 32, 32) * theirs
                mr[r] = other[1]
        if lane < lay.active:
            for r in T.unroll(R):
                if lane == 0:
                    m_s[warp * R + r] = mr[r]
                    l_s[warp * R + r] = lr[r]
                for e in T.unroll(E):
                    o_s[(warp * R + r) * D + e0 + e] = acc[r * E + e]

    return merge_slots


def _step_body(lay: ChunkLayout):
    """The kernel's body: a CTA's chunk streamed through its slots' online softmaxes, merged, written."""
    shape, warps, threads, R, U, E = lay.shape, lay.warps, lay.threads, lay.rows, lay.loads, lay.per_lane
    B, G, RT, D, S, dtype = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.splits, shape.dtype
    init_rows, consume = online_softmax(lay)
    stream, merge_slots, write = chunk_stream(lay, consume), _slot_merge(lay), write_chunk(shape, warps, threads)
    page_sets = 2 * U if shape.page_size and not lay.staged else 1  # (the register sets' page entries)

    @T.macro
    def body(Q, Kc, Vc, Kn, Vn, Table, Lengths, O, M, L, Tickets, Y):
        T.device_entry()
        bid = T.cta_id([B * G * S * lay.blocks])
        tid = T.thread_id([threads])
        pool, m_s, l_s, o_s, last = chunk_smem(warps, R, D)
        # (128-byte aligned: H200, B1 H32 L4096, 17 chunks, a ring of 4 tiles of 16 keys: 0.0200 ms,
        # against 0.0256 with the ring 48 bytes past a 128-byte boundary, 0.0230 at 64)
        ring = pool.alloc((lay.stages * U * 2 * E * threads if lay.staged else VECTOR,), dtype, align=128)
        pool.commit()
        Kf = T.decl_buffer((lay.pool_elems,), dtype, data=Kc.data)
        Vf = T.decl_buffer((lay.pool_elems,), dtype, data=Vc.data)
        Tf = T.decl_buffer((B * lay.width,), "int32", data=Table.data)
        Qf = T.decl_buffer((B * G * RT * D,), dtype, data=Q.data)
        Knf = T.decl_buffer((B * G * D,), dtype, data=Kn.data)
        Vnf = T.decl_buffer((B * G * D,), dtype, data=Vn.data)
        qr = T.alloc_buffer((R * E,), "float32", scope="local")
        kr = T.alloc_buffer((2 * U * E,), dtype, scope="local")
        vr = T.alloc_buffer((2 * U * E,), dtype, scope="local")
        pg = T.alloc_buffer((page_sets,), "int64", scope="local")
        sc = T.alloc_buffer((U * R,), "float32", scope="local")
        mr = T.alloc_buffer((R,), "float32", scope="local")
        lr = T.alloc_buffer((R,), "float32", scope="local")
        acc = T.alloc_buffer((R * E,), "float32", scope="local")
        top = T.alloc_buffer((1,), "float32", scope="local")
        other = T.alloc_buffer((2,), "float32", scope="local")
        merged = T.alloc_buffer((3,), "float32", scope="local")
        nk = T.alloc_buffer((1,), "int64", scope="local")
        st = T.alloc_buffer((4,), "float32", scope="local")
        part, bg, r0, out0 = T.meta_var(cta_place(shape, bid))
        nk[0] = lay.cache_length(Lengths, bg)
        lane = T.meta_var(tid % 32)
        warp = T.meta_var(tid // 32)
        slot = T.meta_var(warp * lay.per_warp + lane // lay.lanes)
        e0 = T.meta_var((lane % lay.lanes) * E)
        # key positions in int32 (addresses stay int64): with a symbolic length, int64 keys cost
        # each key's bound test four instructions (H200, B16 L4096: 7% slower than a static length)
        chunk = T.meta_var(T.Cast("int32", (lay.key_count(nk[0]) + T.int64(S - 1)) // T.int64(S)))
        start = T.meta_var(part * chunk)
        end = T.meta_var(T.min(start + chunk, T.Cast("int32", lay.key_count(nk[0]))))
        init_rows(qr, mr, lr, acc, Qf, bg, r0, e0)
        stream(kr, vr, pg, ring, qr, sc, mr, lr, acc, top, Kf, Vf, Knf, Vnf, Tf, bg, start, end, chunk, slot, e0,
               nk[0], tid)
        merge_slots(mr, lr, acc, other, m_s, l_s, o_s, lane, warp, e0)
        write(m_s, l_s, o_s, O, M, L, Tickets, Y, bg, r0, out0, tid, merged, last, st)

    return body


class DecodeAttentionTemplate(ScheduleTemplate):
    """The chunk step (``decode_attention``) and the merge (``decode_combine``)."""

    kinds = ("decode_attention", "decode_combine")
    name = "decode_attention"

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        if len(config.block) != 1 or len(config.thread) != 1 or len(config.warp) != 1:
            return None
        if config.kind == "decode_combine":
            shape = match_decode_combine(func)
            warps = config.warp[0]
            return build_combine(func, shape, warps) if shape is not None and combine_fits(shape, warps) else None
        found = match_decode_split(func)
        if found is None or config.kind != "decode_attention":
            return None
        shape, seq_kv = found
        tile, per_lane, warps = config.block[0], config.thread[0], config.warp[0]
        if not split_fits(shape) or not layout_fits(shape, tile, per_lane, warps):
            return None
        stages = config.pipeline_stages
        if stages > 1 and not staged_fits(shape, tile, warps, stages):
            return None
        return build_kernel(func, shape, seq_kv, tile, per_lane, warps, stages)
