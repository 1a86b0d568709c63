"""16-byte loads of what a kernel streams once: a decode GEMV's weights, a decode step's cached
keys and values, read by one CTA and by nothing else on its SM.

They are issued as ``ld.global.nc.L1::no_allocate``: the lines skip L1, where a stream only
evicts what the SM's CTAs share (staged activations, scales, the query). A bare read of the
same bytes (``bench_read_floor --loads``, H200, 2026-12-02) was 1-3% faster in every shape
with the hint: 67 MB 16.01 against 16.20 us, 23 MB 6.42 against 6.59; an ``L2::256B``
prefetch size made every shape 3-5% slower and ``L2::128B`` changed nothing, so neither is
used. ``FASTDLIGHT_STREAM_LOADS=0``: plain loads, for an A/B.
"""

from __future__ import annotations

import os

from tvm.backend.cuda.op import cuda_func_call

#: how streamed operands are read: ``no_allocate`` (the default), ``cg`` (``ld.global.cg``: cached
#: in L2 only) or ``0`` (plain loads), from ``FASTDLIGHT_STREAM_LOADS``
STREAM_LOADS = os.environ.get("FASTDLIGHT_STREAM_LOADS", "no_allocate").strip().lower()

_STREAM_LOAD16 = r"""
__forceinline__ __device__ uint4 fdl_stream_load16(const void* p) {
  uint4 v;
  // volatile: the load stays after the kernel's dependency wait (volatile asm too), before
  // which the previous kernel may still be writing what it reads
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
"""

_CG_LOAD16 = r"""
__forceinline__ __device__ uint4 fdl_cg_load16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
"""


_COPY16 = r"""
__forceinline__ __device__ void fdl_stream_copy16(void* dst, const void* src) {
  *reinterpret_cast<uint4*>(dst) = LOAD(src);
}
"""


def streams() -> bool:
    """Whether streamed operands get hinted loads (``FASTDLIGHT_STREAM_LOADS`` not ``0``)."""
    return STREAM_LOADS in ("no_allocate", "cg")


def stream_copy16(dst, src):
    """Copy 16 bytes from global ``src`` to ``dst`` (pointers; a register array's after unrolling),
    the load read past L1: a call to evaluate. Only where :func:`streams`."""
    load, source = ("fdl_cg_load16", _CG_LOAD16) if STREAM_LOADS == "cg" else ("fdl_stream_load16", _STREAM_LOAD16)
    return cuda_func_call("fdl_stream_copy16", dst, src, source_code=source + _COPY16.replace("LOAD", load))


def stream_load16(buffer, index):
    """``buffer[index]`` of a ``uint32x4`` buffer in global memory, read past L1."""
    if STREAM_LOADS == "no_allocate":
        return cuda_func_call("fdl_stream_load16", buffer.ptr_to([index]), source_code=_STREAM_LOAD16,
                              return_type="uint32x4")
    if STREAM_LOADS == "cg":
        return cuda_func_call("fdl_cg_load16", buffer.ptr_to([index]), source_code=_CG_LOAD16,
                              return_type="uint32x4")
    return buffer[index]
