"""Transpose template (``kind == "transpose"``): a layout change staged through shared memory.

See :mod:`fastdlight.policies.transpose` for when it applies and what a config holds. Everything
injective is inlined into the output block; the output is tiled (``block``), one thread block
per tile. The transposed input's part of the tile is copied into shared memory by all threads,
consecutive threads on consecutive elements of the input's innermost axis (``cache_read`` +
``compute_at`` + :func:`base.cooperative_fetch`); the stride of the dimension the output walks
is padded by one 32-bit word past a multiple of 128 bytes, so that reading along it hits 32
different banks. Then each thread writes ``thread[-1]`` elements along
the output's innermost axis, in vectors, consecutive threads on consecutive vectors.
"""

from __future__ import annotations

from tvm import DataType, s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import (
    MAX_THREADS,
    ScheduleTemplate,
    cooperative_fetch,
    inline_injective,
    iter_loops,
    prepare,
)

#: the stride the output walks in shared memory: a multiple of 128 bytes plus this many
PAD_BYTES = 4


class TransposeTemplate(ScheduleTemplate):
    kinds = ("transpose",)
    name = "transpose"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        sch, blocks, anchor, spatial, reduce = prepare(func)
        if reduce or len(config.block) != len(spatial) or len(config.thread) != len(spatial):
            return None
        threads = config.num_threads
        if threads > MAX_THREADS or threads % 32:
            return None
        inline_injective(sch, blocks, keep=[anchor])
        if len(blocks) != 1:
            return None
        block = sch.get(anchor.block_rv)
        source = next((i for i, r in enumerate(block.reads) if str(r.source.name) in dict(config.vectorize)
                       and not r.source.same_as(block.writes[0].source)), None)
        if source is None:
            return None
        src_buffer = block.reads[source].source
        column = _dim_moved_by(block.reads[source], anchor.iters[-1].var)
        if column is None or column == len(src_buffer.shape) - 1:
            return None
        outer, inner = [], []
        for loop, axis, tile in zip(iter_loops(anchor, "S"), spatial, config.block):
            o, i = sch.split(loop, [None, min(tile, axis.extent)], preserve_unit_iters=True)
            outer.append(o)
            inner.append(i)
        sch.reorder(*outer, *inner)
        grid = sch.fuse(*outer)
        sch.bind(grid, "blockIdx.x")

        cache = sch.cache_read(anchor.block_rv, source, "shared")
        sch.compute_at(cache, grid, preserve_unit_loops=True)
        bits = DataType(str(src_buffer.dtype)).bits
        row = 128 * 8 // bits  # elements of a 128-byte row
        sch.storage_align(cache, 0, axis=column, factor=row, offset=PAD_BYTES * 8 // bits)
        cooperative_fetch(sch, cache, threads, config.vector_width(str(src_buffer.name)))

        vec = config.vector_width(str(block.writes[0].source.name))
        fused = sch.fuse(*inner)
        parts = sch.split(fused, [None, threads, vec], preserve_unit_iters=True)
        sch.bind(parts[1], "threadIdx.x")
        if vec > 1:
            sch.vectorize(parts[2])
        return sch


def _dim_moved_by(region, var: tirx.Var) -> int | None:
    """The one dimension of the read ``region`` whose index uses ``var`` (the output's innermost
    iterator): the shared tile's column, whose stride the padding staggers."""
    dims = [d for d, r in enumerate(region.region)
            if any(v.same_as(var) for v in tirx.analysis.undefined_vars(r.min))]
    return dims[0] if len(dims) == 1 else None
