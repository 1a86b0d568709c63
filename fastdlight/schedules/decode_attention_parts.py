"""The parts the CUDA-core chunk step (:func:`.decode_attention.build_kernel`) is built from: its
layout's sizes (:class:`ChunkLayout`), the loads of a tile's keys (into register sets, or through
a ring in shared memory; from a contiguous cache or a page pool), the online softmax a tile goes
into, and the stream that puts them together. Also what the tensor-core step shares with it: its
buffers (:func:`step_buffers`) and its shared memory (:func:`chunk_smem`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

from tvm import tirx
from tvm.script import tirx as T

from fastdlight.analysis.decode_attention import (
    EMPTY_MAX,
    VECTOR,
    DecodeAttentionShape,
    block_rows,
    key_lanes,
    row_blocks,
)

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class ChunkLayout:
    """The sizes of a chunk step's kernel, derived once from its shape and config (in the
    macros, ``R``, ``U``, ``E`` and ``V8`` are ``rows``, ``loads``, ``per_lane`` and ``groups``)."""

    shape: DecodeAttentionShape
    seq_kv: object  # the cached keys: an int or the function's variable
    tile: int  # keys a CTA loads a step
    warps: int
    stages: int  # > 1: tiles staged in shared memory
    blocks: int  # row blocks a (batch, K/V head), a CTA each
    rows: int  # rows a CTA holds (the last block may be short)
    lanes: int  # lanes a key (a power of two)
    active: int  # lanes that hold values (fewer where D is no power of two)
    per_warp: int  # keys a warp loads at once
    loads: int  # keys a thread loads a tile
    per_lane: int  # values of a key a lane holds
    pool_elems: object  # elements of the K (or V) cache or page pool (symbolic or not)
    width: object  # entries of a sequence's page table (1: a contiguous cache)

    @classmethod
    def of(cls, func: tirx.PrimFunc, shape: DecodeAttentionShape, seq_kv, tile: int, dims_per_lane: int,
           warps: int, stages: int) -> ChunkLayout:
        # a CTA holds a block of R of the RT rows of its (batch, K/V head): all of them, or (MQA,
        # several query tokens) one of ``blocks``; the last block may be short
        lanes = key_lanes(shape.head_dim, dims_per_lane)
        params = func.params
        return cls(shape=shape, seq_kv=seq_kv, tile=tile, warps=warps, stages=stages,
                   blocks=row_blocks(shape.rows), rows=block_rows(shape.rows), lanes=lanes,
                   active=shape.head_dim // dims_per_lane, per_warp=32 // lanes,
                   loads=tile // (warps * (32 // lanes)), per_lane=dims_per_lane,
                   pool_elems=functools.reduce(lambda a, b: a * b, params[1].shape),
                   width=params[3].shape[1] if shape.page_size else 1)

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def slots(self) -> int:
        """Keys the CTA's lanes load at once (a lane group each)."""
        return self.warps * self.per_warp

    @property
    def groups(self) -> int:
        """16-byte groups of a lane's values of a key."""
        return self.per_lane // VECTOR

    @property
    def staged(self) -> bool:
        return self.stages > 1

    @property
    def v_stride(self) -> int:
        """Where value group v of a key goes: a register set's next 8 values, or (staged) the ring's
        layout (:meth:`ring_base`), each 16-byte group of the threads side by side (no bank conflicts)."""
        return self.threads * VECTOR if self.staged else VECTOR

    def cache_length(self, lengths, bg):
        """The keys in the cache of K/V head ``bg``'s sequence (int64)."""
        if self.shape.page_size:
            return T.Cast("int64", lengths[bg // self.shape.kv_heads])
        seq_kv = self.seq_kv
        return tirx.const(seq_kv, "int64") if isinstance(seq_kv, int) else tirx.Cast("int64", seq_kv)

    def key_count(self, n_cache):
        return n_cache + T.int64(1) if self.shape.appended else n_cache

    def q_value(self, Qf, bg, r0, r, e0, e):
        """Row ``r0 + r``'s query value ``e0 + e`` of K/V head ``bg``, scaled (zero past D or
        past the rows: not read)."""
        RT, D = self.shape.rows, self.shape.head_dim
        q_scale = tirx.const(self.shape.scale * LOG2E, "float32")
        value = T.Cast("float32", Qf[(bg * RT + r0 + r) * D + e0 + e]) * q_scale
        short = self.blocks * self.rows > RT
        tests = [*([e0 < D] if self.active < self.lanes else []), *([r0 + r < RT] if short else [])]
        return tirx.if_then_else(tirx.all(*tests), value, tirx.const(0.0, "float32")) if tests else value

    def holds(self, cond, e0):
        """``cond``, for a lane that holds values: lanes of a key past D load and hold zeros."""
        return tirx.all(cond, e0 < self.shape.head_dim) if self.active < self.lanes else cond

    def key_of(self, start, step, u, slot):
        return start + step * self.tile + u * self.slots + slot

    def page_entry(self, table, bg, key):
        """The table's entry for the page holding key ``key`` of K/V head ``bg``'s sequence."""
        G, page = self.shape.kv_heads, self.shape.page_size
        return T.Cast("int64", table[T.Cast("int64", bg // G) * self.width + T.Cast("int64", key // page)])

    def pool_key(self, entry, bg, key):
        """Where in the pool key ``key`` of K/V head ``bg`` is, its page's table entry given:
        slot ``key % page`` of that page."""
        G, page = self.shape.kv_heads, self.shape.page_size
        return (entry * G + bg % G) * page + T.Cast("int64", key % page)

    def ring_base(self, st, u, kv, tid):
        """Where thread ``tid``'s values of load ``u`` (K: ``kv`` 0, V: 1) of ring stage ``st`` start."""
        return ((T.Cast("int32", st) * self.loads + u) * 2 + kv) * self.groups * self.threads * VECTOR + tid * VECTOR


def key_loads(lay: ChunkLayout):
    """A lane's values of one key, 16 bytes a copy (``cp.async`` where staged): ``copy16``,
    ``zero16`` and ``load`` (a key's values from the cache or page pool, the appended token's,
    or zeros past the chunk)."""
    D, V8, dtype, v_stride = lay.shape.head_dim, lay.groups, lay.shape.dtype, lay.v_stride

    @T.macro
    def copy_registers(dst, at, src, src_at):
        for e in T.vectorized(VECTOR):
            dst[at + e] = src[src_at + e]

    @T.macro
    def copy_async(dst, at, src, src_at):  # .cg: cached in L2 only, as a stream should be
        T.ptx["cp.async.cg.shared.global"](dst.ptr_to([at]), src.ptr_to([src_at]), 16)

    copy16 = copy_async if lay.staged else copy_registers

    @T.macro
    def zero16(dst, at):
        for e in T.vectorized(VECTOR):
            dst[at + e] = T.Cast(dtype, T.float32(0))

    @T.macro
    def load_contiguous(dst, base, cache, new, table, bg, key, end, e0, n_cache):
        """Values ``e0 ..`` of key ``key`` of K/V head ``bg``: the cache's, the appended token's,
        or zeros past the chunk (another CTA's keys are not read twice)."""
        for v in T.unroll(V8):
            if lay.holds(key < T.min(end, T.Cast("int32", n_cache)), e0):
                copy16(dst, base + v * v_stride, cache,
                       (T.Cast("int64", bg) * n_cache + T.Cast("int64", key)) * D + e0 + v * VECTOR)
            elif lay.holds(key < end, e0):  # the appended token (never without one)
                copy16(dst, base + v * v_stride, new, bg * D + e0 + v * VECTOR)
            else:
                zero16(dst, base + v * v_stride)

    @T.macro
    def load_paged(dst, base, cache, new, table, bg, key, end, e0, n_cache):
        """The same from a page pool: key ``key`` is slot ``key % page`` of the sequence's page
        ``key // page`` (its table's entry)."""
        for v in T.unroll(V8):
            if lay.holds(key < end, e0):
                at = T.meta_var(lay.pool_key(lay.page_entry(table, bg, key), bg, key))
                copy16(dst, base + v * v_stride, cache, at * D + e0 + v * VECTOR)
            else:
                zero16(dst, base + v * v_stride)

    return copy16, zero16, (load_paged if lay.shape.page_size else load_contiguous)


def online_softmax(lay: ChunkLayout):
    """Each slot's online softmax, in the exp2 domain with the scale folded into Q: ``init_rows``
    (the lane's query values, scaled; an empty max, sum and output) and ``consume`` (a tile in a
    register set taken in)."""
    R, U, E = lay.rows, lay.loads, lay.per_lane
    reduce_steps = lay.lanes.bit_length() - 1

    @T.macro
    def init_rows(qr, mr, lr, acc, Qf, bg, r0, e0):
        for r in T.unroll(R):
            for e in T.unroll(E):
                qr[r * E + e] = lay.q_value(Qf, bg, r0, r, e0, e)
            mr[r] = T.float32(EMPTY_MAX)
            lr[r] = T.float32(0)
            for e in T.unroll(E):
                acc[r * E + e] = T.float32(0)

    @T.macro
    def consume(kr, vr, buf, step, qr, sc, mr, lr, acc, top, start, end, slot):
        """Tile ``step`` (in register set ``buf``) into the slot's online softmax."""
        for u in T.unroll(U):
            key = T.meta_var(lay.key_of(start, step, u, slot))
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

    return init_rows, consume


def chunk_stream(lay: ChunkLayout, consume):
    """The macro that streams a CTA's chunk into ``consume``, a tile at a time: through two
    register sets, their page entries read a tile ahead where paged, or through a ring of
    ``stages`` tiles in shared memory."""
    copy16, zero16, load = key_loads(lay)
    if lay.staged:
        return _staged_stream(lay, load, consume)
    if lay.shape.page_size:
        return _paged_stream(lay, copy16, zero16, consume)
    return _register_stream(lay, load, consume)


def _register_stream(lay: ChunkLayout, load, consume):
    """Two register sets, a tile's loads issued before the tile before it is used."""
    U, E, tile = lay.loads, lay.per_lane, lay.tile

    @T.macro
    def fetch(kr, vr, buf, step, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache):
        """Tile ``step``'s K and V values into register set ``buf`` (zeros past the chunk)."""
        for u in T.unroll(U):
            key = T.meta_var(lay.key_of(start, step, u, slot))
            load(kr, (buf * U + u) * E, Kf, Knf, Tf, bg, key, end, e0, n_cache)
            load(vr, (buf * U + u) * E, Vf, Vnf, Tf, bg, key, end, e0, n_cache)

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

    return stream_registers


def _paged_stream(lay: ChunkLayout, copy16, zero16, consume):
    """(Paged.) Two register sets, and two of page entries read a tile ahead of the loads."""
    U, E, V8, D, tile = lay.loads, lay.per_lane, lay.groups, lay.shape.head_dim, lay.tile

    @T.macro
    def fetch_pages(pg, buf, step, Tf, bg, start, end, slot):
        """The table entries of tile ``step``'s keys into page set ``buf``, read a tile ahead of the
        loads that use them: read with them, each tile's K and V loads waited for a table load
        first, two round trips a tile where a contiguous cache has one."""
        for u in T.unroll(U):
            key = T.meta_var(lay.key_of(start, step, u, slot))
            if key < end:
                pg[buf * U + u] = lay.page_entry(Tf, bg, key)
            else:
                pg[buf * U + u] = T.int64(0)

    @T.macro
    def fetch_paged(kr, vr, pg, buf, step, Kf, Vf, bg, start, end, slot, e0):
        """Tile ``step``'s K and V values into register set ``buf``, at the pages page set
        ``buf`` holds (zeros past the chunk)."""
        for u in T.unroll(U):
            key = T.meta_var(lay.key_of(start, step, u, slot))
            for v in T.unroll(V8):
                if lay.holds(key < end, e0):
                    at = T.meta_var(lay.pool_key(pg[buf * U + u], bg, key) * D + e0 + v * VECTOR)
                    copy16(kr, (buf * U + u) * E + v * VECTOR, Kf, at)
                    copy16(vr, (buf * U + u) * E + v * VECTOR, Vf, at)
                else:
                    zero16(kr, (buf * U + u) * E + v * VECTOR)
                    zero16(vr, (buf * U + u) * E + v * VECTOR)

    @T.macro
    def stream_pages_ahead(kr, vr, pg, ring, qr, sc, mr, lr, acc, top, Kf, Vf, Knf, Vnf, Tf, bg, start, end, chunk,
                           slot, e0, n_cache, tid):
        """As the register sets' stream, each tile's page entries read a tile earlier (page set
        t % 2 for tile t)."""
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

    return stream_pages_ahead


def _staged_stream(lay: ChunkLayout, load, consume):
    """A ring of ``stages`` tiles in shared memory, copied by ``cp.async``."""
    U, E, V8, tile, stages, v_stride = lay.loads, lay.per_lane, lay.groups, lay.tile, lay.stages, lay.v_stride

    @T.macro
    def fetch_staged(ring, st, step, Kf, Vf, Knf, Vnf, Tf, bg, start, end, slot, e0, n_cache, tid):
        """Tile ``step``'s K and V values copied asynchronously into ring stage ``st`` (each
        thread the values it will read: no barrier), one commit group a tile."""
        for u in T.unroll(U):
            key = T.meta_var(lay.key_of(start, step, u, slot))
            load(ring, lay.ring_base(st, u, 0, tid), Kf, Knf, Tf, bg, key, end, e0, n_cache)
            load(ring, lay.ring_base(st, u, 1, tid), Vf, Vnf, Tf, bg, key, end, e0, n_cache)
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def unstage(kr, vr, ring, st, tid):
        """Ring stage ``st`` into register set 0."""
        for u in T.unroll(U):
            for v in T.unroll(V8):
                for e in T.vectorized(VECTOR):
                    kr[u * E + v * VECTOR + e] = ring[lay.ring_base(st, u, 0, tid) + v * v_stride + e]
                for e in T.vectorized(VECTOR):
                    vr[u * E + v * VECTOR + e] = ring[lay.ring_base(st, u, 1, tid) + v * v_stride + e]

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

    return stream_staged


class StepBuffers(NamedTuple):
    """A chunk step function's buffers, in the order its kernel's body takes them."""

    q: object
    k: object
    v: object
    kn: object
    vn: object
    table: object
    lengths: object
    o: object
    m: object
    l: object
    tickets: object
    y: object


def step_buffers(func: tirx.PrimFunc, shape: DecodeAttentionShape) -> StepBuffers:
    """The chunk step function's parameters as its kernel's body takes them."""
    params = list(func.params)
    outputs = 4 if shape.merged else 3
    q, k, v, (o, m, l) = (*params[:3], params[len(params) - outputs:][:3])
    # (a buffer a form does not have: one of the others, its branch never taken)
    kn, vn = params[3:5] if shape.appended else (k, v)
    table, lengths = params[3:5] if shape.page_size else (q, q)
    tickets, y = (params[-5], params[-1]) if shape.merged else (q, q)
    return StepBuffers(q, k, v, kn, vn, table, lengths, o, m, l, tickets, y)


def chunk_smem(warps: int, rows: int, head_dim: int):
    """A chunk step CTA's shared memory pool, opening with what :func:`.decode_combine.write_chunk`
    reads: each warp's rows' max, sum and weighted values, and the slot of a merged step's ticket."""
    pool = T.SMEMPool()
    m_s = pool.alloc((warps * rows,), "float32", align=16)
    l_s = pool.alloc((warps * rows,), "float32", align=16)
    o_s = pool.alloc((warps * rows * head_dim,), "float32", align=16)
    last = pool.alloc((1,), "int32", align=16)
    return pool, m_s, l_s, o_s, last
