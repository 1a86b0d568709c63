"""What every schedule template shares: the template interface and small scheduling helpers.

A :class:`ScheduleTemplate` turns one :class:`~fastdlight.config.Config` into a
``tvm.s_tir.Schedule`` for one op family (the analogue of Dlight's ``ScheduleRule``, but the tile
sizes come from the config instead of being hard-coded). The helpers below are meant to be
reused by every template (the matmul ones included):

* :func:`prepare` – normalized schedule + output block + its axes matched to the config.
* :func:`inline_injective` – inline elementwise producers/consumers around the anchor blocks.
* :func:`reverse_compute_inline` – TVM's, refused where it would lose a value another block reads.
* :func:`vector_width` / :func:`legal_vector` – the widest legal vector (<= 128 bit).
* :func:`tile_spatial` – split one spatial loop into grid / serial / thread / vector parts
  (:func:`tile_spatial_axes`: every spatial loop of a block).
* :func:`bind_block_threads` – fuse and bind loops to ``blockIdx.x`` / ``threadIdx.*``.
* :func:`cooperative_fetch` – vectorized copy of a cache block by all threads of a block.
* :func:`ceil_div` / :func:`pad_to` – padding arithmetic.

Non-divisible extents: ``sch.split`` with a factor that does not divide the extent makes TVM
add a ``T.where`` predicate, which is correct but blocks vectorization of any loop appearing
in it. The helpers therefore always peel the vector lane off *exactly* (only widths that
divide the extent) before the predicated split, so the predicate never mentions the lane.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm_ffi
from tvm import DataType, s_tir, tirx
from tvm.ir.expr import Expr as ExprBase
from tvm.s_tir.dlight.analysis.common_analysis import SBlockInfo

from fastdlight.analysis.func_info import Axis, block_axes, output_block
from fastdlight.config import Config
from fastdlight.policies.roller import MAX_VECTOR_BITS, ceil_div, largest_pow2_divisor  # noqa: F401 - re-exported for templates

LoopRV = s_tir.schedule.LoopRV
SBlockRV = s_tir.schedule.SBlockRV

#: CUDA's limit on threads per block
MAX_THREADS = 1024
THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


class ScheduleTemplate:
    """One op family's schedule template.

    Subclasses set ``kinds`` (the ``Config.kind`` values they serve; ``("*",)`` means "any
    kind", used by the fallback) and implement :meth:`apply_config`. ``apply_config`` returns
    ``None`` when the function is not of the template's family or the config does not fit it;
    it may raise on a bug — the dispatcher records that and tries the next template.
    """

    kinds: tuple[str, ...] = ()
    name: str = "template"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kinds={self.kinds})"


# -- analysis --------------------------------------------------------------------------------


def as_tirx_kernel(kernel: tirx.PrimFunc, func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A hand-written TIRx ``kernel`` for ``func``: marked scheduled and free of aliasing (the
    lowering takes it as it is), under ``func``'s global symbol where it has one."""
    attrs = {"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True}
    if func.attrs is not None and "global_symbol" in func.attrs:
        attrs["global_symbol"] = func.attrs["global_symbol"]
    return kernel.with_attrs(attrs)


def pad_to(extent: int, tile: int) -> int:
    """``extent`` rounded up to a multiple of ``tile`` (the work a predicated tiling launches)."""
    return ceil_div(extent, tile) * tile


def dtype_bits(dtype) -> int:
    return DataType(str(dtype)).bits


def root_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The function's root block, or None when it has none (not in block form)."""
    try:
        return sch.get_sblock("root")
    except Exception:  # noqa: BLE001 - TVM raises its own error type for a missing block
        return None


def prepare(func: tirx.PrimFunc):
    """``(sch, blocks, anchor, spatial_axes, reduction_axes)`` for a fresh normalized schedule of
    ``func``; ``anchor`` is the output-defining block (see ``policies.analysis.output_block``).
    Raises ValueError if the function cannot be normalized or has symbolic extents."""
    sch = s_tir.Schedule(func)
    blocks, anchor = output_block(sch)
    spatial, reduce = block_axes(anchor)
    return sch, blocks, anchor, spatial, reduce


def config_fits_axes(config: Config, spatial: Sequence[Axis], reduce: Sequence[Axis] = ()) -> bool:
    """Does the config have one block/thread entry per spatial axis (and one rstep entry per
    reduction axis when it has any)?"""
    if len(config.block) != len(spatial) or len(config.thread) != len(spatial):
        return False
    if config.rstep and len(config.rstep) != len(reduce):
        return False
    return True


def iter_loops(info: SBlockInfo, kind: str) -> list[LoopRV]:
    """The loops of a normalized block's iterators of ``kind`` ("S" or "R"), in iter order."""
    return [it.loop_rv for it in info.iters if it.kind == kind]


def reverse_compute_inline(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """``sch.reverse_compute_inline(block)``, refused (ValueError) when what ``block`` reads from
    its producer is read by another block too. TVM 0.27 inlines it anyway: the producer then
    writes ``block``'s output only, and the other reader (a GELU's or SiLU's second use of its
    input, ``x * f(x)``) reads a buffer nothing writes, which fails at lowering ("used before
    its definition")."""
    target = sch.get(block)
    for producer in sch.get_producers(block):
        if any(not sch.get(other).same_as(target) for other in sch.get_consumers(producer)):
            raise ValueError(f"{sch.get(producer).name_hint}'s output is read by another block than {target.name_hint}")
    sch.reverse_compute_inline(block)


def inline_injective(sch: s_tir.Schedule, blocks: list[SBlockInfo], keep: Sequence[SBlockInfo] = ()):
    """Inline every injective block that can be inlined (into its consumers, else into its
    producer), never the blocks in ``keep``. Returns the names of the blocks left, in order."""
    keep_names = {sch.get(b.block_rv).name_hint for b in keep}
    changed = True
    while changed:
        changed = False
        for info in list(blocks):
            name = sch.get(info.block_rv).name_hint
            if name in keep_names or not info.is_injective():
                continue
            for inline in (sch.compute_inline, lambda b: reverse_compute_inline(sch, b)):
                try:
                    inline(info.block_rv)
                except Exception:  # noqa: BLE001 - TVM raises ScheduleError when illegal
                    continue
                blocks.remove(info)
                changed = True
                break
            if changed:
                break
    return [sch.get(b.block_rv).name_hint for b in blocks]


def dominant_read_is_contiguous_in(sch: s_tir.Schedule, info: SBlockInfo, kind: str) -> bool:
    """True when the innermost index of the block's largest read is driven by an iterator of
    ``kind`` ("R": inner reduction, e.g. row sum; "S": outer reduction, e.g. column sum)."""
    block = sch.get(info.block_rv)
    kinds = {it.var: it.kind for it in info.iters}
    # Buffer vars of the block iterators, by name (the index expressions use block iter vars).
    iter_var_kind = {iv.var: kinds.get(iv.var, "S") for iv in block.iter_vars}
    best, best_size = None, -1
    for region in block.reads:
        size = math.prod(int(r.extent) if isinstance(r.extent, tirx.IntImm) else 1 << 30 for r in region.region)
        if size > best_size:
            best, best_size = region, size
    if best is None or not best.region:
        return False
    last = best.region[-1].min
    used = []
    tvm_ffi.structural_walk(last, (tirx.Var, used.append), order="post")
    return any(iter_var_kind.get(v) == kind for v in used)


def buffers_indexed_innermost_by(block: tirx.SBlock, var: tirx.Var) -> list[tirx.Buffer]:
    """Buffers of ``block`` whose innermost index is exactly the iterator ``var`` (unit-stride
    runs along it: the ones a vector lane on ``var`` turns into vector loads/stores)."""
    out = []
    for region in list(block.reads) + list(block.writes):
        if region.region and region.region[-1].min.same_as(var):
            if not any(b.same_as(region.source) for b in out):
                out.append(region.source)
    return out


# -- vector widths ---------------------------------------------------------------------------


def expr_bits(block: tirx.SBlock) -> int:
    """Widest scalar dtype (bits) computed anywhere in ``block``'s body. TVM's CUDA codegen
    cannot express vectors wider than 128 bit (e.g. a ``float32x8`` broadcast becomes an
    invalid ``make_ulonglong4`` call), so a vectorized loop must keep every value <= 128 bit."""
    bits = [8]

    def visit(node):
        dtype = getattr(node, "dtype", None)
        if dtype is not None and isinstance(node, ExprBase):
            try:
                bits.append(DataType(str(dtype)).bits)
            except Exception:  # noqa: BLE001 - handles, void: not a vector lane type
                pass

    tvm_ffi.structural_walk(block.body, visit, order="post")
    return max(bits)


def vector_width(
    config: Config, buffers: Sequence[tirx.Buffer], per_thread: int, extent: int, block: tirx.SBlock | None = None
) -> int:
    """Widest vector (elements) for a per-thread run of ``per_thread`` contiguous elements of an
    axis of ``extent`` that indexes ``buffers`` innermost: capped at 128 bit for the widest dtype
    (of those buffers and, if ``block`` is given, of every value the block computes), at the
    config's ``vectorize`` entries for these buffers (when the policy gave any), and a power of
    two dividing both ``per_thread`` and ``extent`` (so no predicate touches the lane). Never a
    vector where the block reads or writes bool: TVM 0.27's CUDA codegen stores two bools as a
    ``ushort2`` (4 bytes at a 2-byte aligned address: misaligned, and past the two elements)."""
    touched = list(buffers) + ([r.source for r in (*block.reads, *block.writes)] if block is not None else [])
    if any(str(b.dtype) == "bool" for b in touched):
        return 1
    bits = max((dtype_bits(b.dtype) for b in buffers), default=16)
    if block is not None:
        bits = max(bits, expr_bits(block))
    cap = max(1, MAX_VECTOR_BITS // bits)
    given = [config.vector_width(b.name, 0) for b in buffers]
    given = [g for g in given if g > 0]
    if given:
        cap = min(cap, min(given))
    return legal_vector(per_thread, extent, cap)


def legal_vector(per_thread: int, extent: int, cap: int) -> int:
    """Largest power of two <= cap dividing both the per-thread run and the axis extent."""
    return largest_pow2_divisor(math.gcd(per_thread, extent), cap)


# -- loop tiling and binding -----------------------------------------------------------------


def tile_spatial(
    sch: s_tir.Schedule, loop: LoopRV, extent: int, block: int, thread: int, vec: int = 1, interleave: bool = True
):
    """Split a spatial loop of ``extent`` for a block tile of ``block`` elements where each thread
    owns ``thread`` elements, the innermost ``vec`` of them contiguous (a vector):
    returns ``(grid, serial, threads, lane)`` loops with extents
    ``(ceil(extent / block), thread / vec, block / thread, vec)``.

    ``interleave=True``: a thread's ``thread / vec`` vectors are strided by
    ``block / thread * vec`` so every warp-wide access is coalesced (elementwise, loads).
    ``interleave=False``: a thread's elements are contiguous (index = thread * ``thread`` +
    serial), which keeps per-thread register buffers (rfactor partials) compact.
    ``vec`` must divide ``extent`` and ``thread``; tails are predicated by TVM."""
    assert extent % vec == 0 and thread % vec == 0 and block % thread == 0
    outer, lane = sch.split(loop, [None, vec], preserve_unit_iters=True)
    if interleave:
        grid, serial, threads = sch.split(outer, [None, thread // vec, block // thread], preserve_unit_iters=True)
    else:
        grid, threads, serial = sch.split(outer, [None, block // thread, thread // vec], preserve_unit_iters=True)
    return grid, serial, threads, lane


def tile_spatial_axes(sch: s_tir.Schedule, loops: Sequence[LoopRV], spatial: Sequence[Axis], config: Config,
                      vec_last: int = 1, interleave: bool = True):
    """:func:`tile_spatial` over each of ``loops`` (``spatial`` axes, the config's ``block`` and
    ``thread``; a vector of ``vec_last`` on the last one): ``(grids, serials, threads, lanes)``,
    one loop per axis in each. The lanes of the other axes are unit loops, but they exist: a
    caller's ``reorder`` must place them too, or one can stay between loops it then fuses."""
    grids, serials, threads, lanes = [], [], [], []
    for i, (loop, axis) in enumerate(zip(loops, spatial)):
        v = vec_last if i == len(spatial) - 1 else 1
        g, s, t, lane = tile_spatial(sch, loop, axis.extent, config.block[i], config.thread[i], v, interleave)
        grids.append(g)
        serials.append(s)
        threads.append(t)
        lanes.append(lane)
    return grids, serials, threads, lanes


def bind_block_threads(sch: s_tir.Schedule, grid_loops: Sequence[LoopRV], thread_loops: Sequence[LoopRV] = ()):
    """Fuse ``grid_loops`` into ``blockIdx.x`` and bind ``thread_loops`` (outermost first; each
    one a fused group) to ``threadIdx.z/y/x`` so the last one is ``threadIdx.x``. Returns the
    bound loops ``(bx, [threads...])``."""
    bx = sch.fuse(*grid_loops) if len(grid_loops) > 1 else grid_loops[0]
    sch.bind(bx, "blockIdx.x")
    bound = []
    for loop, tag in zip(thread_loops, reversed(THREAD_TAGS[: len(thread_loops)])):
        sch.bind(loop, tag)
        bound.append(loop)
    return bx, bound


def unroll(sch: s_tir.Schedule, loop: LoopRV, max_step: int = 256) -> None:
    """Ask TVM to fully unroll small loops below ``loop`` (explicit unrolling, as Dlight does)."""
    sch.annotate(loop, "pragma_auto_unroll_max_step", max_step)
    sch.annotate(loop, "pragma_unroll_explicit", 1)


def cooperative_fetch(
    sch: s_tir.Schedule, block: SBlockRV, num_threads: int | Sequence[int], vec: int = 1, inner_loops: int | None = None
) -> int:
    """Make all threads of a thread block copy the region of cache block ``block`` (from
    ``cache_read``, already ``compute_at`` its place): fuse its innermost loops (all of them
    that ``compute_at`` created, or the last ``inner_loops``), split them as
    ``[serial, *threads, vec]``, bind the thread parts (``num_threads`` = one extent, or one
    per ``threadIdx.z/y/x`` level, outermost first) and vectorize the lane.

    ``vec`` is reduced to the largest power of two dividing the innermost extent of the copied
    region (so the lane never needs a predicate); the copy itself may be predicated when the
    thread count does not divide the region. Returns the vector width actually used."""
    loops = sch.get_loops(block)
    if inner_loops is None:
        inner_loops = _loops_private_to(sch, block)
    loops = loops[-inner_loops:]
    innermost = int(sch.get(loops[-1]).extent)
    vec = largest_pow2_divisor(innermost, vec)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    threads = [num_threads] if isinstance(num_threads, int) else list(num_threads)
    parts = sch.split(fused, [None, *threads, vec], preserve_unit_iters=True)
    for loop, tag in zip(parts[1:-1], reversed(THREAD_TAGS[: len(threads)])):
        sch.bind(loop, tag)
    if vec > 1:
        sch.vectorize(parts[-1])
    return vec


def _loops_private_to(sch: s_tir.Schedule, block: SBlockRV) -> int:
    """How many of the innermost loops above ``block`` contain nothing but ``block``."""
    count = 0
    for loop in reversed(sch.get_loops(block)):
        if len(sch.get_child_blocks(loop)) != 1:
            break
        if sch.get(loop).thread_binding is not None:
            break
        count += 1
    return max(count, 1)


class ScheduleError(RuntimeError):
    """No template could schedule the function with the config; ``failures`` holds
    ``(template name, reason)`` per template tried."""

    def __init__(self, message: str, failures: list[tuple[str, str]] | None = None):
        self.failures = list(failures or [])
        lines = [message] + [f"  - {name}: {reason}" for name, reason in self.failures]
        super().__init__("\n".join(lines))


def error_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    # TVM errors put the useful line last (after the IR dump); keep it short either way.
    msg = next((ln for ln in reversed(text) if ln.strip()), type(e).__name__) if text else ""
    return msg[:300]


def func_name(func) -> str:
    try:
        return str(func.attrs["global_symbol"])
    except Exception:  # noqa: BLE001
        return "<PrimFunc>"
