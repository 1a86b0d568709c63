"""Split-KV decode attention on tensor cores (``kind == "decode_attention_mma"``): the chunk step
of :mod:`fastdlight.schedules.decode_attention` with ``Q·Kᵀ`` and ``P·V`` on ``mma.sync``
m16n8k16, for the rows a K/V head serves (GQA's group, MQA's block of 8).

The CUDA-core step spreads a key over 16 lanes and repeats each row's products, shuffles and
exp2 in every lane: at four rows a key (LLaMA-3's group) it issues about 75 warp instructions a
key, as long as the key's bytes take at HBM's rate (H200, B1 H32/G8: 2.6 TB/s). Here a warp
takes 16 keys a step in about 150 instructions, whatever the rows (up to 8).

Each warp streams its own tiles of 16 keys (tile ``step * warps + warp`` of the chunk), loading
every value straight from global memory into the registers of the fragment that uses it, 16
bytes a load, all loads coalesced (the next tile's in a second register set while one is used):

- ``S = Q·Kᵀ`` (rows as M, of which 8 are used; keys as N). Lane ``(g, c)`` (``g = lane / 4``)
  loads keys ``g`` and ``g + 8`` of the tile, dims ``32 i + 8 c ..`` (``i < D / 32``); the
  fragments' K slots ``2c, 2c+1 | 2c+8, 2c+9`` of K-block ``kb`` are the pairs ``2 (kb % 2)`` and
  ``2 (kb % 2) + 1`` of its load ``kb / 2``, and Q's A fragment is the same dims of row ``g``
  (a sum over the head dim takes its terms in any order). The scores land as lane ``(g, c)``
  holding row ``g``'s keys ``2c, 2c+1, 2c+8, 2c+9``.
- ``Oᵀ = Vᵀ·Pᵀ`` (dims as M, keys as K, rows as N): those four keys' probabilities are exactly
  ``Pᵀ``'s B fragment of the lane, and the lane loads the four keys' values of dims
  ``64 h + 8 g ..``; two keys' values of a dim become an A pair with one byte permute. The
  accumulators hold rows ``2c, 2c+1`` of the lane's dims (32 registers at D = 128).
- The online softmax is row ``g``'s, in the exp2 domain, over the four lanes of a row (two
  shuffles for the max); each lane's sum is its own until the chunk ends; a row's rescale
  reaches the lanes holding its outputs by a shuffle.

Then the warps' partial results meet in shared memory and the chunk's ``o``, ``m``, ``l`` are
written, and merged, as the CUDA-core step's (:func:`.decode_combine.write_chunk`). Contiguous
caches (with or without the appended token), head dims 64 and 128, fp16 and bf16, sm_80+.
"""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.decode_attention import (
    EMPTY_MAX,
    VECTOR,
    DecodeAttentionShape,
    block_rows,
    match_decode_split,
    mma_step_fits,
    row_blocks,
)
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate
from fastdlight.schedules.decode_attention_parts import LOG2E, chunk_smem, step_buffers
from fastdlight.schedules.decode_combine import cta_place, write_chunk

#: keys a warp takes a step (the N of ``S``'s two m16n8 tiles, the K of ``P·V``)
KEYS = 16

_MMA = r"""
__forceinline__ __device__ void fdl_decode_mma_{ty}(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                    unsigned b0, unsigned b1) {{
  asm("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
      "{{%0,%1,%2,%3}};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}
"""

_TILE = r"""
__forceinline__ __device__ void fdl_decode_tile_{ty}_d{D}(const void* kp, const void* vp, const void* qp, float* acc,
                                                           float* ml, float scale, int left) {{
  // kp: keys g, g + 8, {NK} loads each; vp: keys 2c, 2c+1, 2c+8, 2c+9, {NV} loads each; qp: row g's
  // {NK} loads; ml: row g's running max (exp2 domain) and this lane's share of its sum
  const unsigned* k = reinterpret_cast<const unsigned*>(kp);
  const unsigned* v = reinterpret_cast<const unsigned*>(vp);
  const unsigned* q = reinterpret_cast<const unsigned*>(qp);
  const int c = threadIdx.x % 4;
  float s[4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {{
    float d[4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kb = 0; kb < {MT}; ++kb) {{
      const int w = (kb / 2) * 4 + 2 * (kb % 2);
      fdl_decode_mma_{ty}(d, q[w], 0u, q[w + 1], 0u, k[j * {NK} * 4 + w], k[j * {NK} * 4 + w + 1]);
    }}
    s[2 * j] = d[0];
    s[2 * j + 1] = d[1];
  }}
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < 4; ++e) {{
    s[e] = 2 * c + (e & 1) + 8 * (e >> 1) < left ? s[e] * scale : -INFINITY;
    mx = fmaxf(mx, s[e]);
  }}
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float top = fmaxf(ml[0], mx), alpha = exp2f(ml[0] - top);
  float p[4], sum = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {{
    p[e] = exp2f(s[e] - top);
    sum += p[e];
  }}
  ml[0] = top;
  ml[1] = ml[1] * alpha + sum;
  // the rescale of rows 2c and 2c + 1, whose outputs this lane holds (rows live in lanes 4 r ..)
  const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * c), a1 = __shfl_sync(0xffffffffu, alpha, 8 * c + 4);
  // P as two 16-bit parts, hi + lo: the partial results are fp32 and checked as such (P rounded
  // once is 2^-11 off a weight, about 5e-4 of a chunk's output over a few thousand keys)
  const {pair} h01 = {pack}(p[0], p[1]), h23 = {pack}(p[2], p[3]);
  const float2 f01 = {unpack}(h01), f23 = {unpack}(h23);
  const {pair} l01 = {pack}(p[0] - f01.x, p[1] - f01.y), l23 = {pack}(p[2] - f23.x, p[3] - f23.y);
  const unsigned b0 = *reinterpret_cast<const unsigned*>(&h01), b1 = *reinterpret_cast<const unsigned*>(&h23);
  const unsigned c0 = *reinterpret_cast<const unsigned*>(&l01), c1 = *reinterpret_cast<const unsigned*>(&l23);
#pragma unroll
  for (int mt = 0; mt < {MT}; ++mt) {{
    // dim rows g and g + 8 of tile mt: the lane's values mt and mt + {MT} (value i: load i / 8, half i % 8)
    const int i0 = mt, i1 = mt + {MT};
    const unsigned sel = (mt % 2) ? 0x7632u : 0x5410u;
#define FDL_W(x, i) v[((x) * {NV} + (i) / 8) * 4 + ((i) % 8) / 2]
    const unsigned x0 = __byte_perm(FDL_W(0, i0), FDL_W(1, i0), sel), x1 = __byte_perm(FDL_W(0, i1), FDL_W(1, i1), sel);
    const unsigned x2 = __byte_perm(FDL_W(2, i0), FDL_W(3, i0), sel), x3 = __byte_perm(FDL_W(2, i1), FDL_W(3, i1), sel);
#undef FDL_W
    acc[mt * 4] *= a0;
    acc[mt * 4 + 1] *= a1;
    acc[mt * 4 + 2] *= a0;
    acc[mt * 4 + 3] *= a1;
    fdl_decode_mma_{ty}(acc + mt * 4, x0, x1, x2, x3, b0, b1);
    fdl_decode_mma_{ty}(acc + mt * 4, x0, x1, x2, x3, c0, c1);
  }}
}}
"""

_TYPES = {"float16": ("f16", "half2", "__floats2half2_rn", "__half22float2"),
          "bfloat16": ("bf16", "__nv_bfloat162", "__floats2bfloat162_rn", "__bfloat1622float2")}


def _tile_call(shape: DecodeAttentionShape, k, v, q, acc, ml, scale, left):
    ty, pair, pack, unpack = _TYPES[shape.dtype]
    D = shape.head_dim
    fmt = {"ty": ty, "pair": pair, "pack": pack, "unpack": unpack, "D": D, "NK": D // 32, "NV": D // 64, "MT": D // 16}
    source = _MMA.format(**fmt) + _TILE.format(**fmt)
    return cuda_func_call(f"fdl_decode_tile_{ty}_d{D}", k, v, q, acc, ml, scale, left, source_code=source)


def build_kernel(func: tirx.PrimFunc, shape: DecodeAttentionShape, seq_kv, warps: int) -> tirx.PrimFunc:
    """The kernel for ``func`` (the chunk step of ``shape`` over ``seq_kv`` cached keys): CTAs
    of ``warps`` warps, each streaming its tiles of :data:`KEYS` keys."""
    body = _step_body(func, shape, seq_kv, warps)
    b = step_buffers(func, shape)

    @T.prim_func(check_well_formed=False)  # (its buffers are the function's parameters)
    def kernel():
        body(b.q, b.k, b.v, b.kn, b.vn, b.o, b.m, b.l, b.tickets, b.y)

    attrs = {"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True}
    return func.with_body(kernel.body).with_attrs(attrs)


def _tile_stream(shape: DecodeAttentionShape, warps: int):
    """The macro that streams a warp's tiles through ``S = Q·Kᵀ``, the online softmax and
    ``Oᵀ = Vᵀ·Pᵀ``, two register sets deep."""
    D, dtype = shape.head_dim, shape.dtype
    NK, NV = D // 32, D // 64
    scale = tirx.const(shape.scale * LOG2E, "float32")

    @T.macro
    def load16(dst, at, cache, new, bg, key, end, dim, n_cache):
        """Values ``dim ..`` of key ``key``: the cache's, the appended token's, or zeros past the chunk."""
        if key < T.min(end, T.Cast("int32", n_cache)):
            for e in T.vectorized(VECTOR):
                dst[at + e] = cache[(T.Cast("int64", bg) * n_cache + T.Cast("int64", key)) * D + dim + e]
        elif key < end:
            for e in T.vectorized(VECTOR):
                dst[at + e] = new[bg * D + dim + e]
        else:
            for e in T.vectorized(VECTOR):
                dst[at + e] = T.Cast(dtype, T.float32(0))

    def first_key(start, step, warp):
        return start + (step * warps + warp) * KEYS

    @T.macro
    def fetch(kr, vr, buf, step, Kf, Vf, Knf, Vnf, bg, start, end, warp, g, c, n_cache):
        """Tile ``step`` of the warp: K of keys g, g + 8 and V of keys 2c, 2c+1, 2c+8, 2c+9 into set ``buf``."""
        t0 = T.meta_var(first_key(start, step, warp))
        for j in T.unroll(2):
            for i in T.unroll(NK):
                load16(kr, ((buf * 2 + j) * NK + i) * VECTOR, Kf, Knf, bg, t0 + g + 8 * j, end, 32 * i + 8 * c,
                       n_cache)
        for x in T.unroll(4):
            for h in T.unroll(NV):
                load16(vr, ((buf * 4 + x) * NV + h) * VECTOR, Vf, Vnf, bg, t0 + 2 * c + x % 2 + 8 * (x // 2), end,
                       64 * h + 8 * g, n_cache)

    @T.macro
    def consume(kr, vr, buf, step, qr, acc, ml, start, end, warp):
        t0 = T.meta_var(first_key(start, step, warp))
        if t0 < end:
            T.evaluate(_tile_call(shape, T.address_of(kr[buf * 2 * NK * VECTOR]),
                                  T.address_of(vr[buf * 4 * NV * VECTOR]), T.address_of(qr[0]),
                                  T.address_of(acc[0]), T.address_of(ml[0]), scale, end - t0))

    @T.macro
    def stream(kr, vr, qr, acc, ml, Kf, Vf, Knf, Vnf, bg, start, end, chunk, warp, g, c, n_cache):
        """The warp's tiles of the chunk, the next one's loads issued before one is used."""
        steps = T.meta_var((chunk + KEYS * warps - 1) // (KEYS * warps))
        fetch(kr, vr, 0, 0, Kf, Vf, Knf, Vnf, bg, start, end, warp, g, c, n_cache)
        for pair in T.serial((steps + 1) // 2):
            fetch(kr, vr, 1, pair * 2 + 1, Kf, Vf, Knf, Vnf, bg, start, end, warp, g, c, n_cache)
            consume(kr, vr, 0, pair * 2, qr, acc, ml, start, end, warp)
            fetch(kr, vr, 0, pair * 2 + 2, Kf, Vf, Knf, Vnf, bg, start, end, warp, g, c, n_cache)
            consume(kr, vr, 1, pair * 2 + 1, qr, acc, ml, start, end, warp)

    return stream


def _row_macros(shape: DecodeAttentionShape):
    """A warp's rows: ``init_rows`` (row g's query values, the A fragment of ``S``; an empty max,
    sum and output) and ``leave`` (each row's sum over its lanes, and the warp's rows' max, sum
    and values left in shared memory)."""
    RT, D, dtype = shape.rows, shape.head_dim, shape.dtype
    R, NK, MT = block_rows(RT), D // 32, D // 16

    @T.macro
    def init_rows(qr, acc, ml, Qf, bg, r0, g, c):
        for i in T.unroll(NK):
            for e in T.vectorized(VECTOR):
                # row g's dims 32 i + 8 c .. (zeros for the rows the block does not have)
                qr[i * VECTOR + e] = T.if_then_else(
                    tirx.all(g < R, r0 + g < RT), Qf[(bg * RT + T.min(r0 + g, RT - 1)) * D + 32 * i + 8 * c + e],
                    T.Cast(dtype, T.float32(0)))
        for a in T.unroll(MT * 4):
            acc[a] = T.float32(0)
        ml[0] = T.float32(EMPTY_MAX)
        ml[1] = T.float32(0)

    @T.macro
    def leave(ml, acc, m_s, l_s, o_s, warp, g, c):
        # row g's sum over its four lanes; each warp leaves its rows' partial results
        for o in T.unroll(2):
            ml[1] = ml[1] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), ml[1], 1 << o, 32, 32)
        if c == 0 and g < R:
            m_s[warp * R + g] = ml[0]
            l_s[warp * R + g] = ml[1]
        for mt in T.unroll(MT):
            for hh in T.unroll(2):
                for e in T.unroll(2):
                    i = T.meta_var(mt + hh * MT)  # the lane's value i: dim 64 (i / 8) + 8 g + i % 8
                    if 2 * c + e < R:
                        o_s[(warp * R + 2 * c + e) * D + 64 * (i // 8) + 8 * g + i % 8] = acc[mt * 4 + hh * 2 + e]

    return init_rows, leave


def _step_body(func: tirx.PrimFunc, shape: DecodeAttentionShape, seq_kv, warps: int):
    """The kernel's body: each warp streams its tiles two register sets deep, then the warps'
    partial results are merged and written."""
    B, G, RT, D, S = shape.batch, shape.kv_heads, shape.rows, shape.head_dim, shape.splits
    blocks, R = row_blocks(RT), block_rows(RT)
    threads, appended, dtype = warps * 32, shape.appended, shape.dtype
    NK, NV, MT = D // 32, D // 64, D // 16
    elems = functools.reduce(lambda a, b: a * b, func.params[1].shape)
    n_cache = tirx.const(seq_kv, "int64") if isinstance(seq_kv, int) else tirx.Cast("int64", seq_kv)
    stream, (init_rows, leave) = _tile_stream(shape, warps), _row_macros(shape)
    write = write_chunk(shape, warps, threads)

    @T.macro
    def body(Q, Kc, Vc, Kn, Vn, O, M, L, Tickets, Y):
        T.device_entry()
        # one CTA a multiprocessor is enough to ask for: ptxas would otherwise cap a one-warp
        # CTA at 128 registers and spill the two register sets' fragments
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bid = T.cta_id([B * G * S * blocks])
        tid = T.thread_id([threads])
        pool, m_s, l_s, o_s, last = chunk_smem(warps, R, D)
        pool.commit()
        Kf = T.decl_buffer((elems,), dtype, data=Kc.data)
        Vf = T.decl_buffer((elems,), dtype, data=Vc.data)
        Qf = T.decl_buffer((B * G * RT * D,), dtype, data=Q.data)
        Knf = T.decl_buffer((B * G * D,), dtype, data=Kn.data)
        Vnf = T.decl_buffer((B * G * D,), dtype, data=Vn.data)
        qr = T.alloc_buffer((NK * VECTOR,), dtype, scope="local")
        kr = T.alloc_buffer((2 * 2 * NK * VECTOR,), dtype, scope="local")
        vr = T.alloc_buffer((2 * 4 * NV * VECTOR,), dtype, scope="local")
        acc = T.alloc_buffer((MT * 4,), "float32", scope="local")
        ml = T.alloc_buffer((2,), "float32", scope="local")
        merged = T.alloc_buffer((3,), "float32", scope="local")
        st = T.alloc_buffer((4,), "float32", scope="local")
        nk = T.alloc_buffer((1,), "int64", scope="local")
        part, bg, r0, out0 = T.meta_var(cta_place(shape, bid))
        nk[0] = n_cache
        lane = T.meta_var(tid % 32)
        warp = T.meta_var(tid // 32)
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)
        count = T.meta_var(nk[0] + T.int64(1) if appended else nk[0])
        chunk = T.meta_var(T.Cast("int32", (count + T.int64(S - 1)) // T.int64(S)))
        start = T.meta_var(part * chunk)
        end = T.meta_var(T.min(start + chunk, T.Cast("int32", count)))
        init_rows(qr, acc, ml, Qf, bg, r0, g, c)
        stream(kr, vr, qr, acc, ml, Kf, Vf, Knf, Vnf, bg, start, end, chunk, warp, g, c, nk[0])
        leave(ml, acc, m_s, l_s, o_s, warp, g, c)
        write(m_s, l_s, o_s, O, M, L, Tickets, Y, bg, r0, out0, tid, merged, last, st)

    return body


class DecodeAttentionMmaTemplate(ScheduleTemplate):
    """The chunk step on ``mma.sync`` (``decode_attention_mma``)."""

    kinds = ("decode_attention_mma",)
    name = "decode_attention_mma"

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        if config.kind != "decode_attention_mma":
            return None
        found = match_decode_split(func)
        if found is None:
            return None
        shape, seq_kv = found
        if config.block != (KEYS,) or not mma_step_fits(shape, config.warp[0]):
            return None
        return build_kernel(func, shape, seq_kv, config.warp[0])
