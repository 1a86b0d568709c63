"""PrimFunc analysis shared by policies and schedule templates.

SEED VERSION: the policies work extends this module (footprints, op-family classification);
``output_block`` and ``Axis`` keep their meaning because templates rely on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.analysis.common_analysis import SBlockInfo


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    kind: str  # "S" spatial or "R" reduction


def static_extent(dom, what: str) -> int:
    if not isinstance(dom, (int, tirx.IntImm)):
        raise ValueError(f"{what} has symbolic extent {dom}; specialize it first (opt_shapes)")
    return int(dom)


def output_block(sch: s_tir.Schedule) -> tuple[list[SBlockInfo], SBlockInfo]:
    """All normalized blocks, and the one that defines the output tile: the last reduction block
    if any, else the last block. Raises ValueError when the function is not in normal form."""
    blocks = normalize_prim_func(sch)
    if not blocks:
        raise ValueError("PrimFunc cannot be normalized (opaque blocks or non-affine loops?)")
    reductions = [b for b in blocks if b.is_reduction()]
    return blocks, (reductions[-1] if reductions else blocks[-1])


def block_axes(info: SBlockInfo) -> tuple[list[Axis], list[Axis]]:
    """(spatial axes, reduction axes) of a block in iter-var order — the axes a Config indexes."""
    spatial, reduce = [], []
    for it in info.iters:
        if it.kind not in ("S", "R"):
            raise ValueError(f"block {info.name} has an iterator of unsupported kind {it.kind}")
        axis = Axis(str(it.var.name), static_extent(it.dom, f"axis {it.var.name} of {info.name}"), it.kind)
        (spatial if it.kind == "S" else reduce).append(axis)
    return spatial, reduce
