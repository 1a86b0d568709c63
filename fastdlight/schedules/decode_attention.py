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
stream reads a tile's entries a tile ahead (:func:`build_kernel`'s ``fetch_pages``), so its K and
V loads do not wait for a table load each round trip.

The merge is a kernel of its own (``kind == "decode_combine"``, :func:`.decode_combine.build_combine`:
a CTA per output row), or, for a merged shape, the chunk step's last CTA of each (batch, K/V
head); with one chunk each CTA writes its output itself (:func:`.decode_combine.merge_tails`).
"""

from __future__ import annotations

import functools
import math

from tvm import tirx
from tvm.script import tirx as T

from fastdlight.analysis.decode_attention import (
    EMPTY_MAX,
    VECTOR,
    DecodeAttentionShape,
    block_rows,
    combine_fits,
    key_lanes,
    layout_fits,
    match_decode_combine,
    match_decode_split,
    row_blocks,
    split_fits,
    staged_fits,
)
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate
from fastdlight.schedules.decode_combine import build_combine, cta_place, write_chunk

LOG2E = 1.0 / math.log(2.0)


def build_kernel(func: tirx.PrimFunc, shape: DecodeAttentionShape, seq_kv, tile: int, dims_per_lane: int,
                 warps: int, stages: int = 1) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` (the chunk step of ``shape`` over ``seq_kv`` cached keys):
    ``warps`` warps, ``dims_per_lane`` values of a key a lane, ``tile`` keys loaded a step;
    ``stages`` > 1: tiles staged in shared memory, ``stages - 1`` of them in flight (see
    :func:`~fastdlight.analysis.decode_attention.staged_fits`). Same parameters, same result."""
    B, G, RT, D, S = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.splits
    # a CTA holds a block of R of the RT rows of its (batch, K/V head): all of them, or (MQA,
    # several query tokens) one of ``blocks``; the last block may be short
    blocks, R = row_blocks(RT), block_rows(RT)
    short = blocks * R > RT
    lanes = key_lanes(D, dims_per_lane)  # lanes a key (a power of two)
    active = D // dims_per_lane  # lanes that hold values (fewer where D is no power of two)
    per_warp = 32 // lanes  # keys a warp loads at once
    slots = warps * per_warp
    U, E, V8 = tile // slots, dims_per_lane, dims_per_lane // VECTOR
    threads, appended, dtype = warps * 32, shape.appended, shape.dtype
    q_scale = tirx.const(shape.scale * LOG2E, "float32")
    reduce_steps = lanes.bit_length() - 1
    merge_steps = per_warp.bit_length() - 1

    page = shape.page_size
    params = list(func.params)
    pool_elems = functools.reduce(lambda a, b: a * b, params[1].shape)
    width = params[3].shape[1] if page else 1

    def cache_length(lengths, bg):
        """The keys in the cache of K/V head ``bg``'s sequence (int64)."""
        if page:
            return T.Cast("int64", lengths[bg // G])
        return tirx.const(seq_kv, "int64") if isinstance(seq_kv, int) else tirx.Cast("int64", seq_kv)

    def key_count(n_cache):
        return n_cache + T.int64(1) if appended else n_cache

    def q_value(Qf, bg, r0, r, e0, e):
        """Row ``r0 + r``'s query value ``e0 + e`` of K/V head ``bg``, scaled (zero past D or
        past the rows: not read)."""
        value = T.Cast("float32", Qf[(bg * RT + r0 + r) * D + e0 + e]) * q_scale
        tests = [*([e0 < D] if active < lanes else []), *([r0 + r < RT] if short else [])]
        return tirx.if_then_else(tirx.all(*tests), value, tirx.const(0.0, "float32")) if tests else value

    def holds(cond, e0):
        """``cond``, for a lane that holds values: lanes of a key past D load and hold zeros."""
        return tirx.all(cond, e0 < D) if active < lanes else cond

    staged = stages > 1
    # where value group v of a key goes: a register set's next 8 values, or (staged) the ring's
    # layout below, each 16-byte group of the threads side by side (no bank conflicts)
    v_stride = threads * VECTOR if staged else VECTOR

    @T.macro
    def copy_registers(dst, at, src, src_at):
        for e in T.vectorized(VECTOR):
            dst[at + e] = src[src_at + e]

    @T.macro
    def copy_async(dst, at, src, src_at):
        T.ptx["cp.async.cg.shared.global"](dst.ptr_to([at]), src.ptr_to([src_at]), 16)

    copy16 = copy_async if staged else copy_registers

    @T.macro
    def zero16(dst, at):
        for e in T.vectorized(VECTOR):
            dst[at + e] = T.Cast(dtype, T.float32(0))

    @T.macro
    def load_contiguous(dst, base, cache, new, table, bg, key, end, e0, n_cache):
        """Values ``e0 ..`` of key ``key`` of K/V head ``bg``: the cache's, the appended token's,
        or zeros past the chunk (another CTA's keys are not read twice)."""
        for v in T.unroll(V8):
            if holds(key < T.min(end, T.Cast("int32", n_cache)), e0):
                copy16(dst, base + v * v_stride, cache,
                       (T.Cast("int64", bg) * n_cache + T.Cast("int64", key)) * D + e0 + v * VECTOR)
            elif holds(key < end, e0):  # the appended token (never without one)
                copy16(dst, base + v * v_stride, new, bg * D + e0 + v * VECTOR)
            else:
                zero16(dst, base + v * v_stride)

    def page_entry(table, bg, key):
        """The table's entry for the page holding key ``key`` of K/V head ``bg``'s sequence."""
        return T.Cast("int64", table[T.Cast("int64", bg // G) * width + T.Cast("int64", key // page)])

    def pool_key(entry, bg, key):
        """Where in the pool key ``key`` of K/V head ``bg`` is, its page's table entry given:
        slot ``key % page`` of that page."""
        return (entry * G + bg % G) * page + T.Cast("int64", key % page)

    @T.macro
    def load_paged(dst, base, cache, new, table, bg, key, end, e0, n_cache):
        """The same from a page pool: key ``key`` is slot ``key % page`` of the sequence's page
        ``key // page`` (its table's entry)."""
        for v in T.unroll(V8):
            if holds(key < end, e0):
                at = T.meta_var(pool_key(page_entry(table, bg, key), bg, key))
                copy16(dst, base + v * v_stride, cache, at * D + e0 + v * VECTOR)
            else:
                zero16(dst, base + v * v_stride)

    load = load_paged if page else load_contiguous

    def key_of(start, step, u, slot):
        return start + step * tile + u * slots + slot

    @T.macro
    def fetch(kr, vr, buf, step, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache):
        """Tile ``step``'s K and V values into register set ``buf`` (zeros past the chunk)."""
        for u in T.unroll(U):
            key = T.meta_var(key_of(start, step, u, slot))
            load(kr, (buf * U + u) * E, Kf, Knf, Tf, bg, key, end, e0, n_cache)
            load(vr, (buf * U + u) * E, Vf, Vnf, Tf, bg, key, end, e0, n_cache)

    @T.macro
    def fetch_pages(pg, buf, step, Tf, bg, start, end, slot):
        """(Paged, register sets.) The table entries of tile ``step``'s keys into page set
        ``buf``, read a tile ahead of the loads that use them: read with them, each tile's K and
        V loads waited for a table load first, two round trips a tile where a contiguous cache
        has one."""
        for u in T.unroll(U):
            key = T.meta_var(key_of(start, step, u, slot))
            if key < end:
                pg[buf * U + u] = page_entry(Tf, bg, key)
            else:
                pg[buf * U + u] = T.int64(0)

    @T.macro
    def fetch_paged(kr, vr, pg, buf, step, Kf, Vf, bg, start, end, slot, e0):
        """Tile ``step``'s K and V values into register set ``buf``, at the pages page set
        ``buf`` holds (zeros past the chunk)."""
        for u in T.unroll(U):
            key = T.meta_var(key_of(start, step, u, slot))
            for v in T.unroll(V8):
                if holds(key < end, e0):
                    at = T.meta_var(pool_key(pg[buf * U + u], bg, key) * D + e0 + v * VECTOR)
                    copy16(kr, (buf * U + u) * E + v * VECTOR, Kf, at)
                    copy16(vr, (buf * U + u) * E + v * VECTOR, Vf, at)
                else:
                    zero16(kr, (buf * U + u) * E + v * VECTOR)
                    zero16(vr, (buf * U + u) * E + v * VECTOR)

    def ring_base(st, u, kv, tid):
        """Where thread ``tid``'s values of load ``u`` (K: ``kv`` 0, V: 1) of ring stage ``st`` start."""
        return ((T.Cast("int32", st) * U + u) * 2 + kv) * V8 * threads * VECTOR + tid * VECTOR

    @T.macro
    def fetch_staged(ring, st, step, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache, tid):
        """Tile ``step``'s K and V values copied asynchronously into ring stage ``st`` (each
        thread the values it will read: no barrier), one commit group a tile."""
        for u in T.unroll(U):
            key = T.meta_var(key_of(start, step, u, slot))
            load(ring, ring_base(st, u, 0, tid), Kf, Knf, Tf, bg, key, end, e0, n_cache)
            load(ring, ring_base(st, u, 1, tid), Vf, Vnf, Tf, bg, key, end, e0, n_cache)
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def unstage(kr, vr, ring, st, tid):
        """Ring stage ``st`` into register set 0."""
        for u in T.unroll(U):
            for v in T.unroll(V8):
                for e in T.vectorized(VECTOR):
                    kr[u * E + v * VECTOR + e] = ring[ring_base(st, u, 0, tid) + v * v_stride + e]
                for e in T.vectorized(VECTOR):
                    vr[u * E + v * VECTOR + e] = ring[ring_base(st, u, 1, tid) + v * v_stride + e]

    @T.macro
    def consume(kr, vr, buf, step, qr, sc, mr, lr, acc, top, start, end, slot):
        """Tile ``step`` (in register set ``buf``) into the slot's online softmax."""
        for u in T.unroll(U):
            key = T.meta_var(key_of(start, step, u, slot))
            for r in T.unroll(R):
                sc[u * R + r] = T.float32(0)
                for e in T.unroll(E):
                    sc[u * R + r] = sc[u * R + r] + qr[r * E + e] * T.Cast("float32", kr[(buf * U + u) * E + e])
                for o in T.unroll(reduce_steps):
                    sc[u * R + r] = sc[u * R + r] + T.tvm_warp_shuffle_xor(
                        T.uint32(0xFFFFFFFF), sc[u * R + r], 1 << o, 32, 32)
                if key >= end:
                    sc[u * R + r] = T.float32(-math.inf)
        for r in T.unroll(R):
            top[0] = mr[r]
            for u in T.unroll(U):
                top[0] = T.max(top[0], sc[u * R + r])
            alpha = T.meta_var(T.exp2(mr[r] - top[0]))
            lr[r] = lr[r] * alpha
            for e in T.unroll(E):
                acc[r * E + e] = acc[r * E + e] * alpha
            mr[r] = top[0]
            for u in T.unroll(U):
                sc[u * R + r] = T.exp2(sc[u * R + r] - top[0])
                lr[r] = lr[r] + sc[u * R + r]
                for e in T.unroll(E):
                    acc[r * E + e] = acc[r * E + e] + sc[u * R + r] * T.Cast("float32", vr[(buf * U + u) * E + e])

    write = write_chunk(shape, warps, threads)

    @T.macro
    def stream_registers(kr, vr, pg, ring, qr, sc, mr, lr, acc, top, Kf, Vf, Knf, Vnf, Tf, bg, start, end, chunk, slot,
                         e0, n_cache, tid):
        """Two register sets: tile t + 1's loads are issued before tile t is used."""
        fetch(kr, vr, 0, 0, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache)
        for pair in T.serial((chunk + 2 * tile - 1) // (2 * tile)):
            fetch(kr, vr, 1, pair * 2 + 1, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache)
            consume(kr, vr, 0, pair * 2, qr, sc, mr, lr, acc, top, start, end, slot)
            fetch(kr, vr, 0, pair * 2 + 2, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache)
            consume(kr, vr, 1, pair * 2 + 1, qr, sc, mr, lr, acc, top, start, end, slot)

    @T.macro
    def stream_pages_ahead(kr, vr, pg, ring, qr, sc, mr, lr, acc, top, Kf, Vf, Knf, Vnf, Tf, bg, start, end, chunk,
                           slot, e0, n_cache, tid):
        """(Paged.) As :func:`stream_registers`, each tile's page entries read a tile earlier
        (page set t % 2 for tile t)."""
        fetch_pages(pg, 0, 0, Tf, bg, start, end, slot)
        fetch_pages(pg, 1, 1, Tf, bg, start, end, slot)
        fetch_paged(kr, vr, pg, 0, 0, Kf, Vf, bg, start, end, slot, e0)
        for pair in T.serial((chunk + 2 * tile - 1) // (2 * tile)):
            fetch_paged(kr, vr, pg, 1, pair * 2 + 1, Kf, Vf, bg, start, end, slot, e0)
            fetch_pages(pg, 0, pair * 2 + 2, Tf, bg, start, end, slot)
            consume(kr, vr, 0, pair * 2, qr, sc, mr, lr, acc, top, start, end, slot)
            fetch_paged(kr, vr, pg, 0, pair * 2 + 2, Kf, Vf, bg, start, end, slot, e0)
            fetch_pages(pg, 1, pair * 2 + 3, Tf, bg, start, end, slot)
            consume(kr, vr, 1, pair * 2 + 1, qr, sc, mr, lr, acc, top, start, end, slot)

    @T.macro
    def stream_staged(kr, vr, pg, ring, qr, sc, mr, lr, acc, top, Kf, Vf, Knf, Vnf, Tf, bg, start, end, chunk, slot, e0,
                      n_cache, tid):
        """A ring of ``stages`` tiles in shared memory, ``stages - 1`` in flight while one is
        used: a tile is moved to registers before the copy that reuses its stage is issued."""
        for s0 in T.unroll(stages - 1):
            fetch_staged(ring, s0, s0, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache, tid)
        for step in T.serial((chunk + tile - 1) // tile):
            T.ptx["cp.async.wait_group"](stages - 2)
            unstage(kr, vr, ring, step % stages, tid)
            fetch_staged(ring, (step + stages - 1) % stages, step + stages - 1, Kf, Vf,
                         Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache, tid)
            consume(kr, vr, 0, step, qr, sc, mr, lr, acc, top, start, end, slot)
        T.ptx["cp.async.wait_group"](0)

    stream = stream_staged if staged else (stream_pages_ahead if page else stream_registers)
    page_sets = 2 * U if page and not staged else 1  # (the register sets' page entries)

    @T.macro
    def body(Q, Kc, Vc, Kn, Vn, Table, Lengths, O, M, L, Tickets, Y):
        T.device_entry()
        bid = T.cta_id([B * G * S * blocks])
        tid = T.thread_id([threads])
        pool = T.SMEMPool()
        m_s = pool.alloc((warps * R,), "float32", align=16)
        l_s = pool.alloc((warps * R,), "float32", align=16)
        o_s = pool.alloc((warps * R * D,), "float32", align=16)
        last = pool.alloc((1,), "int32", align=16)
        # (128-byte aligned: H200, B1 H32 L4096, 17 chunks, a ring of 4 tiles of 16 keys: 0.0200 ms,
        # against 0.0256 with the ring 48 bytes past a 128-byte boundary, 0.0230 at 64)
        ring = pool.alloc((stages * U * 2 * E * threads if staged else VECTOR,), dtype, align=128)
        pool.commit()
        Kf = T.decl_buffer((pool_elems,), dtype, data=Kc.data)
        Vf = T.decl_buffer((pool_elems,), dtype, data=Vc.data)
        Tf = T.decl_buffer((B * width,), "int32", data=Table.data)
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
        nk[0] = cache_length(Lengths, bg)
        lane = T.meta_var(tid % 32)
        warp = T.meta_var(tid // 32)
        slot = T.meta_var(warp * per_warp + lane // lanes)
        e0 = T.meta_var((lane % lanes) * E)
        # key positions in int32 (addresses stay int64): with a symbolic length, int64 keys cost
        # each key's bound test four instructions (H200, B16 L4096: 7% slower than a static length)
        chunk = T.meta_var(T.Cast("int32", (key_count(nk[0]) + T.int64(S - 1)) // T.int64(S)))
        start = T.meta_var(part * chunk)
        end = T.meta_var(T.min(start + chunk, T.Cast("int32", key_count(nk[0]))))
        for r in T.unroll(R):
            for e in T.unroll(E):
                qr[r * E + e] = q_value(Qf, bg, r0, r, e0, e)
            mr[r] = T.float32(EMPTY_MAX)
            lr[r] = T.float32(0)
            for e in T.unroll(E):
                acc[r * E + e] = T.float32(0)
        stream(kr, vr, pg, ring, qr, sc, mr, lr, acc, top, Kf, Vf, Knf, Vnf, Tf, bg, start, end, chunk, slot, e0,
               nk[0], tid)
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
        if lane < active:
            for r in T.unroll(R):
                if lane == 0:
                    m_s[warp * R + r] = mr[r]
                    l_s[warp * R + r] = lr[r]
                for e in T.unroll(E):
                    o_s[(warp * R + r) * D + e0 + e] = acc[r * E + e]
        write(m_s, l_s, o_s, O, M, L, Tickets, Y, bg, r0, out0, tid, merged, last, st)

    # the body reads the function's own parameters (symbolic ones included): the kernel takes
    # its place with the same signature, in a dispatcher's branch as well
    outputs = 4 if shape.merged else 3
    q, k, v, (o, m, l) = (*params[:3], params[len(params) - outputs:][:3])
    # (a buffer a form does not have: one of the others, its branch never taken)
    kn, vn = params[3:5] if appended else (k, v)
    table, lengths = params[3:5] if page else (q, q)
    tickets, y = (params[-5], params[-1]) if shape.merged else (q, q)

    @T.prim_func(check_well_formed=False)  # (its buffers are the function's parameters)
    def kernel():
        body(q, k, v, kn, vn, table, lengths, o, m, l, tickets, y)

    return func.with_body(kernel.body).with_attrs({"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True})


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
