"""Elementwise / broadcast template (``kind == "elementwise"``).

Everything injective is inlined into the output block; each spatial axis ``i`` is tiled as
``[grid, serial, threads, lane]`` (see :func:`base.tile_spatial`): a block covers
``block[i]`` elements, a thread ``thread[i]``, and the innermost axis' per-thread run is split
into 128-bit vectors. Loop order ``grid* | serial* | threads* | lane`` makes consecutive
threads touch consecutive vectors (coalesced) while a thread's extra vectors sit a whole
block-row apart. Tails (extents the tile does not divide) are predicated by TVM; the vector
lane is peeled off exactly first, so a tail never disables vectorization of the others.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import (
    MAX_THREADS,
    ScheduleTemplate,
    bind_block_threads,
    buffers_indexed_innermost_by,
    config_fits_axes,
    inline_injective,
    iter_loops,
    prepare,
    tile_spatial_axes,
    unroll,
    vector_width,
)


class ElementwiseTemplate(ScheduleTemplate):
    kinds = ("elementwise",)
    name = "elementwise"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        sch, blocks, anchor, spatial, reduce = prepare(func)
        if reduce or not config_fits_axes(config, spatial):
            return None
        if math.prod(config.threads_per_axis) > MAX_THREADS:
            return None
        inline_injective(sch, blocks, keep=[anchor])
        if len(blocks) != 1:
            return None  # something non-injective is left: not this family
        block = sch.get(anchor.block_rv)
        loops = iter_loops(anchor, "S")
        # The innermost axis carries the vector lane; it indexes every buffer innermost when the
        # op is a plain elementwise/broadcast, which is what vector_width checks against.
        inner = buffers_indexed_innermost_by(block, anchor.iters[-1].var)
        inner = inner or [w.source for w in block.writes]
        vec = vector_width(config, inner, config.thread[-1], spatial[-1].extent, block)

        grids, serials, threads, lanes = tile_spatial_axes(sch, loops, spatial, config, vec)
        *units, lane = lanes
        sch.reorder(*grids, *units, *serials, *threads, lane)
        thread_loop = sch.fuse(*threads) if len(threads) > 1 else threads[0]
        bind_block_threads(sch, grids, [thread_loop])
        if vec > 1:
            sch.vectorize(lane)
        if math.prod(config.thread) > 1:
            unroll(sch, serials[0] if serials else thread_loop)
        return sch

