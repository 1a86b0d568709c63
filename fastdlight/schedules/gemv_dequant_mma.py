"""Dequantizing GEMV on tensor cores (``kind == "gemv_dequant_mma"``): the decode rows (M <= 8)
of a symmetric 4-bit :func:`~fastdlight.analysis.weight_only.weight_only_func` with fp16
activations and groups of a multiple of 128, the products on ``mma.sync`` instead of ``hfma2``.

The CUDA-core template (:mod:`.gemv_dequant`) spends 13 instructions on 8 weights: 4 ``lop3``
and a shift make them fp16 pairs ``1024 + q`` (nibbles 0, 2, 4, 6) and ``1024 + 16 q`` (1, 3, 5,
7), 4 ``hfma2`` turn the pairs into ``(q - 8) / 8`` and 4 more multiply them by the activations.
On an H200 that kernel issues an instruction on 45% of its scheduler cycles (Nsight Compute) and
reads its bytes at 74-83% of what a bare read of them takes (``bench_read_floor``): it is
issue-bound. Here the raw pairs go to ``mma.m16n8k16`` as the A operand (16 weight rows of a warp's
tile, 16 of K), the activations as B (a column each of the M rows, the other columns zero), with
fp32 accumulation: 5 instructions and 2 ``mma`` for 8 weights. The pairs' offsets are taken out
once a 128-wide step of K: with the activations of the high nibbles staged divided by 16 (exact in
fp16), the step's accumulator holds ``sum x q + 1024 L + 64 H`` (L, H: the step's sums of the
activations at the low and high nibbles, staged with them), and ``sum x (q - 8)`` is that less
``1032 L + 72 H``; times the group scale, it is added to the result (fp32: the products of fp16
values are exact, and the offsets' ~1000x the signal costs about 1e-5 of it).

Fragments. A lane ``(g, t) = (lane / 4, lane % 4)`` loads 16 bytes (4 packed words, 32 weights) of
rows ``g`` and ``g + 8`` of its warp's tile at K offset ``128 s + 32 t`` each step ``s``; word ``i``
gives the A fragments of two ``mma``: ``(a0, a1, a2, a3)`` = the low pair (nibbles 0, 4) of both
rows, then the high pair (1, 5), and then nibbles (2, 6) and (3, 7). The mma's K slots
``2t, 2t + 1`` (and ``2t + 8, 2t + 9``) thus stand for the same 32 activations of chunk ``t`` in
every row, and B's, held by lane ``(m, t)`` for column ``m``, are those of row ``m`` of X, staged
in exactly that order: for each packed word ``(x0, x4), (x1, x5) / 16, (x2, x6), (x3, x7) / 16``.
The accumulator's ``(c0, c1, c2, c3)`` are rows ``g``, ``g + 8`` by columns ``2t, 2t + 1``: each
lane folds and stores its own outputs, no shuffles. The warps of a CTA split K and meet in shared
memory; the CTA's group scales are staged there with X.

Measured (H200, 2026-12-01, fixed configs, verified): 0.0083 ms at best for 1x11008x4096 and
0.0101 for 1x4096x11008, against 0.0081 and 0.0089 for the CUDA-core template's best; so the
policy offers it as a variant (:func:`~fastdlight.policies.gemv_dequant.dequant_gemv_mma_configs`),
which the tuner does not ask for.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.weight_only import (MMA_MAX_ROWS, MMA_MAX_SMEM, MMA_STEP_K, WeightOnlyShape, mma_gemv_fits,
                                             mma_gemv_smem)
from fastdlight.schedules.gemv_dequant import WeightOnlyGemvTemplate, weight_only_kernel
from fastdlight.schedules.gemv_dequant_device import AND_OR

_STEP = AND_OR + r"""
__forceinline__ __device__ void fdl_mma16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__forceinline__ __device__ void fdl_w4_mma_step(const uint4* q, const uint4* x, int has_x, float* c) {
  // q[0], q[1]: the lane's 4 packed words of rows g and g + 8; x: its 4 staged words of X
  const unsigned r0[4] = {q[0].x, q[0].y, q[0].z, q[0].w}, r1[4] = {q[1].x, q[1].y, q[1].z, q[1].w};
  const unsigned m = 0x64006400u;  // 1024 in both halves: a nibble OR-ed in gives 1024 + q
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 b = has_x ? x[i] : make_uint4(0u, 0u, 0u, 0u);
    const unsigned h0 = r0[i] >> 8, h1 = r1[i] >> 8;
    fdl_mma16816(c, fdl_and_or(r0[i], 0x000F000Fu, m), fdl_and_or(r1[i], 0x000F000Fu, m),
                 fdl_and_or(r0[i], 0x00F000F0u, m), fdl_and_or(r1[i], 0x00F000F0u, m), b.x, b.y);
    fdl_mma16816(c, fdl_and_or(h0, 0x000F000Fu, m), fdl_and_or(h1, 0x000F000Fu, m),
                 fdl_and_or(h0, 0x00F000F0u, m), fdl_and_or(h1, 0x00F000F0u, m), b.z, b.w);
  }
}
"""

_STAGE = r"""
__forceinline__ __device__ void fdl_w4_mma_stage(const uint4* src, uint4* dst, float* sums) {
  // eight activations as the pairs (x0, x4), (x1, x5) / 16, (x2, x6), (x3, x7) / 16; sums: those
  // at the low nibbles (even) and at the high ones (odd)
  const uint4 v = *src;
  const half2 sixteenth = __half2half2(__ushort_as_half((unsigned short)0x2C00));
  const half2 p0 = __halves2half2(__low2half(*reinterpret_cast<const half2*>(&v.x)),
                                  __low2half(*reinterpret_cast<const half2*>(&v.z)));
  const half2 p1 = __halves2half2(__high2half(*reinterpret_cast<const half2*>(&v.x)),
                                  __high2half(*reinterpret_cast<const half2*>(&v.z)));
  const half2 p2 = __halves2half2(__low2half(*reinterpret_cast<const half2*>(&v.y)),
                                  __low2half(*reinterpret_cast<const half2*>(&v.w)));
  const half2 p3 = __halves2half2(__high2half(*reinterpret_cast<const half2*>(&v.y)),
                                  __high2half(*reinterpret_cast<const half2*>(&v.w)));
  const half2 s1 = __hmul2(p1, sixteenth), s3 = __hmul2(p3, sixteenth);
  *dst = make_uint4(*reinterpret_cast<const unsigned*>(&p0), *reinterpret_cast<const unsigned*>(&s1),
                    *reinterpret_cast<const unsigned*>(&p2), *reinterpret_cast<const unsigned*>(&s3));
  const float2 f0 = __half22float2(p0), f1 = __half22float2(p1), f2 = __half22float2(p2), f3 = __half22float2(p3);
  sums[0] = f0.x + f0.y + f2.x + f2.y;
  sums[1] = f1.x + f1.y + f3.x + f3.y;
}
"""


def _step(q, x, has_x, c):
    return cuda_func_call("fdl_w4_mma_step", q, x, has_x, c, source_code=_STEP)


def _stage(src, dst, sums):
    return cuda_func_call("fdl_w4_mma_stage", src, dst, sums, source_code=_STAGE)


@dataclass(frozen=True)
class MmaLayout:
    """What a kernel's shape and tiling fix when it is built (Python values): its loops' and
    buffers' sizes, and the steps of K each warp takes."""

    shape: WeightOnlyShape
    tiles: int  # 16-row tiles of a CTA
    warps: int  # warps of a CTA, each a run of steps of K
    M: int
    N: int
    K: int
    NS: int  # 128-wide steps of K
    G: int  # weights a group (one scale)
    NG: int  # groups along K
    rows: int
    threads: int
    ctas: int
    words: int  # packed words (and staged X words) of a row
    items: int  # staged X words
    stage_turns: int  # of those, the most a thread stages
    per_warp: int  # steps of K a warp takes (the last fewer)
    U: int  # steps whose weights are loaded together: a round
    rounds: int
    s_elems: int  # the CTA's group scales
    s_turns: int  # of those, the most a thread stages
    partials: int  # a warp's sums: the CTA's rows by the mma's columns
    out_turns: int  # of the CTA's outputs, the most a thread adds up and stores

    @classmethod
    def of(cls, shape: WeightOnlyShape, tiles: int, warps: int, prefetch: int) -> MmaLayout:
        K, G = shape.k, shape.group_size
        NS, NG = K // MMA_STEP_K, K // G
        rows, threads = 16 * tiles, 32 * warps
        items = shape.m * (K // 8)
        per_warp = -(-NS // warps)
        U = max(1, min(prefetch, per_warp))
        return cls(shape=shape, M=shape.m, N=shape.n, K=K, G=G, NS=NS, NG=NG, tiles=tiles, warps=warps, rows=rows,
                   threads=threads, ctas=-(-shape.n // rows), words=K // 8, items=items,
                   stage_turns=-(-items // threads), per_warp=per_warp, U=U, rounds=-(-per_warp // U),
                   s_elems=rows * NG, s_turns=-(-(rows * NG) // threads), partials=rows * MMA_MAX_ROWS,
                   out_turns=-(-(rows * shape.m) // threads))

    def step_of(self, w, rd, u):
        """Warp ``w``'s ``u``-th step of round ``rd``."""
        return w * self.per_warp + rd * self.U + u

    def in_range(self, w, rd, u):
        """Whether warp ``w`` has a ``u``-th step in round ``rd`` (one of its run, and of K)."""
        return tirx.all(rd * self.U + u < self.per_warp, self.step_of(w, rd, u) < self.NS)


def _staging_macros(L: MmaLayout):
    """``load_round``: the weights of a round's steps into registers; ``stage``: the CTA's group
    scales, and X with each step's sums of the activations at the low and the high nibbles, into
    shared memory, then the CTA's barrier."""
    N, K, NG, tiles, threads = L.N, L.K, L.NG, L.tiles, L.threads

    @T.macro
    def load_round(Qv, dst, rd, bid, warp, g, t):  # the weights of round rd's steps
        for u in T.unroll(L.U):
            for ti in T.unroll(tiles):
                for h in T.unroll(2):
                    row = T.meta_var(bid * L.rows + ti * 16 + g + 8 * h)
                    if L.in_range(warp, rd, u) and row < N:
                        dst[(u * tiles + ti) * 2 + h] = Qv[row * (K // 32) + L.step_of(warp, rd, u) * 4 + t]

    @T.macro
    def stage(Xv, Xs, Sf, ss, sums, lh, bid, tid):
        for it in T.unroll(L.s_turns):
            e = T.meta_var(it * threads + tid)
            if e < L.s_elems and bid * L.rows + e // NG < N:
                ss[e] = Sf[bid * L.rows * NG + e]
        for it in T.serial(L.stage_turns):
            e = T.meta_var(it * threads + tid)
            lh[0] = T.float32(0)
            lh[1] = T.float32(0)
            if e < L.items:
                _stage(T.address_of(Xv[e]), T.address_of(Xs[e]), T.address_of(lh[0]))
            # a step's 16 words are 16 consecutive lanes (K / 8 is a multiple of 16)
            for o in T.unroll(4):
                for j in T.unroll(2):
                    lh[j] = lh[j] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), lh[j], 8 >> o, 32, 32)
            if e < L.items and e % 16 == 0:
                sums[(e // 16) * 2] = lh[0]
                sums[(e // 16) * 2 + 1] = lh[1]
        T.cuda.cta_sync()

    return load_round, stage


def _mma_macro(L: MmaLayout, load_round):
    """The macro that runs a warp's rounds of steps: each round's mma steps while the next
    round's weights load, each step's sums less the pairs' offsets added up times its scales."""
    M, NS, tiles, U = L.M, L.NS, L.tiles, L.U

    @T.macro
    def fold(acc, c, ss, sums, s, g, t):
        # sum x (q - 8) = the accumulator less 1032 L + 72 H, times the group scale
        for ti in T.unroll(tiles):
            for j in T.unroll(4):
                m = T.meta_var(T.min(2 * t + j % 2, M - 1))
                jr = T.meta_var(ti * 16 + g + 8 * (j // 2))
                acc[ti * 4 + j] = acc[ti * 4 + j] + T.Cast("float32", ss[jr * L.NG + s * MMA_STEP_K // L.G]) * (
                    c[ti * 4 + j] - T.float32(1032) * sums[(m * NS + s) * 2]
                    - T.float32(72) * sums[(m * NS + s) * 2 + 1])

    @T.macro
    def rounds(Qv, Xs, ss, sums, qv, qn, c, acc, bid, warp, g, t):
        for a in T.unroll(tiles * 4):
            acc[a] = T.float32(0)
        for rd in T.serial(L.rounds):
            if rd + 1 < L.rounds:
                load_round(Qv, qn, rd + 1, bid, warp, g, t)
            for u in T.unroll(U):
                if L.in_range(warp, rd, u):
                    s = T.meta_var(L.step_of(warp, rd, u))
                    for a in T.unroll(tiles * 4):
                        c[a] = T.float32(0)
                    for ti in T.unroll(tiles):
                        _step(T.address_of(qv[(u * tiles + ti) * 2]),
                              T.address_of(Xs[T.min(g, M - 1) * L.words + s * 16 + t * 4]),
                              T.Cast("int32", g < M), T.address_of(c[ti * 4]))
                    fold(acc, c, ss, sums, s, g, t)
            for a in T.unroll(U * tiles * 2):
                qv[a] = qn[a]

    return rounds


def _store_macro(L: MmaLayout):
    """The macro that adds up the warps' sums of each output in shared memory and stores it."""
    M, N, rows = L.M, L.N, L.rows

    @T.macro
    def store(Yf, red, acc, tot, bid, tid, warp, g, t):
        for ti in T.unroll(L.tiles):
            for j in T.unroll(4):
                jr = T.meta_var(ti * 16 + g + 8 * (j // 2))
                red[(warp * rows + jr) * MMA_MAX_ROWS + 2 * t + j % 2] = acc[ti * 4 + j]
        T.cuda.cta_sync()
        for it in T.unroll(L.out_turns):
            e = T.meta_var(it * L.threads + tid)  # (row of the CTA, activation row)
            row = T.meta_var(bid * rows + e // M)
            if e < rows * M and row < N:
                tot[0] = red[(e // M) * MMA_MAX_ROWS + e % M]
                for w in T.serial(1, L.warps):
                    tot[0] = tot[0] + red[(w * rows + e // M) * MMA_MAX_ROWS + e % M]
                Yf[(e % M) * N + row] = T.Cast("float16", tot[0])

    return store


def build_kernel(func: tirx.PrimFunc, shape: WeightOnlyShape, tiles: int, warps: int,
                 prefetch: int = 2) -> tirx.PrimFunc:
    """The kernel for ``func``: CTAs of ``tiles`` 16-row tiles, their ``warps`` warps splitting K
    (each a run of 128-wide steps, ``prefetch`` steps' weights loaded ahead)."""
    L = MmaLayout.of(shape, tiles, warps, prefetch)
    M, N, K, U, s_dtype = L.M, L.N, L.K, L.U, shape.dtype
    load_round, stage = _staging_macros(L)
    store = _store_macro(L)
    rounds = _mma_macro(L, load_round)

    @T.macro
    def body(X, Q, S, Z, Y):
        T.device_entry()
        bid = T.cta_id([L.ctas])
        tid = T.thread_id([L.threads])
        pool = T.SMEMPool()
        xs = pool.alloc((L.items * 4,), "uint32", align=16)  # the staged X words (uint4 each)
        sums = pool.alloc((M * L.NS * 2,), "float32", align=16)  # (L, H) of each row of X and step
        ss = pool.alloc((L.s_elems,), s_dtype, align=16)  # the CTA's group scales
        red = pool.alloc((warps * L.partials,), "float32", align=16)  # the warps' partial sums
        pool.commit()
        Xv = T.decl_buffer((M * K // 8,), "uint32x4", data=X.data)
        # a 16-byte view of X: the pool's data pointer, at X's offset in it
        Xs = T.decl_buffer((L.items,), "uint32x4", data=xs.data, elem_offset=xs.elem_offset // 4)
        Qv = T.decl_buffer((N * K // 32,), "uint32x4", data=Q.data)
        Sf = T.decl_buffer((N * L.NG,), s_dtype, data=S.data)
        Yf = T.decl_buffer((M * N,), "float16", data=Y.data)
        lane = T.meta_var(tid % 32)
        warp = T.meta_var(tid // 32)
        g = T.meta_var(lane // 4)
        t = T.meta_var(lane % 4)
        # this round's weights and the next round's (in flight while this one is used)
        qv = T.alloc_buffer((U * tiles * 2,), "uint32x4", scope="local")
        qn = T.alloc_buffer((U * tiles * 2,), "uint32x4", scope="local")
        tot = T.alloc_buffer((1,), "float32", scope="local")
        c = T.alloc_buffer((tiles * 4,), "float32", scope="local")
        acc = T.alloc_buffer((tiles * 4,), "float32", scope="local")
        lh = T.alloc_buffer((2,), "float32", scope="local")
        # the first round's weights, in flight while X and the scales are staged
        load_round(Qv, qv, 0, bid, warp, g, t)
        stage(Xv, Xs, Sf, ss, sums, lh, bid, tid)
        rounds(Qv, Xs, ss, sums, qv, qn, c, acc, bid, warp, g, t)
        store(Yf, red, acc, tot, bid, tid, warp, g, t)

    return weight_only_kernel(func, shape, body)


class DequantGemvMmaTemplate(WeightOnlyGemvTemplate):
    kinds = ("gemv_dequant_mma",)
    name = "gemv_dequant_mma"
    inner = "warp"

    def build(self, func, shape, config, rows, warps):
        if not mma_gemv_fits(shape) or rows % 16 or not 1 <= warps <= 16:
            return None
        if mma_gemv_smem(shape, rows, warps) > MMA_MAX_SMEM:
            return None
        return build_kernel(func, shape, rows // 16, warps, max(1, config.pipeline_stages))
