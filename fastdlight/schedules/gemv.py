"""GEMV / low-batch GEMM template (``kind == "gemv"``): ``Y[m, n] = sum_k X[m, k] * W[n, k]``
with ``m <= 16`` (``m == 1`` is normalized away: the axes are then just ``(n,)``).

It is the inner-reduction layout of :mod:`.reduction` applied to a two-input reduction:
a block owns ``block`` outputs (all ``m`` rows times a strip of ``n``), ``reduce_thread``
threads (``threadIdx.x``) split ``k``, and per loop step every thread loads 128-bit vectors of
each W row it owns and of each X row into registers, then does the ``m × n × vec``
multiply-adds from registers. Partial sums are combined across ``threadIdx.x`` (warp shuffles).
The accumulation dtype is the op's: for float32 accumulation define the op as a float32
reduction followed by a cast; the cast epilogue is fused into the same kernel.
A weight layout ``W[k, n]`` (``n`` contiguous) takes the outer-reduction layout instead.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import (
    MAX_THREADS,
    ScheduleTemplate,
    config_fits_axes,
    dominant_read_is_contiguous_in,
    inline_injective,
    prepare,
)
from fastdlight.schedules.reduction import output_epilogue, schedule_inner_reduction, schedule_outer_reduction

#: largest batch handled as "low batch"; beyond it a matmul template is the right tool
MAX_BATCH = 16


class GemvTemplate(ScheduleTemplate):
    kinds = ("gemv",)
    name = "gemv"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        sch, blocks, anchor, spatial, reduce = prepare(func)
        if len(reduce) != 1 or len(spatial) not in (1, 2):
            return None
        inline_injective(sch, blocks, keep=[anchor])
        epilogue = output_epilogue(sch, blocks, anchor, spatial)  # e.g. float32 acc -> fp16
        if epilogue is False:
            return None
        if not config_fits_axes(config, spatial, reduce):
            return None
        if math.prod(config.threads_per_axis) * math.prod(config.reduce_thread or (1,)) > MAX_THREADS:
            return None
        stmt = sch.get(anchor.block_rv)
        if stmt.init is None or len(stmt.reads) < 2 or not _is_gemv(stmt, anchor, spatial):
            return None
        if dominant_read_is_contiguous_in(sch, anchor, "R"):
            return schedule_inner_reduction(sch, anchor, spatial, reduce, config, epilogue)
        return schedule_outer_reduction(sch, anchor, spatial, reduce, config, epilogue)


def _is_gemv(stmt: tirx.SBlock, anchor, spatial) -> bool:
    """Two inputs, both indexed by k; the batch axis (if any) is small and the other input
    (the weight) does not depend on it."""
    if len(spatial) == 2 and spatial[0].extent > MAX_BATCH:
        return False
    inputs = [r for r in stmt.reads if not r.source.same_as(stmt.writes[0].source)]
    return len({r.source.name for r in inputs}) == 2
