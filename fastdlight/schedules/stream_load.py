"""16-byte loads of what a kernel streams once: a decode GEMV's 4-bit weights, read by one CTA
and by nothing else on its SM.

They are issued as ``ld.global.nc.L1::no_allocate``: the lines skip L1, where a stream only
evicts what the SM's CTAs share (the staged activations, the scales). H200, 2026-12-02: a bare
read of the same bytes (``bench_read_floor --loads``) was 1-3% faster in every shape with the
hint (23 MB 6.42 against 6.59 us), an ``L2::256B`` prefetch size 3-5% slower, ``L2::128B`` the
same; the 4-bit decode GEMV 1x11008x4096 ran 0.0076 against 0.0081 ms (``check_w4a16_decode``,
its best config in two runs each way), and 0.0082 with ``ld.global.cg`` (L2 only, no ``.nc``),
whose loads nvcc held in more registers. 8-bit weights keep plain loads: tuned with the hint,
1x4096x11008 ran 0.0146 against 0.0132 ms. The split-KV decode step's staged form already copies
by ``cp.async.cg`` (L2 only); its register-set form moved within the runs' spread with the hint
and keeps plain loads. ``FASTDLIGHT_STREAM_LOADS=0``: plain loads, for an A/B.
"""

from __future__ import annotations

import os

from tvm.backend.cuda.op import cuda_func_call

#: ``FASTDLIGHT_STREAM_LOADS=0``: streamed operands are read with plain loads
STREAM_LOADS = os.environ.get("FASTDLIGHT_STREAM_LOADS", "1").strip() != "0"

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


def stream_load16(buffer, index):
    """``buffer[index]`` of a ``uint32x4`` buffer in global memory, read past L1."""
    if not STREAM_LOADS:
        return buffer[index]
    return cuda_func_call("fdl_stream_load16", buffer.ptr_to([index]), source_code=_STREAM_LOAD16,
                          return_type="uint32x4")
