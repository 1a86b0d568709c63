"""GEMV / low-batch GEMM template (``kind == "gemv"``): ``Y[m, n] = sum_k X[m, k] * W[n, k]``
with ``m <= 16`` (``m == 1`` is normalized away: the axes are then just ``(n,)``).

It is the inner-reduction layout of :mod:`.reduction` applied to a two-input reduction:
a block owns ``block`` outputs (all ``m`` rows times a strip of ``n``), ``reduce_thread``
threads (``threadIdx.x``) split ``k``, and per loop step every thread loads 128-bit vectors of
each W row it owns and of each X row into registers, then does the ``m × n × vec``
multiply-adds from registers. Partial sums are combined across ``threadIdx.x`` (warp shuffles).
The accumulation dtype is the op's: for float32 accumulation define the op as a float32
reduction followed by a cast; the cast epilogue is fused into the same kernel. An epilogue over
other elements than the product's (LLaMA's gate and up projections as one GEMM, the product
reading two columns for each of its outputs) runs as a kernel of its own after the GEMV.
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
        apart = []
        if epilogue is False:
            # an epilogue over other elements than the product's (a gated pair reads two columns
            # of it for each of its own): the product goes to global memory and each epilogue
            # block runs as a kernel of its own after it
            apart = [b for b in blocks if not b.block_rv.same_as(anchor.block_rv)]
            if not blocks[0].block_rv.same_as(anchor.block_rv) or not all(b.is_injective() for b in apart):
                return None
            epilogue = None
        if not config_fits_axes(config, spatial, reduce):
            return None
        if math.prod(config.threads_per_axis) * math.prod(config.reduce_thread or (1,)) > MAX_THREADS:
            return None
        stmt = sch.get(anchor.block_rv)
        if stmt.init is None or len(stmt.reads) < 2 or not _is_gemv(stmt, anchor, spatial):
            return None
        if dominant_read_is_contiguous_in(sch, anchor, "R"):
            schedule_inner_reduction(sch, anchor, spatial, reduce, config, epilogue)
        else:
            schedule_outer_reduction(sch, anchor, spatial, reduce, config, epilogue)
        for info in apart:
            _schedule_elementwise_kernel(sch, info.block_rv)
        return sch


#: threads a block of an epilogue that runs as a kernel of its own
EPILOGUE_THREADS = 256


def _schedule_elementwise_kernel(sch: s_tir.Schedule, block) -> None:
    """``block`` (injective) as one kernel: its loops fused, ``EPILOGUE_THREADS`` a CTA."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, EPILOGUE_THREADS], preserve_unit_iters=True)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _is_gemv(stmt: tirx.SBlock, anchor, spatial) -> bool:
    """Two inputs, both indexed by k; the batch axis (if any) is small and the other input
    (the weight) does not depend on it."""
    if len(spatial) == 2 and spatial[0].extent > MAX_BATCH:
        return False
    inputs = [r for r in stmt.reads if not r.source.same_as(stmt.writes[0].source)]
    return len({r.source.name for r in inputs}) == 2
