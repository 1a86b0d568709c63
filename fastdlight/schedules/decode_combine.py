"""The merge of split-KV decode attention (``kind == "decode_combine"``): the chunk step's
(``o``, ``m``, ``l``) of every chunk (:mod:`fastdlight.schedules.decode_attention`) folded into
each output row, as a TIRx kernel of its own. The chunks' partial results are few and L2
resident: the kernel is latency-bound, so every round's loads are issued before the first is
used. Also the merged step's ending (:func:`merge_tails`): the same merge by the last CTA of
each (batch, K/V head), or, with one chunk, each CTA's output written as it is."""

from __future__ import annotations

import math

from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.decode_attention import EMPTY_MAX, DecodeAttentionShape, block_rows, row_blocks
from fastdlight.schedules.dependency import release_dependents

_TICKET = r"""
__forceinline__ __device__ int fdl_take_ticket(int* counter) {
  // the counter's value before this add: the writes before it released, those of every CTA
  // that added before acquired
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}
"""


def _take_ticket(counter):
    return cuda_func_call("fdl_take_ticket", counter, source_code=_TICKET, return_type="int32")


#: most chunks a merging thread of a merged step loads at once (more come in batches)
MERGE_BATCH = 24


def build_combine(func: tirx.PrimFunc, shape: DecodeAttentionShape, warps: int) -> tirx.PrimFunc:
    """The TIRx kernel that merges the chunks (a :func:`decode_combine_func` of ``shape``): a
    CTA per output row; each warp folds every ``warps``-th chunk into a running max, sum and
    weighted row (lanes over the head dim, ``ceil(D / 32)`` values each: past D a lane holds
    none), then the warps' results meet in shared memory. Same parameters, same result."""
    B, G, R, D, S = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.splits
    V, threads, dtype = -(-D // 32), warps * 32, shape.dtype
    fold, merge = _fold_chunks(shape, warps), _merge_warps(shape, warps)
    o_in, m_in, l_in, out = func.params

    @T.macro
    def body(O, M, L, Y):
        T.device_entry()
        row = T.cta_id([B * G * R])
        tid = T.thread_id([threads])
        pool = T.SMEMPool()
        m_s = pool.alloc((warps,), "float32", align=16)
        l_s = pool.alloc((warps,), "float32", align=16)
        o_s = pool.alloc((warps * D,), "float32", align=16)
        pool.commit()
        Of = T.decl_buffer((B * G * S * R * D,), "float32", data=O.data)
        Mf = T.decl_buffer((B * G * S * R,), "float32", data=M.data)
        Lf = T.decl_buffer((B * G * S * R,), "float32", data=L.data)
        Yf = T.decl_buffer((B * G * R * D,), dtype, data=Y.data)
        st = T.alloc_buffer((4,), "float32", scope="local")  # max, sum, the chunk's weights
        acc = T.alloc_buffer((V,), "float32", scope="local")
        ov = T.alloc_buffer((V,), "float32", scope="local")
        warp = T.meta_var(tid // 32)
        lane = T.meta_var(tid % 32)
        fold(Of, Mf, Lf, st, acc, ov, row // R, row % R, warp, lane)
        merge(m_s, l_s, o_s, Yf, st, acc, row, warp, lane, tid)

    @T.prim_func(check_well_formed=False)  # (its buffers are the function's parameters)
    def kernel():
        body(o_in, m_in, l_in, out)

    attrs = {"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True}
    return func.with_body(kernel.body).with_attrs(attrs)


def _fold_chunks(shape: DecodeAttentionShape, warps: int):
    """The merge kernel's macro folding a warp's chunks of row ``r`` of K/V head ``bg`` into its
    running max, sum and weighted row (``st``, ``acc``)."""
    R, D, S = shape.rows, shape.head_dim, shape.splits
    V = -(-D // 32)
    whole = V * 32 == D  # every lane's values inside the row (else the last lanes' are guarded)
    rounds = -(-S // warps)

    @T.macro
    def fold(Of, Mf, Lf, st, acc, ov, bg, r, warp, lane):
        st[0] = T.float32(EMPTY_MAX)
        st[1] = T.float32(0)
        for v in T.unroll(V):
            acc[v] = T.float32(0)
        for i in T.unroll(rounds):  # unrolled: every round's loads issued before the first is used
            chunk = T.meta_var(i * warps + warp)
            if chunk < S:
                at = T.meta_var((bg * S + chunk) * R + r)
                if whole:
                    for v in T.vectorized(V):
                        ov[v] = Of[at * D + lane * V + v]
                else:
                    for v in T.unroll(V):
                        ov[v] = T.if_then_else(lane * V + v < D, Of[at * D + lane * V + v], T.float32(0))
                top = T.meta_var(T.max(st[0], Mf[at]))
                st[2] = T.exp(st[0] - top)
                st[3] = T.exp(Mf[at] - top)
                st[1] = st[1] * st[2] + Lf[at] * st[3]
                for v in T.unroll(V):
                    acc[v] = acc[v] * st[2] + ov[v] * st[3]
                st[0] = top

    return fold


def _merge_warps(shape: DecodeAttentionShape, warps: int):
    """The merge kernel's macro that meets the warps' results in shared memory and writes the row."""
    D, dtype = shape.head_dim, shape.dtype
    V, threads = -(-D // 32), warps * 32
    whole = V * 32 == D

    @T.macro
    def merge(m_s, l_s, o_s, Yf, st, acc, row, warp, lane, tid):
        if lane == 0:
            m_s[warp] = st[0]
            l_s[warp] = st[1]
        for v in T.unroll(V):
            if whole:
                o_s[warp * D + lane * V + v] = acc[v]
            elif lane * V + v < D:
                o_s[warp * D + lane * V + v] = acc[v]
        T.cuda.cta_sync()
        for it in T.serial(-(-D // threads)):
            e = T.meta_var(it * threads + tid)
            if e < D:
                st[0] = m_s[0]
                for w in T.serial(1, warps):
                    st[0] = T.max(st[0], m_s[w])
                st[1] = T.float32(0)
                st[2] = T.float32(0)
                for w in T.serial(warps):
                    st[1] = st[1] + T.exp(m_s[w] - st[0]) * l_s[w]
                    st[2] = st[2] + T.exp(m_s[w] - st[0]) * o_s[w * D + e]
                Yf[row * D + e] = T.Cast(dtype, st[2] / st[1])

    return merge


def merge_tails(shape: DecodeAttentionShape, threads: int):
    """The chunk step's ending for a merged ``shape`` (a CTA of ``threads`` threads), as two
    macros: ``tail`` after the CTA's chunk is written (the last CTA of each (batch, K/V head)
    merges its chunks: :func:`_merge_last`; a no-op for an unmerged shape or one chunk) and
    ``finish`` on each output element (one chunk: the element, final)."""
    S = shape.splits
    tail = _merge_last(shape, threads) if shape.merged and S > 1 else _no_merge
    finish = _write_out(shape) if shape.merged and S == 1 else _no_write
    return tail, finish


def _merge_last(shape: DecodeAttentionShape, threads: int):
    """(A merged shape.) Once the CTA's writes are done, one thread releases them and takes a
    ticket for the (batch, K/V head); the CTA that takes the last merges every chunk of it and
    leaves the counter at zero. Each of its threads folds output elements by itself: a
    batch of chunks' maxima, sums and values loaded at once, then weighted, so that the
    merge after the ticket is one L2 round trip a batch (staging the maxima and sums in
    shared memory first, then loading the values, took a fence and two)."""
    B, G, R, D, S, dtype = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.splits, shape.dtype
    # the chunks a merging thread folds per batch: each chunk's max, sum and value in flight
    # together (three registers a chunk), so a batch waits out one L2 round trip
    batches = -(-S // MERGE_BATCH)
    per_batch = -(-S // batches)
    tickets = S * row_blocks(R)  # (every row block of every chunk takes one)
    fold = _fold_batches(shape, batches, per_batch)

    @T.macro
    def merge_last(Of, Mf, Lf, Tickets, Y, bg, tid, last, st):
        Tf = T.decl_buffer((B * G,), "int32", data=Tickets.data)
        Yf = T.decl_buffer((B * G * R * D,), dtype, data=Y.data)
        mx = T.alloc_buffer((per_batch,), "float32", scope="local")
        sm = T.alloc_buffer((per_batch,), "float32", scope="local")
        ov = T.alloc_buffer((per_batch,), "float32", scope="local")
        T.cuda.cta_sync()  # the CTA's writes of its chunk precede the release below
        if tid == 0:
            # released and acquired in one atomic (cumulative: the barrier ordered the other
            # threads' writes before it)
            last[0] = _take_ticket(T.address_of(Tf[bg]))
        T.cuda.cta_sync()
        if last[0] == tickets - 1:
            # the others have left: the next kernel may take their slots while this one merges
            with release_dependents():
                T.evaluate(0)
            for it in T.serial((R * D + threads - 1) // threads):
                idx = T.meta_var(it * threads + tid)
                if idx < R * D:
                    st[0] = T.min_value("float32")  # running max, sum, weighted sum
                    st[1] = T.float32(0)
                    st[2] = T.float32(0)
                    fold(Of, Mf, Lf, mx, sm, ov, st, bg, idx)
                    Yf[bg * R * D + idx] = T.Cast(dtype, st[2] / st[1])
            if tid == 0:
                Tf[bg] = 0

    return merge_last


def _fold_batches(shape: DecodeAttentionShape, batches: int, per_batch: int):
    """The macro that folds every chunk's output element ``idx`` of K/V head ``bg`` into the
    running max, sum and weighted sum ``st``, ``per_batch`` chunks loaded at once."""
    R, D, S = shape.rows, shape.head_dim, shape.splits

    @T.macro
    def fold(Of, Mf, Lf, mx, sm, ov, st, bg, idx):
        for b in T.unroll(batches):
            for p in T.unroll(per_batch):
                if b * per_batch + p < S:
                    at = T.meta_var((bg * S + b * per_batch + p) * R + idx // D)
                    mx[p] = Mf[at]
                    sm[p] = Lf[at]
                    ov[p] = Of[(bg * S + b * per_batch + p) * R * D + idx]
            st[3] = st[0]
            for p in T.unroll(per_batch):
                if b * per_batch + p < S:
                    st[3] = T.max(st[3], mx[p])
            st[0] = T.exp(st[0] - st[3])  # (the batches before: rescaled)
            st[1] = st[1] * st[0]
            st[2] = st[2] * st[0]
            for p in T.unroll(per_batch):
                if b * per_batch + p < S:
                    mx[p] = T.exp(mx[p] - st[3])
                    st[1] = st[1] + mx[p] * sm[p]
                    st[2] = st[2] + mx[p] * ov[p]
            st[0] = st[3]

    return fold


@T.macro
def _no_merge(Of, Mf, Lf, Tickets, Y, bg, tid, last, st):
    T.evaluate(0)


def _write_out(shape: DecodeAttentionShape):
    """(A merged shape of one chunk.) The macro writing element ``idx`` of the CTA's rows (from
    output row ``row0``), final: its chunk holds every key, so there is nothing to wait for or merge."""
    B, G, R, D, dtype = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.dtype

    @T.macro
    def write_out(Y, row0, idx, merged):
        Yf = T.decl_buffer((B * G * R * D,), dtype, data=Y.data)
        Yf[row0 * D + idx] = T.Cast(dtype, merged[1] / merged[2])

    return write_out


@T.macro
def _no_write(Y, row0, idx, merged):
    T.evaluate(0)


def cta_place(shape: DecodeAttentionShape, bid):
    """Where CTA ``bid`` of a chunk step is: its chunk, its (batch, K/V head), its first row, and
    where its rows' partial results (one chunk: its outputs) start."""
    S, blocks, R = shape.splits, row_blocks(shape.rows), block_rows(shape.rows)
    if blocks == 1:
        return bid % S, bid // S, 0, bid * R
    bg, part = bid // (blocks * S), bid // blocks % S
    return part, bg, bid % blocks * R, (bg * S + part) * shape.rows + bid % blocks * R


def write_chunk(shape: DecodeAttentionShape, warps: int, threads: int):
    """The chunk step's ending, after each warp left its rows' max, sum and weighted values
    (``m_s``, ``l_s``: ``[warps, R]``; ``o_s``: ``[warps, R, D]``, max in the exp2 domain) in
    shared memory: the warps merged, the chunk's ``o``, ``m`` and ``l`` written (or, one chunk of
    a merged shape, the output), then the merge of the chunks (:func:`merge_tails`)."""
    RT, D, S = shape.rows, shape.head_dim, shape.splits
    blocks, R = row_blocks(RT), block_rows(RT)
    short = blocks * R > RT
    tail, finish = merge_tails(shape, threads)

    def in_rows(idx, r0):
        """Whether element ``idx`` of the CTA's rows' outputs is one of the rows (a short last block)."""
        return tirx.all(idx < R * D, r0 + idx // D < RT) if short else idx < R * D

    @T.macro
    def write(m_s, l_s, o_s, O, M, L, Tickets, Y, bg, r0, out0, tid, merged, last, st):
        T.cuda.cta_sync()
        Of = T.decl_buffer((shape.batch * shape.kv_heads * S * RT * D,), "float32", data=O.data)
        Mf = T.decl_buffer((shape.batch * shape.kv_heads * S * RT,), "float32", data=M.data)
        Lf = T.decl_buffer((shape.batch * shape.kv_heads * S * RT,), "float32", data=L.data)
        for it in T.serial((R * D + threads - 1) // threads):
            idx = T.meta_var(it * threads + tid)
            if in_rows(idx, r0):
                r = T.meta_var(idx // D)
                merged[0] = m_s[r]
                for w in T.serial(1, warps):
                    merged[0] = T.max(merged[0], m_s[w * R + r])
                merged[1] = T.float32(0)
                merged[2] = T.float32(0)
                for w in T.serial(warps):
                    merged[1] = merged[1] + T.exp2(m_s[w * R + r] - merged[0]) * o_s[w * R * D + idx]
                    merged[2] = merged[2] + T.exp2(m_s[w * R + r] - merged[0]) * l_s[w * R + r]
                Of[out0 * D + idx] = merged[1]
                if idx % D == 0:
                    # m in natural units; a chunk without keys keeps the floor
                    Mf[out0 + r] = T.if_then_else(merged[2] > T.float32(0), merged[0] * T.float32(math.log(2.0)),
                                                  T.float32(EMPTY_MAX))
                    Lf[out0 + r] = merged[2]
                finish(Y, out0, idx, merged)
        tail(Of, Mf, Lf, Tickets, Y, bg, tid, last, st)

    return write
