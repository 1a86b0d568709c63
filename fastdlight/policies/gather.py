"""Thread tiles for gathers: elementwise functions whose reads index through divisions of the
output's innermost axis (an im2col: ``columns[k, pixel]`` reads the image at ``pixel // (P*Q)``,
``pixel % Q * stride + k // (S*C)``...).

The elementwise planner gives a thread a run along the innermost axis only, so every element
pays the index arithmetic of its pixel. A thread that also covers a run of the outer axis
computes its pixels' part once for the whole run: on ResNet-18's stem gather
(``[147, 200704]`` fp16, H100) a run of 21 taps by 2 pixels took 0.038 ms against 0.077 for the
planner's best (H100 80GB HBM3, 2026-11-26).
"""

from __future__ import annotations

from fastdlight.analysis.func_info import FuncInfo
from fastdlight.config import Config

#: the longest run of the outer axis one thread covers (its body is unrolled over the run)
MAX_OUTER_RUN = 24
#: (elements of the innermost axis per thread, threads per block), best measured first; the
#: last serves innermost extents that 2 does not divide
SHAPES = ((2, 128), (2, 256), (4, 256), (4, 128), (1, 256))
#: store vector: the gathered 16-bit values are packed in pairs
VECTOR = 2


def is_gather(info: FuncInfo) -> bool:
    """A 2-D elementwise function with a parameter read whose indices are not affine in the
    output's innermost axis."""
    if info.kind != "elementwise" or len(info.spatial_axes) != 2:
        return False
    inner = info.spatial_iters[-1]
    return any(a.is_param and a.linear is None and a.depends_on(inner) for a in info.reads)


def gather_configs(info: FuncInfo, arch, limit: int) -> list[Config]:
    """Up to ``limit`` configs with a thread tile along both axes; none when ``info`` is no
    gather or its outer extent has no divisor in ``2..MAX_OUTER_RUN``."""
    if limit <= 0 or not is_gather(info):
        return []
    outer, inner = (a.extent for a in info.spatial_axes)
    run = max((d for d in range(2, MAX_OUTER_RUN + 1) if outer % d == 0), default=None)
    if run is None:
        return []
    configs = []
    for per_thread, threads in SHAPES:
        if inner % per_thread or threads > arch.max_threads_per_block:
            continue
        configs.append(Config("elementwise", block=(run, min(threads * per_thread, inner)), thread=(run, per_thread),
                              vectorize=((info.write.name, min(VECTOR, per_thread)),)))
    return configs[:limit]
