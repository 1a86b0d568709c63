"""Matmul operands read through a view of a larger tensor (attention's Q, K and V as slices of
the QKV projection's output, see :mod:`fastdlight.relax.views`), as TMA boxes.

A TMA tensor map takes any strides, so an operand need not be a ``[batch?, rows, K]`` tensor:
the row and the reduction iterator may each run along one axis of the tensor it reads,
advancing with it through every block of 256 (or 128, 64: tiles no taller) rows or 64-wide K step, with outer parts constant
over such a block (``i // 512`` beside ``i % 512``, ``k // 128`` beside ``k % 128``); the batch
iterator may be in any expression (``b // 16``, ``b % 16``), and constants anywhere. The box
then spans the row axis and the K axis; every other coordinate is its index at the tile's
(batch, first row, first K).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import ir, sym, tirx

from fastdlight.analysis.prepare import scalar_dtype

#: the K step of a stage (one 128-byte swizzled row of 16-bit elements)
BK = 64
#: blocks of rows a view's rows may run through along one axis (the largest found bounds the
#: tiles: a tile of 64, 128 or 256 rows then lies in one block)
ROW_BLOCKS = (256, 128, 64)
#: TMA tensor maps have at most five dimensions
TMA_MAX_RANK = 5


@dataclass(frozen=True)
class OperandView:
    """An operand's tensor as TMA sees it: its dims innermost first, each one's index as an
    expression of the block's iterators (``batch``, ``row``, ``k``), which axis the box's rows
    and which its K step span, and whether K is the innermost (contiguous) axis."""

    dims: tuple[int, ...]
    index: tuple  # tirx.PrimExpr per dim, innermost first
    batch: object  # tirx.Var or None (an operand shared by every batch)
    row: object  # tirx.Var
    k: object  # tirx.Var
    row_axis: int
    k_axis: int
    row_block: int = ROW_BLOCKS[0]  # rows run along row_axis through blocks of this many

    def fits(self, rows: int, extent: int) -> bool:
        """Whether tiles of ``rows`` rows lie in one block: they divide it (or the rows past the
        first block are past the operand's ``extent``, which only make outputs the store clips)."""
        return self.row_block % rows == 0 or extent <= self.row_block

    @property
    def k_major(self) -> bool:
        return self.k_axis == 0

    def coords(self, b, row0, k0) -> list:
        """Each axis's coordinate of the box at batch ``b``, first row ``row0``, first K ``k0``
        (int32 expressions, innermost first)."""
        binding = [(self.row, row0), (self.k, k0)] + ([(self.batch, b)] if self.batch is not None else [])
        out = []
        for e in self.index:
            out.append(as_dtype("int32", substitute(e, [(v, as_dtype(scalar_dtype(v), x)) for v, x in binding])))
        return out


def view_operand(source, indices, row, k, batch, extents: dict, elem_bytes: int) -> tuple[OperandView | None, str]:
    """The view of an operand load ``source[indices]`` whose rows are iterator ``row``, its
    reduction ``k``, its batch ``batch`` (or None), the iterators' extents in ``extents``
    (``[(var, extent)]``); or ``(None, reason)``."""
    if not all(isinstance(x, tirx.IntImm) for x in source.shape):
        return None, "an operand of symbolic shape read through a view"
    dims = tuple(int(x) for x in reversed(list(source.shape)))
    index = tuple(reversed(list(indices)))
    if len(dims) > TMA_MAX_RANK:
        return None, f"an operand of {len(dims)} dims (TMA: at most {TMA_MAX_RANK})"
    allowed = [v for v in (row, k, batch) if v is not None]
    if any(not any(u.same_as(v) for v in allowed) for e in index for u in _vars(e)):
        return None, "an operand index uses an iterator that is not its batch, row or K"
    row_extent = next(x for v, x in extents if v.same_as(row))
    k_extent = next(x for v, x in extents if v.same_as(k))
    row_block = next((step for step in ROW_BLOCKS if _box_axis(index, row, row_extent, step) is not None), None)
    if row_block is None:
        return None, "an operand's rows do not run along one axis through blocks of 64"
    k_axis = _box_axis(index, k, k_extent, BK)
    if k_axis is None:
        return None, f"an operand's K does not run along one axis through steps of {BK}"
    if k_extent % BK and not (isinstance(index[k_axis], tirx.Var) and dims[k_axis] == k_extent):
        # a partial last step reads past K: zeros only where the axis ends there (rows read
        # past the end only make outputs the store clips)
        return None, f"an operand's K axis runs past {k_extent} in a partial step"
    axes = {"rows": _box_axis(index, row, row_extent, row_block), "K": k_axis}
    view = OperandView(dims, index, batch, row, k, axes["rows"], axes["K"], row_block)
    if view.row_axis == view.k_axis:
        return None, "an operand's rows and K run along one axis"
    if 0 not in (view.row_axis, view.k_axis):
        return None, "neither an operand's rows nor its K is its contiguous axis"
    if dims[0] * elem_bytes % 16:
        return None, f"an operand's rows are {dims[0] * elem_bytes} bytes: TMA needs multiples of 16"
    return view, ""


def _box_axis(index, var, extent: int, step: int) -> int | None:
    """The one axis along which ``var`` runs through each ``step``-wide block of it, the others
    constant over the block; None where there is no such axis."""
    moving = []
    for axis, e in enumerate(index):
        if any(u.same_as(var) for u in _vars(e)):
            advances = _advances(e, var, extent, step)
            if advances is None:
                return None
            if advances:
                moving.append(axis)
    return moving[0] if len(moving) == 1 else None


def _advances(e, var, extent: int, step: int):
    """True when ``e`` advances by one with ``var`` through each ``step``-wide block of it,
    False when it is constant over each block, None otherwise."""
    dtype = scalar_dtype(var)
    q, t = tirx.Var("q", dtype), tirx.Var("t", dtype)
    ana = sym.Analyzer()
    ana.bind(q, ir.Range.from_min_extent(tirx.const(0, dtype), tirx.const(max(-(-extent // step), 1), dtype)))
    ana.bind(t, ir.Range.from_min_extent(tirx.const(0, dtype), tirx.const(step, dtype)))
    diff = ana.simplify(substitute(e, [(var, q * step + t)]) - substitute(e, [(var, q * step)]))
    if isinstance(diff, tirx.IntImm) and diff.value == 0:
        return False
    if isinstance(diff, tirx.Var) and diff.same_as(t):
        return True
    return None


def _vars(e) -> list:
    found = []
    tvm_ffi.structural_walk(e, (tirx.Var, found.append), order="pre")
    return found


def as_dtype(dtype: str, expr):
    """``expr`` as ``dtype`` (a cast only where it is another)."""
    return expr if scalar_dtype(expr) == dtype else tirx.Cast(dtype, expr)


def substitute(expr, binding):
    """``expr`` with each variable of ``binding`` (``[(var, value)]``) replaced."""
    def var(v):
        for key, value in binding:
            if v.same_as(key):
                return value
        return v

    return tvm_ffi.structural_map(expr, [(tirx.Var, var)])
