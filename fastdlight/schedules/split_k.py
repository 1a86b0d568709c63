"""Split-K for the tensor-core matmul template: more thread blocks where the output tiles are
too few to fill the GPU (decode GEMMs with M = 16, the deep ResNet convolutions: 784 x 512
outputs over K = 4608).

The reduction axis that is contiguous in memory (a GEMM's K, a convolution's input channels)
is cut into ``splits`` slices by ``rfactor``: the matmul becomes a batched one over the slices,
writing partial sums ``C_rf[split, ...]`` in the accumulator's type (the template schedules that block as usual,
the slice being one more batch axis), and a second kernel adds the slices and applies the
function's epilogue (bias, activation, cast) per output element. fp32 partials cost
``(splits + 1) * M * N * 4`` bytes of traffic, mostly in L2.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from fastdlight.analysis.matmul_match import MatmulMatch, block_realize, split_axis
from fastdlight.schedules.base import root_block

#: threads per block of the kernel that adds the partial sums
SUM_THREADS = 128
#: output elements per thread in that kernel (one 128-bit fp32 vector)
SUM_VECTOR = 4


def split_reduction(func: tirx.PrimFunc, match: MatmulMatch, splits: int) -> tuple[tirx.PrimFunc, MatmulMatch]:
    """``func`` with its matmul block cut into ``splits`` K slices (see the module docstring):
    the partial-sum block, named ``<block>_rf``, is left for the template; the kernel that adds
    the slices and runs the epilogue is scheduled by :func:`schedule_partial_sum` once the
    template is done (its ``reindex`` needs a root scope of plain loop nests). Returns the new
    function and the match that describes the partial-sum block."""
    axis = split_axis(func, match.block)
    if axis is None or axis[1] % splits:
        raise ValueError(f"split-K {splits} does not divide the reduction axis {axis}")
    sch = s_tir.Schedule(func)
    main = sch.get_sblock(match.block)
    realize = block_realize(sch.mod["main"], match.block)
    loops = sch.get_loops(main)
    loop_of = {str(sch.get(lp).loop_var.name): lp for lp in loops}
    bound = [
        loop_of[str(value.name)]
        for iv, value in zip(realize.block.iter_vars, realize.iter_values)
        if iv.iter_type == tirx.IterVar.CommReduce and isinstance(value, tirx.Var) and str(value.name) in loop_of
    ]
    if len(bound) != sum(iv.iter_type == tirx.IterVar.CommReduce for iv in realize.block.iter_vars):
        raise ValueError("split-K needs every reduction iterator bound to a loop of its own")
    outer, inner = sch.split(bound[-1], [splits, None])
    sch.reorder(outer, *bound[:-1], inner)  # the slice first; the contiguous axis stays innermost
    partial = sch.rfactor(outer, factor_axis=0)
    rf_loops = sch.get_loops(partial)
    slice_at = [str(sch.get(lp).loop_var.name) for lp in rf_loops].index(str(sch.get(outer).loop_var.name))
    sch.reorder(rf_loops[slice_at], *rf_loops[:slice_at])  # the slice is the outermost (batch) loop
    rf_name = str(sch.get(partial).name_hint)
    return sch.mod["main"], dataclasses.replace(
        match, block=rf_name, batch=match.batch * splits, k=match.k // splits, num_epilogue=0
    )


def schedule_partial_sum(sch: s_tir.Schedule, block_name: str) -> None:
    """The second kernel: one thread adds the slices of ``SUM_VECTOR`` neighbouring outputs
    and applies the epilogue to them, which is inlined into one block computed right there."""
    total, root = sch.get_sblock(block_name), root_block(sch)
    if root is None:
        raise ValueError("split-K needs a function in block form")
    after = _blocks_after(sch, total, root)
    for block in after[:-1]:  # cast -> add bias -> gelu: one block, no intermediate buffers
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 - a block that cannot be inlined keeps its buffer
            pass
    after = _blocks_after(sch, total, root)
    *spatial, slices = sch.get_loops(total)
    vec = SUM_VECTOR if int(sch.get(spatial[-1]).extent) % SUM_VECTOR == 0 else 1
    # the vector lane is split off the innermost axis before fusing, so each thread's outputs
    # are one exact region (a lane inside the fused index would blur it to a bounding box)
    outer, lane = sch.split(spatial[-1], [None, vec])
    bx, tx = sch.split(sch.fuse(*spatial[:-1], outer), [None, SUM_THREADS])
    sch.reorder(slices, lane)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    for block in after:
        sch.reverse_compute_at(block, tx, preserve_unit_loops=True)
        if vec > 1:
            sch.vectorize(sch.get_loops(block)[-1])
    if after:  # the sum stays in registers
        sch.set_scope(total, 0, "local")
    if vec > 1:
        sch.vectorize(lane)


def _blocks_after(sch, block, root) -> list:
    children = sch.get_child_blocks(root)
    names = [str(sch.get(b).name_hint) for b in children]
    here = names.index(str(sch.get(block).name_hint))
    return children[here + 1 :]

