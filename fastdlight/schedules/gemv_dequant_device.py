"""CUDA device functions of the dequantizing GEMVs (:mod:`.gemv_dequant`, whose docstring says
why they are written so, and :mod:`.gemv_dequant_mma`): a lane step's dot product of packed
weights with paired activations for each weight width and activation type, the ``lop3`` both
templates make their fp16 pairs with, and the split-K cluster's read of a peer CTA's shared
memory.
"""

from __future__ import annotations

from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.weight_only import WeightOnlyShape

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


def dot(shape: WeightOnlyShape, x_global: bool = False):
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


def cluster_load(ptr, rank):
    """The float at ``ptr`` in the shared memory of the cluster's CTA ``rank``."""
    return cuda_func_call("fdl_cluster_ld", ptr, rank, source_code=_CLUSTER_LOAD, return_type="float32")
