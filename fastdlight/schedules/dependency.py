"""What a kernel may do before the kernel ahead of it on the stream has finished, and when it
lets the next one start.

Kernels fastdlight builds for sm_90+ are launched as programmatic dependents
(:mod:`fastdlight.compiler.dependent_launch`): a kernel's CTAs are placed once every CTA of the
kernel before it has exited or released its dependents, and they wait in ``griddepcontrol.wait``
until that kernel has completed. A memory-bound kernel of a few microseconds (a decode GEMV, a
decode attention step) spends a part of its time where HBM idles: the ramp while its first
loads cross HBM, the tail while its last CTAs reduce and store. Two markers let a template
overlap the one with the other:

- :func:`dependency_prologue` around statements that run *before* the wait. They may only
  prefetch into L2 (:func:`prefetch_l2`): the L2 is where the GPU's memory is coherent, so a
  prefetch of bytes the previous kernel still writes fetches nothing stale; it only warms
  lines. A kernel reading weights or a KV cache fetches its first bytes while the kernel ahead
  of it finishes.
- :func:`release_dependents` where the next kernel may be placed: after the CTA's last load of
  its main loop, so that the next kernel's prologue runs during this kernel's tail. Released
  any earlier, the next kernel's CTAs would take the free slots while this one still streams.

The build pass turns the markers into the wait after the prologue and
``griddepcontrol.launch_dependents``; a kernel built without dependent launch (sm_80, switched
off) keeps the prefetches and drops the release.
"""

from __future__ import annotations

import os

from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

#: attribute keys of the two markers (AttrStmts the build pass replaces)
PROLOGUE = "fastdlight.dependency_prologue"
RELEASE = "fastdlight.release_dependents"
#: L2 bytes a kernel's prologue prefetches, over all its CTAs: half of an H100's or H200's 50 MB,
#: so that the prefetched lines outlive the previous kernel's last reads
PREFETCH_BUDGET = int(float(os.environ.get("FASTDLIGHT_PREFETCH_MB", "24")) * (1 << 20))
#: what of the overlap templates use: ``FASTDLIGHT_DEPENDENCY_OVERLAP=prefetch,release`` (both, the
#: default), one of them, or ``0`` (neither: an A/B of the overlap)
_OVERLAP = os.environ.get("FASTDLIGHT_DEPENDENCY_OVERLAP", "prefetch,release").lower()
PREFETCH = _OVERLAP in ("1", "") or "prefetch" in _OVERLAP
RELEASE_EARLY = _OVERLAP in ("1", "") or "release" in _OVERLAP

_PREFETCH_L2 = r"""
__forceinline__ __device__ void fdl_prefetch_l2(const void* base, long long first, long long end) {
  // a hint: the whole 16-byte units of bytes [first, end) of base into L2 (base is 16-aligned)
#if __CUDA_ARCH__ >= 900
  const char* p = static_cast<const char*>(base);
  for (long long a = (first + 15) & ~15LL, b = end & ~15LL; a < b; a += 65536) {
    const unsigned size = (unsigned)(b - a < 65536 ? b - a : 65536);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p + a), "r"(size));
  }
#endif
}
"""


def prefetch_l2(data, first, end):
    """Bytes ``[first, end)`` of buffer ``data`` (its pointer) prefetched into L2 by the calling
    thread (one bulk prefetch per 64 KB; sm_90+, nothing before)."""
    return cuda_func_call("fdl_prefetch_l2", data, T.Cast("int64", first), T.Cast("int64", end),
                          source_code=_PREFETCH_L2)


def prefetch_bytes(ctas: int, wanted: int) -> int:
    """Bytes a CTA of a grid of ``ctas`` prefetches when it wants ``wanted``: within the budget
    (none with prefetches off)."""
    return max(0, min(wanted, PREFETCH_BUDGET // max(1, ctas)) // 16 * 16) if PREFETCH else 0


def dependency_prologue():
    """``with dependency_prologue():`` around a kernel's first statements: they run before it
    waits for the kernel ahead of it (only L2 prefetches; see the module)."""
    return T.attr(tirx.const(0, "int32"), PROLOGUE, tirx.const(1, "int32"))


def release_dependents():
    """``with release_dependents(): T.evaluate(0)``: the next kernel on the stream may be placed
    from here on (see the module; with early releases off, the build pass drops it)."""
    return T.attr(tirx.const(0, "int32"), RELEASE, tirx.const(1, "int32"))
