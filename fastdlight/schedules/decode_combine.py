"""The merge of split-KV decode attention (``kind == "decode_combine"``): the chunk step's
(``o``, ``m``, ``l``) of every chunk (:mod:`fastdlight.schedules.decode_attention`) folded into
each output row, as a TIRx kernel of its own. The chunks' partial results are few and L2
resident: the kernel is latency-bound, so every round's loads are issued before the first is
used."""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from fastdlight.analysis.decode_attention import EMPTY_MAX, DecodeAttentionShape


def build_combine(func: tirx.PrimFunc, shape: DecodeAttentionShape, warps: int) -> tirx.PrimFunc:
    """The TIRx kernel that merges the chunks (a :func:`decode_combine_func` of ``shape``): a
    CTA per output row; each warp folds every ``warps``-th chunk into a running max, sum and
    weighted row (lanes over the head dim, ``D / 32`` values each), then the warps' results
    meet in shared memory. Same parameters, same result."""
    B, G, R, D, S = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.splits
    V, threads, dtype = D // 32, warps * 32, shape.dtype
    rounds = -(-S // warps)
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
        bg = T.meta_var(row // R)
        r = T.meta_var(row % R)
        st[0] = T.float32(EMPTY_MAX)
        st[1] = T.float32(0)
        for v in T.unroll(V):
            acc[v] = T.float32(0)
        for i in T.unroll(rounds):  # unrolled: every round's loads issued before the first is used
            chunk = T.meta_var(i * warps + warp)
            if chunk < S:
                at = T.meta_var((bg * S + chunk) * R + r)
                for v in T.vectorized(V):
                    ov[v] = Of[at * D + lane * V + v]
                top = T.meta_var(T.max(st[0], Mf[at]))
                st[2] = T.exp(st[0] - top)
                st[3] = T.exp(Mf[at] - top)
                st[1] = st[1] * st[2] + Lf[at] * st[3]
                for v in T.unroll(V):
                    acc[v] = acc[v] * st[2] + ov[v] * st[3]
                st[0] = top
        if lane == 0:
            m_s[warp] = st[0]
            l_s[warp] = st[1]
        for v in T.unroll(V):
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

    @T.prim_func(check_well_formed=False)  # (its buffers are the function's parameters)
    def kernel():
        body(o_in, m_in, l_in, out)

    return func.with_body(kernel.body).with_attrs({"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True})
