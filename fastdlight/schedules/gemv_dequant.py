"""Dequantizing GEMV for 4- and 8-bit weights (``kind == "gemv_dequant"``): the decode rows
(M <= 16) of a :func:`~fastdlight.analysis.weight_only.weight_only_func`, one TIRx kernel at the
bandwidth of the packed bytes.

A 4-bit weight costs a quarter of an fp16 weight's bytes, so decode runs 4x faster only if the
dequantization keeps up with HBM: converting each nibble to a float (an I2F and a few integer
operations per weight) leaves the kernel instruction-bound at about a third of the bandwidth
(stock Dlight's schedule ran 1x11008x4096 at 1.3 TB/s of packed bytes on an H200). Here a masked
OR makes two nibbles two fp16 values: ``w & 0x000F000F`` puts nibbles 0 and 4 in the low bits of
the two halves of a word, and OR-ing ``0x6400`` into each half makes the fp16 ``1024 + q``
exactly; ``w & 0x00F000F0`` gives nibbles 1 and 5 as ``1024 + 16 q``, scaled in the same f16x2
fma that subtracts the zero, so a word takes one shift (``w >> 8``) for its other four. Each
pair becomes ``(q - 8) / 8`` in one fma (a zero point: two, rounded as the reference rounds
``q - z``): the power of two is exact and keeps a lane step's 32 products below fp16's 65504 for
activations up to 2047 (unscaled, outliers of a few hundred would overflow). Products and the
step's sum are f16x2; the sum is added to an fp32 accumulator times 8 and the group scale
(groups are whole steps). bf16 activations (7 mantissa
bits) take each nibble shifted down into the mantissa of 128 and sum a word's products in bf16
before the fp32 add.

The layout that makes the pairs line up: X is copied once per CTA to shared memory with each
eight values stored as ``(x0, x4), (x1, x5), (x2, x6), (x3, x7)``, chunk-major so that the 32
lanes of a warp read consecutive 16 bytes (no bank conflicts). A warp owns ``rows_per_warp``
rows of the weight; per step every lane loads 16 bytes (4 words, 32 weights) of each row with one
128-bit load, a warp 512 contiguous bytes; steps are unrolled in groups so the loads of several
are in flight, and the first group's are issued before X is staged (its L2 reads overlap them).
Lanes' partial sums are combined with shuffles; the M activation rows share each weight.
A persistent config launches the CTAs the SMs hold at once, each walking row blocks.

Two other forms (``build_kernel``'s ``split`` and ``x_global``). Split-K: a thread-block cluster
of S CTAs (``split_k``) shares a row block, each CTA a slice of K, and stages only its slice of
X; after the warps' shuffles each CTA keeps its partial sums in shared memory, the cluster
synchronizes, and each CTA adds up every S-th sum of the block from all S CTAs (``mapa`` +
``ld.shared::cluster``, in rank order) and stores it; a second cluster barrier keeps every CTA
alive until its peers have read it. No workspace and no second kernel: the op's parameters stay
X, Q, S, (Z,) Y. Activations from global memory (``vectorize`` X 8; 4-bit weights, fp16): nothing
is staged and there is no barrier; each step reads its 32 activations with ``ld.global.nc``
(L1 keeps them for the SM's other CTAs) and pairs them with four byte permutes a word.

8-bit weights (fp16 activations) work the same way with bytes: ``w & 0x00FF00FF`` gives bytes 0
and 2 as ``1024 + b``, ``(w >> 8) & 0x00FF00FF`` bytes 1 and 3; a pair becomes ``(b - z) / 128``
in one fma; the activations are staged as the pairs ``(x0, x2), (x1, x3)`` of each word's four,
and a lane step is 16 weights.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.weight_only import (X_GLOBAL_WIDTH, WeightOnlyShape, dequant_gemv_fits, match_weight_only,
                                             resident_ctas, x_global_fits)
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate, as_tirx_kernel

#: weight rows (of 512 bytes a warp) whose loads a warp has in flight
IN_FLIGHT_ROWS = 8
#: most CTAs of a split-K cluster (the portable cluster size)
MAX_SPLIT = 8

#: ``(w & mask) | magic`` as one ``lop3``: written in C, nvcc emits two (an AND, then an OR),
#: since an instruction takes one immediate; here both constants sit in registers set once
AND_OR = r"""
__forceinline__ __device__ unsigned fdl_and_or(unsigned w, unsigned mask, unsigned magic) {
  unsigned r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(mask), "r"(magic));
  return r;
}
"""

_DOT32 = AND_OR + r"""
__forceinline__ __device__ float NAME(unsigned q0, unsigned q1, unsigned q2, unsigned q3, const unsigned* x,
                                      int stride, half z) {
  // per word: nibbles (t, t + 4) as fp16 pairs. The low nibble of each half OR-ed into the
  // mantissa of 1024 gives 1024 + q; the next nibble, masked in place, gives 1024 + 16 q. Both
  // become (q - z) / 8 (exact: a power of two), so that 32 products stay below fp16's 65504
  // for activations up to 2047; the sum is scaled back in fp32
  const half2 k8 = __half2half2(__ushort_as_half((unsigned short)0x4800));
  const half2 k128 = __half2half2(__ushort_as_half((unsigned short)0x5800));
  const half2 k8th = __half2half2(__ushort_as_half((unsigned short)0x3000));
  const half2 k128th = __half2half2(__ushort_as_half((unsigned short)0x2000));
  const half2 z8 = __hmul2(__half2half2(z), k8th);
  const auto low = [&](half2 h) { return LOW; };
  const auto high = [&](half2 h) { return HIGH; };
  const unsigned q[4] = {q0, q1, q2, q3};
  half2 p = __float2half2_rn(0.f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 xv = XLOAD;
    const unsigned w = q[i], w8 = w >> 8;
    unsigned a = fdl_and_or(w, 0x000F000Fu, 0x64006400u), b = fdl_and_or(w, 0x00F000F0u, 0x64006400u);
    unsigned c = fdl_and_or(w8, 0x000F000Fu, 0x64006400u), d = fdl_and_or(w8, 0x00F000F0u, 0x64006400u);
    p = __hfma2(*reinterpret_cast<const half2*>(&xv.x), low(*reinterpret_cast<half2*>(&a)), p);
    p = __hfma2(*reinterpret_cast<const half2*>(&xv.y), high(*reinterpret_cast<half2*>(&b)), p);
    p = __hfma2(*reinterpret_cast<const half2*>(&xv.z), low(*reinterpret_cast<half2*>(&c)), p);
    p = __hfma2(*reinterpret_cast<const half2*>(&xv.w), high(*reinterpret_cast<half2*>(&d)), p);
  }
  const float2 f = __half22float2(p);
  return (f.x + f.y) * 8.f;
}
"""
#: a word's eight activations, as the pairs (x0, x4), (x1, x5), (x2, x6), (x3, x7): staged so in
#: shared memory (a chunk apart), or read in order from global memory (through L1: every CTA of
#: an SM reads the same activations) and paired with byte permutes
_X_STAGED = "*reinterpret_cast<const uint4*>(x + 4 * i * stride)"
_X_GLOBAL = "fdl_pair8(__ldg(reinterpret_cast<const uint4*>(x) + i))"
_PAIR8 = r"""
__forceinline__ __device__ uint4 fdl_pair8(uint4 v) {
  // (x0 x1, x2 x3, x4 x5, x6 x7) -> (x0 x4, x1 x5, x2 x6, x3 x7)
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                    __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
}
"""
#: (q - z) / 8 from 1024 + q (LOW: / 8 gives 128 + q / 8) and 1024 + 16 q (HIGH: / 128 gives
#: 8 + q / 8). Without a zero point z is 8: one fma a pair (128 + 1 and 8 + 1 are exact); a
#: zero point is subtracted on its own, as the reference rounds q - z
_SYMMETRIC = {"NAME": "fdl_w4_dot32", "LOW": "__hfma2(h, k8th, __hneg2(__hadd2(k128, z8)))",
              "HIGH": "__hfma2(h, k128th, __hneg2(__hadd2(k8, z8)))"}
_ZERO_POINT = {"NAME": "fdl_w4z_dot32", "LOW": "__hsub2(__hfma2(h, k8th, __hneg2(k128)), z8)",
               "HIGH": "__hsub2(__hfma2(h, k128th, __hneg2(k8)), z8)"}


_DOT32_BF16 = AND_OR + r"""
__forceinline__ __device__ float NAME(unsigned q0, unsigned q1, unsigned q2, unsigned q3, const unsigned* x,
                                      int stride, __nv_bfloat16 z) {
  // bf16 has 7 mantissa bits: each nibble shifted down and OR-ed into the mantissa of 128
  // (128 + q); a word's products summed in bf16, then in fp32
  const __nv_bfloat162 k128 = __bfloat162bfloat162(__ushort_as_bfloat16((unsigned short)0x4300));
  const __nv_bfloat162 zz = __bfloat162bfloat162(z);
  const auto deq = [&](__nv_bfloat162 h) { return DEQ; };
  const unsigned q[4] = {q0, q1, q2, q3};
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 xv = *reinterpret_cast<const uint4*>(x + 4 * i * stride);
    const unsigned xs[4] = {xv.x, xv.y, xv.z, xv.w};
    __nv_bfloat162 p = __float2bfloat162_rn(0.f);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      unsigned v = fdl_and_or(q[i] >> (4 * t), 0x000F000Fu, 0x43004300u);
      p = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&xs[t]), deq(*reinterpret_cast<__nv_bfloat162*>(&v)), p);
    }
    const float2 f = __bfloat1622float2(p);
    acc += f.x + f.y;
  }
  return acc;
}
"""
#: bf16: q - z from 128 + q; 128 + 8 is exact
_BF16_SYMMETRIC = {"NAME": "fdl_w4b_dot32", "DEQ": "__hsub2(h, __hadd2(k128, zz))"}
_BF16_ZERO_POINT = {"NAME": "fdl_w4bz_dot32", "DEQ": "__hsub2(__hsub2(h, k128), zz)"}


_DOT16_INT8 = AND_OR + r"""
__forceinline__ __device__ float NAME(unsigned q0, unsigned q1, unsigned q2, unsigned q3, const unsigned* x,
                                      int stride, half z) {
  // 8-bit weights: bytes 0 and 2 of a word OR-ed into the mantissa of 1024 give 1024 + b, bytes
  // 1 and 3 the same after one shift; both become (b - z) / 128 (exact: a power of two), so that
  // a step's 16 products stay below fp16's 65504 for activations up to 4095
  const half2 k8 = __half2half2(__ushort_as_half((unsigned short)0x4800));
  const half2 k128th = __half2half2(__ushort_as_half((unsigned short)0x2000));
  const half2 z128 = __hmul2(__half2half2(z), k128th);
  const auto deq = [&](half2 h) { return DEQ; };
  const unsigned q[4] = {q0, q1, q2, q3};
  half2 p = __float2half2_rn(0.f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint2 xv = *reinterpret_cast<const uint2*>(x + 2 * i * stride);
    unsigned a = fdl_and_or(q[i], 0x00FF00FFu, 0x64006400u), c = fdl_and_or(q[i] >> 8, 0x00FF00FFu, 0x64006400u);
    p = __hfma2(*reinterpret_cast<const half2*>(&xv.x), deq(*reinterpret_cast<half2*>(&a)), p);
    p = __hfma2(*reinterpret_cast<const half2*>(&xv.y), deq(*reinterpret_cast<half2*>(&c)), p);
  }
  const float2 f = __half22float2(p);
  return (f.x + f.y) * 128.f;
}
"""
#: 8-bit: (b - z) / 128 from 1024 + b (/ 128 gives 8 + b / 128); z 128 symmetric: 8 + 1 is exact
_INT8_SYMMETRIC = {"NAME": "fdl_w8_dot16", "DEQ": "__hfma2(h, k128th, __hneg2(__hadd2(k8, z128)))"}
_INT8_ZERO_POINT = {"NAME": "fdl_w8z_dot16", "DEQ": "__hsub2(__hfma2(h, k128th, __hneg2(k8)), z128)"}


def _dot(shape: WeightOnlyShape, x_global: bool = False):
    """``sum x_e * (q_e - z)`` of one lane step (four packed words: 32 weights of 4 bits, 16 of
    8) against its paired activations in shared memory (``x``: the first word's pairs; each next
    word's a chunk further, ``stride`` chunks): 16-bit products and sums (fp16: a step's; bf16: a
    word's), the total as fp32. ``x_global`` (4-bit weights, fp16): ``x`` is the step's 32
    activations in global memory, in order."""
    if shape.bits == 8:
        parts, source = (_INT8_ZERO_POINT if shape.zero_point else _INT8_SYMMETRIC), _DOT16_INT8
    elif shape.dtype == "bfloat16":
        parts, source = (_BF16_ZERO_POINT if shape.zero_point else _BF16_SYMMETRIC), _DOT32_BF16
    else:
        parts, source = (_ZERO_POINT if shape.zero_point else _SYMMETRIC), _DOT32
        parts = dict(parts, XLOAD=_X_GLOBAL if x_global else _X_STAGED)
        if x_global:
            parts["NAME"] += "g"
            source = _PAIR8 + source
    assert not x_global or "XLOAD" in parts, "activations read from global memory: 4-bit weights, fp16 only"
    for key, value in parts.items():
        source = source.replace(key, value)

    def call(q4, x, stride, z):
        words = [T.Shuffle([q4], [i]) for i in range(4)]
        return cuda_func_call(parts["NAME"], *words, x, stride, z, source_code=source, return_type="float32")

    return call


_CLUSTER_LOAD = r"""
__forceinline__ __device__ float fdl_cluster_ld(const float* p, unsigned rank) {
  // the float at p in the shared memory of the cluster's CTA `rank`
  unsigned a = (unsigned)__cvta_generic_to_shared(p), r;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
  return v;
}
"""


def _cluster_load(ptr, rank):
    return cuda_func_call("fdl_cluster_ld", ptr, rank, source_code=_CLUSTER_LOAD, return_type="float32")


def build_kernel(func: tirx.PrimFunc, shape: WeightOnlyShape, warps: int, rows_per_warp: int,
                 ctas_launched: int | None = None, split: int = 1, x_global: bool = False) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` (a weight-only matmul of ``shape``): ``warps`` warps a CTA, each
    owning ``rows_per_warp`` weight rows; ``ctas_launched`` (persistent): that many CTAs walk
    the row blocks, staging X once each. ``split`` > 1: a thread-block cluster of that many CTAs
    shares a row block, each CTA a slice of K (and stages only its slice of X); their partial
    sums meet in distributed shared memory, each CTA adding up and storing a share of the rows.
    ``x_global`` (4-bit weights, fp16): nothing is staged, each step reads its activations from
    global memory (L1) and pairs them with byte permutes. Same parameters, same result."""
    M, N, K, G = shape.m, shape.n, shape.k, shape.group_size
    C = K // shape.lane_weights  # lane steps along K (chunks of 32 4-bit or 16 8-bit weights)
    KS = split
    assert KS >= 1 and (KS == 1 or ctas_launched is None), "split-K CTAs are not persistent"
    assert not x_global or x_global_fits(shape)
    Cs = -(-C // KS)  # lane steps of a CTA's slice of K
    pairs = shape.per_word // 2  # activation pairs (uint32 words of X) a packed word meets
    steps = -(-Cs // 32)
    threads, rows = warps * 32, warps * rows_per_warp
    blocks = -(-N // rows)
    ctas = min(blocks, ctas_launched or blocks) * KS
    x_words = 0 if x_global else M * Cs * 4  # groups of a packed word's activations (8 or 4)
    loads = -(-x_words // threads)
    R, out_dtype = rows_per_warp, shape.out_dtype
    # steps unrolled together: their loads are in flight at once (8 rows' 512 bytes a warp),
    # within the registers a thread has
    unroll = min(steps, max(1, IN_FLIGHT_ROWS // R))
    groups, turns = -(-steps // unroll), -(-blocks // (ctas // KS))
    partials = rows * M  # a CTA's sums, shared with its cluster (split-K)
    combine = -(-partials // (KS * threads))
    dot = _dot(shape, x_global)
    (x_shape, x_dtype), (q_shape, _), (s_shape, s_dtype) = shape.param_shapes()[:3]
    y_shape = shape.lead + (N,)
    # a CTA's group scales (and zero points) staged in shared memory with X, where each CTA owns
    # one row block and K whole: read in place, ptxas sank the scale loads past a CTA's last
    # weights, so that every CTA waited one more HBM round trip after its stream had ended
    NG = K // G
    staged = x_words > 0 and KS == 1 and turns == 1
    s_elems = rows * NG if staged else 0
    s_params = 2 if shape.zero_point else 1
    s_loads = -(-s_elems // threads)

    def half_of(xv, i):  # activation i of a group (16 bits of its word i // 2), low bits
        return T.bitwise_and(T.shift_right(xv[i // 2], T.Cast("uint32", (i % 2) * 16)), T.uint32(0xFFFF))

    def zero(Z, ss, j, jr, g):  # the group's zero point (staged: row jr of the block), or the middle
        if Z is None:
            return tirx.const(1 << (shape.bits - 1), shape.dtype)
        return ss[s_elems + jr * NG + g] if staged else Z[j, g]

    def scale(S, ss, j, jr, g):  # the group's scale, staged (row jr of the block) or in place
        return ss[jr * NG + g] if staged else S[j, g]

    def scale_slot(it, bid, tid):  # a thread's it-th staged scale: in the block and of a row of Y
        return tirx.all(it * threads + tid < s_elems, bid * rows + (it * threads + tid) // NG < N)

    def weights(pre, qpre, Qv, si, r, j, c):  # a lane step's four words: prefetched, or loaded now
        return qpre[si * R + r] if pre else Qv[j * C + c]

    def chunk(rank, cl):  # the lane step of K at step cl of the CTA's slice
        return cl if KS == 1 else rank * Cs + cl

    def in_k(rank, cl):
        return chunk(rank, cl) < C if KS == 1 else tirx.all(cl < Cs, chunk(rank, cl) < C)

    def x_at(Xw, xs, m, cl, c):  # the step's activations (and the stride of its words' pairs)
        if x_global:
            return T.address_of(Xw[m * (K // 2) + c * (shape.lane_weights // 2)]), C
        return T.address_of(xs[(m * 4 * Cs + cl) * pairs]), Cs

    def row_block(turn, bid):
        return turn * ctas + bid if KS == 1 else bid // KS

    def _sum_ranks(ps, e):
        total = _cluster_load(T.address_of(ps[e]), T.uint32(0))
        for p in range(1, KS):
            total = total + _cluster_load(T.address_of(ps[e]), T.uint32(p))
        return total

    @T.macro
    def group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, so, tid, pre):
        """Steps ``so * unroll ..`` of ``block``'s rows, their loads unrolled together."""
        for si in T.unroll(unroll):
            cl = T.meta_var((so * unroll + si) * 32 + tid % 32)
            c = T.meta_var(chunk(rank, cl))
            for r in T.unroll(R):
                jr = T.meta_var((tid // 32) * R + r)
                j = T.meta_var(block * rows + jr)
                if j < N and in_k(rank, cl):
                    q4 = T.meta_var(weights(pre, qpre, Qv, si, r, j, c))
                    g = T.meta_var(c * shape.lane_weights // G)
                    for m in T.unroll(M):
                        acc[r * M + m] = acc[r * M + m] + dot(
                            q4, *x_at(Xw, xs, m, cl, c), zero(Z, ss, j, jr, g),
                        ) * T.Cast("float32", scale(S, ss, j, jr, g))

    @T.macro
    def body(X, Q, S, Z, Y):
        T.device_entry()
        bid = T.cta_id([ctas])
        if KS > 1:
            rank = T.cta_id_in_cluster([KS])
        else:
            rank = T.meta_var(0)
        tid = T.thread_id([threads])
        if x_words > 0 or KS > 1:
            pool = T.SMEMPool()
            xs = pool.alloc((max(1, x_words * pairs),), "uint32", align=16)
            ps = pool.alloc((partials,), "float32", align=16)
            ss = pool.alloc((max(1, s_elems * s_params),), s_dtype, align=16)
            pool.commit()
        else:
            xs = T.meta_var(None)
            ps = T.meta_var(None)
            ss = T.meta_var(None)
        Xw = T.decl_buffer((M * K // 2,), "uint32", data=X.data)
        Qv = T.decl_buffer((N * C,), "uint32x4", data=Q.data)
        Yf = T.decl_buffer((M * N,), out_dtype, data=Y.data)
        Sf = T.decl_buffer((N * NG,), s_dtype, data=S.data)
        Zf = T.meta_var(T.decl_buffer((N * NG,), s_dtype, data=Z.data) if Z is not None else None)
        xv = T.alloc_buffer((pairs,), "uint32", scope="local")
        acc = T.alloc_buffer((R * M,), "float32", scope="local")
        # the first group of steps' weights (the first block's), in flight while X is staged
        qpre = T.alloc_buffer((unroll * R,), "uint32x4", scope="local")
        for si in T.unroll(unroll):
            for r in T.unroll(R):
                j = T.meta_var(row_block(0, bid) * rows + (tid // 32) * R + r)
                cl = T.meta_var(si * 32 + tid % 32)
                if j < N and in_k(rank, cl):
                    qpre[si * R + r] = Qv[j * C + chunk(rank, cl)]
        # the row block's scales (and zero points) read now, stored beside X before the barrier
        sv = T.alloc_buffer((max(1, s_loads * s_params),), s_dtype, scope="local")
        for it in T.unroll(s_loads):
            if scale_slot(it, bid, tid):
                sv[it] = Sf[bid * rows * NG + it * threads + tid]
                if Z is not None:
                    sv[s_loads + it] = Zf[bid * rows * NG + it * threads + tid]
        if x_words > 0:
            # X to shared memory: eight activations (four words) as the pairs (x_t, x_t+4), the
            # words of a lane step a chunk apart (lanes read consecutive 16 bytes); a CTA of a
            # split-K cluster, its slice of K only
            for it in T.serial(loads):
                e = T.meta_var(it * threads + tid)  # (m, chunk of the slice, word of the chunk)
                if e < x_words:
                    m = T.meta_var(e // (Cs * 4))
                    ci = T.meta_var(e % (Cs * 4))
                    if chunk(rank, ci // 4) < C:
                        for w in T.vectorized(pairs):
                            xv[w] = Xw[(m * C * 4 + chunk(rank, 0) * 4 + ci) * pairs + w]
                        base = T.meta_var(((m * 4 + ci % 4) * Cs + ci // 4) * pairs)
                        for t in T.unroll(pairs):
                            xs[base + t] = T.bitwise_or(half_of(xv, t),
                                                        T.shift_left(half_of(xv, t + pairs), T.uint32(16)))
            for it in T.unroll(s_loads):
                if scale_slot(it, bid, tid):
                    ss[it * threads + tid] = sv[it]
                    if Z is not None:
                        ss[s_elems + it * threads + tid] = sv[s_loads + it]
            T.cuda.cta_sync()
        lane = T.meta_var(tid % 32)
        for turn in T.serial(turns):
            block = T.meta_var(row_block(turn, bid))
            for a in T.unroll(R * M):
                acc[a] = T.float32(0)
            if turn == 0:
                group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, 0, tid, True)
            else:
                group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, 0, tid, False)
            for so in T.serial(1, groups):
                group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, so, tid, False)
            for a in T.unroll(R * M):
                for o in T.unroll(5):
                    acc[a] = acc[a] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), acc[a], 16 >> o, 32, 32)
            if KS == 1:
                if lane == 0:
                    for r in T.unroll(R):
                        j = T.meta_var(block * rows + (tid // 32) * R + r)
                        if j < N:
                            for m in T.unroll(M):
                                Yf[m * N + j] = T.Cast(out_dtype, acc[r * M + m])
            else:
                # the cluster's partial sums: each CTA's in its shared memory, then every CTA adds
                # up every KS-th (row, activation row) from all of them (in rank order) and stores it
                if lane == 0:
                    for r in T.unroll(R):
                        for m in T.unroll(M):
                            ps[((tid // 32) * R + r) * M + m] = acc[r * M + m]
                T.cuda.cluster_sync()
                for it in T.serial(combine):
                    e = T.meta_var(rank + KS * (it * threads + tid))  # (row of the block, activation row)
                    j = T.meta_var(block * rows + e // M)
                    if e < partials and j < N:
                        Yf[(e % M) * N + j] = T.Cast(out_dtype, _sum_ranks(ps, e))
                # no CTA leaves while a peer may still read its partial sums
                T.cuda.cluster_sync()

    @T.prim_func
    def with_zeros(X: T.Buffer(x_shape, x_dtype), Q: T.Buffer(q_shape, "uint32"), S: T.Buffer(s_shape, s_dtype),
                   Z: T.Buffer(s_shape, s_dtype), Y: T.Buffer(y_shape, out_dtype)):
        body(X, Q, S, Z, Y)

    @T.prim_func
    def symmetric(X: T.Buffer(x_shape, x_dtype), Q: T.Buffer(q_shape, "uint32"), S: T.Buffer(s_shape, s_dtype),
                  Y: T.Buffer(y_shape, out_dtype)):
        body(X, Q, S, None, Y)

    kernel = with_zeros if shape.zero_point else symmetric
    return as_tirx_kernel(kernel, func)


class DequantGemvTemplate(ScheduleTemplate):
    kinds = ("gemv_dequant",)
    name = "gemv_dequant"

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        shape = match_weight_only(func)
        if shape is None or config.kind != "gemv_dequant" or len(config.block) != 1 or len(config.thread) != 1:
            return None
        rows, per_warp = config.block[0], config.thread[0]
        warps = rows // per_warp
        if not dequant_gemv_fits(shape) or rows % per_warp or not 1 <= warps <= 32:
            return None
        split, x_global = config.split_k, config.vector_width("X") == X_GLOBAL_WIDTH
        if split > 1 and (config.persistent or split > MAX_SPLIT) or x_global and not x_global_fits(shape):
            return None
        launched = None
        if config.persistent:
            target = tvm.target.Target.current(allow_none=True)
            arch = CUDA(target) if target is not None else None
            launched = resident_ctas(shape, warps, arch) * (arch.sm_count if arch is not None else 132)
        return build_kernel(func, shape, warps, per_warp, launched, split, x_global)
