"""Dequantizing GEMV for 4-bit weights (``kind == "gemv_int4"``): the decode rows (M <= 16) of an
:func:`~fastdlight.analysis.int4.int4_matmul_func`, one TIRx kernel at the bandwidth of the
packed bytes.

A 4-bit weight costs a quarter of an fp16 weight's bytes, so decode runs 4x faster only if the
dequantization keeps up with HBM: converting each nibble to a float (an I2F and a few integer
operations per weight) leaves the kernel instruction-bound at about a third of the bandwidth.
Here two nibbles become two fp16 values with one masked OR: ``(w >> 4t) & 0x000F000F`` puts
nibbles ``t`` and ``t + 4`` in the low bits of the two halves of a word, and OR-ing
``0x6400`` into each half makes the fp16 ``1024 + q`` exactly; one ``sub.f16x2`` of ``1024 + z``
gives ``q - z`` (the reference's own fp16 rounding). The products with X are ``fma.f16x2`` over
one word's eight weights, whose sum is added to an fp32 accumulator times the group scale.

The layout that makes the pairs line up: X is copied once per CTA to shared memory with each
eight values stored as ``(x0, x4), (x1, x5), (x2, x6), (x3, x7)``, chunk-major so that the 32
lanes of a warp read consecutive 16 bytes (no bank conflicts). A warp owns ``rows_per_warp``
rows of the weight; per step every lane loads 16 bytes (4 words, 32 weights) of each row with one
128-bit load, a warp 512 contiguous bytes; the steps are unrolled so the loads of several are in
flight. Lanes' partial sums are combined with shuffles. The M activation rows share each
dequantized weight.
"""

from __future__ import annotations

from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.int4 import INT4_PER_WORD, LANE_WEIGHTS, Int4MatmulShape, dequant_gemv_fits, match_int4_matmul
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate

#: weight rows (of 512 bytes a warp) whose loads a warp has in flight
IN_FLIGHT_ROWS = 8

_DOT8 = r"""
__forceinline__ __device__ float fdl_w4_dot8(unsigned w, unsigned x0, unsigned x1, unsigned x2, unsigned x3,
                                             half z) {
  // nibbles t and t + 4 of w as the fp16 pair (1024 + q): OR-ed into the mantissa of 1024
  const half2 off = __half2half2(__hadd(__ushort_as_half((unsigned short)0x6400), z));
  unsigned v0 = (w & 0x000F000Fu) | 0x64006400u, v1 = ((w >> 4) & 0x000F000Fu) | 0x64006400u;
  unsigned v2 = ((w >> 8) & 0x000F000Fu) | 0x64006400u, v3 = ((w >> 12) & 0x000F000Fu) | 0x64006400u;
  half2 p = __hmul2(*reinterpret_cast<half2*>(&x0), __hsub2(*reinterpret_cast<half2*>(&v0), off));
  p = __hfma2(*reinterpret_cast<half2*>(&x1), __hsub2(*reinterpret_cast<half2*>(&v1), off), p);
  p = __hfma2(*reinterpret_cast<half2*>(&x2), __hsub2(*reinterpret_cast<half2*>(&v2), off), p);
  p = __hfma2(*reinterpret_cast<half2*>(&x3), __hsub2(*reinterpret_cast<half2*>(&v3), off), p);
  float2 f = __half22float2(p);
  return f.x + f.y;
}
"""
_DOT8_ZERO = _DOT8.replace("fdl_w4_dot8", "fdl_w4z_dot8").replace(
    "const half2 off = __half2half2(__hadd(__ushort_as_half((unsigned short)0x6400), z));",
    "const half2 off = __half2half2(__ushort_as_half((unsigned short)0x6400)), zz = __half2half2(z);").replace(
    "__hsub2(*reinterpret_cast<half2*>(&v0), off)", "__hsub2(__hsub2(*reinterpret_cast<half2*>(&v0), off), zz)").replace(
    "__hsub2(*reinterpret_cast<half2*>(&v1), off)", "__hsub2(__hsub2(*reinterpret_cast<half2*>(&v1), off), zz)").replace(
    "__hsub2(*reinterpret_cast<half2*>(&v2), off)", "__hsub2(__hsub2(*reinterpret_cast<half2*>(&v2), off), zz)").replace(
    "__hsub2(*reinterpret_cast<half2*>(&v3), off)", "__hsub2(__hsub2(*reinterpret_cast<half2*>(&v3), off), zz)")


def _dot8(zero_point: bool):
    """``sum_{e<8} x_e * (q_e - z)`` of one packed word against its eight (paired) activations:
    fp16 products and sums, the total as fp32. Without a zero point z is 8: 1024 + 8 is exact."""
    name, source = ("fdl_w4z_dot8", _DOT8_ZERO) if zero_point else ("fdl_w4_dot8", _DOT8)

    def call(w, x0, x1, x2, x3, z):
        return cuda_func_call(name, w, x0, x1, x2, x3, z, source_code=source, return_type="float32")

    return call


def build_kernel(func: tirx.PrimFunc, shape: Int4MatmulShape, warps: int, rows_per_warp: int) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` (an int4 matmul of ``shape``): ``warps`` warps a CTA, each
    owning ``rows_per_warp`` weight rows. Same parameters, same result."""
    M, N, K, G = shape.m, shape.n, shape.k, shape.group_size
    C = K // LANE_WEIGHTS  # lane steps along K (chunks of 32 weights)
    steps = -(-C // 32)
    threads, rows = warps * 32, warps * rows_per_warp
    ctas = -(-N // rows)
    x_words = M * C * 4  # groups of eight activations
    loads = -(-x_words // threads)
    R, out_dtype = rows_per_warp, shape.out_dtype
    # steps unrolled together: their loads are in flight at once (8 rows' 512 bytes a warp),
    # within the registers a thread has
    unroll = min(steps, max(1, IN_FLIGHT_ROWS // R))
    dot8 = _dot8(shape.zero_point)
    (x_shape, x_dtype), (q_shape, _), (s_shape, s_dtype) = shape.param_shapes()[:3]
    y_shape = shape.lead + (N,)

    def zero(Z, j, g):  # the group's zero point, or 8
        return Z[j, g] if Z is not None else tirx.const(8, "float16")

    @T.macro
    def body(X, Q, S, Z, Y):
        T.device_entry()
        bid = T.cta_id([ctas])
        tid = T.thread_id([threads])
        pool = T.SMEMPool()
        xs = pool.alloc((x_words * 4,), "uint32", align=16)
        pool.commit()
        Xw = T.decl_buffer((M * K // 2,), "uint32", data=X.data)
        Qv = T.decl_buffer((N * C,), "uint32x4", data=Q.data)
        Yf = T.decl_buffer((M * N,), out_dtype, data=Y.data)
        xv = T.alloc_buffer((4,), "uint32", scope="local")
        acc = T.alloc_buffer((R * M,), "float32", scope="local")
        # X to shared memory: eight activations (four words) as the pairs (x_t, x_t+4)
        for it in T.serial(loads):
            e = T.meta_var(it * threads + tid)  # (m, chunk, word of the chunk)
            if e < x_words:
                for w in T.vectorized(4):
                    xv[w] = Xw[e * 4 + w]
                m = T.meta_var(e // (C * 4))
                ci = T.meta_var(e % (C * 4))
                base = T.meta_var(((m * 4 + ci % 4) * C + ci // 4) * 4)
                xs[base + 0] = T.bitwise_or(T.bitwise_and(xv[0], T.uint32(0xFFFF)), T.shift_left(xv[2], T.uint32(16)))
                xs[base + 1] = T.bitwise_or(T.shift_right(xv[0], T.uint32(16)), T.bitwise_and(xv[2], T.uint32(0xFFFF0000)))
                xs[base + 2] = T.bitwise_or(T.bitwise_and(xv[1], T.uint32(0xFFFF)), T.shift_left(xv[3], T.uint32(16)))
                xs[base + 3] = T.bitwise_or(T.shift_right(xv[1], T.uint32(16)), T.bitwise_and(xv[3], T.uint32(0xFFFF0000)))
        T.cuda.cta_sync()
        lane = T.meta_var(tid % 32)
        for a in T.unroll(R * M):
            acc[a] = T.float32(0)
        for so in T.serial(-(-steps // unroll)):
            for si in T.unroll(unroll):
                c = T.meta_var((so * unroll + si) * 32 + lane)
                for r in T.unroll(R):
                    j = T.meta_var(bid * rows + (tid // 32) * R + r)
                    if j < N and c < C:
                        q4 = Qv[j * C + c]
                        for i in T.unroll(4):
                            g = T.meta_var((c * 4 + i) // (G // INT4_PER_WORD))
                            z = T.meta_var(zero(Z, j, g))
                            for m in T.unroll(M):
                                x = T.meta_var(((m * 4 + i) * C + c) * 4)
                                acc[r * M + m] = acc[r * M + m] + dot8(
                                    T.Shuffle([q4], [i]), xs[x], xs[x + 1], xs[x + 2], xs[x + 3], z,
                                ) * T.Cast("float32", S[j, g])
        for a in T.unroll(R * M):
            for o in T.unroll(5):
                acc[a] = acc[a] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), acc[a], 16 >> o, 32, 32)
        if lane == 0:
            for r in T.unroll(R):
                j = T.meta_var(bid * rows + (tid // 32) * R + r)
                if j < N:
                    for m in T.unroll(M):
                        Yf[m * N + j] = T.Cast(out_dtype, acc[r * M + m])

    @T.prim_func
    def with_zeros(X: T.Buffer(x_shape, x_dtype), Q: T.Buffer(q_shape, "uint32"), S: T.Buffer(s_shape, s_dtype),
                   Z: T.Buffer(s_shape, s_dtype), Y: T.Buffer(y_shape, out_dtype)):
        body(X, Q, S, Z, Y)

    @T.prim_func
    def symmetric(X: T.Buffer(x_shape, x_dtype), Q: T.Buffer(q_shape, "uint32"), S: T.Buffer(s_shape, s_dtype),
                  Y: T.Buffer(y_shape, out_dtype)):
        body(X, Q, S, None, Y)

    kernel = with_zeros if shape.zero_point else symmetric
    attrs = {"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True}
    if func.attrs is not None and "global_symbol" in func.attrs:
        attrs["global_symbol"] = func.attrs["global_symbol"]
    return kernel.with_attrs(attrs)


class GemvInt4Template(ScheduleTemplate):
    kinds = ("gemv_int4",)
    name = "gemv_int4"

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        shape = match_int4_matmul(func)
        if shape is None or config.kind != "gemv_int4" or len(config.block) != 1 or len(config.thread) != 1:
            return None
        rows, per_warp = config.block[0], config.thread[0]
        warps = rows // per_warp
        if not dequant_gemv_fits(shape) or rows % per_warp or not 1 <= warps <= 32:
            return None
        return build_kernel(func, shape, warps, per_warp)
