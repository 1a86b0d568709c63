"""PrimFunc analysis shared by policies and schedule templates.

``analyze(func, opt_shapes)`` turns a TIR PrimFunc into a :class:`FuncInfo`: its normalized
blocks, the output-defining block (last reduction block, else last block) with its spatial and
reduction axes, the buffers it reads (after inlining injective producers such as conv padding,
so footprints are over real inputs), and the op family (``kind``). ``FuncInfo.footprint`` gives
the region of every input one thread block touches for a tile, from closed-form affine bounds
derived once per access by TVM's linear-equation detection (``tvm.sym``); non-affine accesses
fall back to ``Analyzer.int_set`` bound inference.

Template-facing API kept stable: ``Axis``, ``static_extent``, ``output_block``, ``block_axes``.
Axes are those of dlight's ``normalize_prim_func``, which drops unit-extent loops, so e.g. a
gemv with m == 1 has the spatial axes ``(n,)`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import tvm_ffi
from tvm import DataType, ir, s_tir, sym, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.analysis.common_analysis import SBlockInfo

from fastdlight.analysis.prepare import param_shape, check_index_range, check_target, func_name, specialize


#: largest non-reduced operand extent ("M", batch rows) still handled as a GEMV
GEMV_MAX_ROWS = 16


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
        raise ValueError("PrimFunc cannot be normalized (no blocks, opaque blocks or non-affine loops?)")
    reductions = [b for b in blocks if reduces(b)]
    return blocks, (reductions[-1] if reductions else blocks[-1])


def reduces(info: SBlockInfo) -> bool:
    """A reduction block with something to reduce: one whose reduction axes all have extent 1
    (normalization drops them) computes one term per output, as an elementwise block does."""
    return info.is_reduction() and any(it.kind == "R" for it in info.iters)


def block_axes(info: SBlockInfo) -> tuple[list[Axis], list[Axis]]:
    """(spatial axes, reduction axes) of a block in iter-var order — the axes a Config indexes."""
    spatial, reduce = [], []
    for it in info.iters:
        if it.kind not in ("S", "R"):
            raise ValueError(f"block {info.name} has an iterator of unsupported kind {it.kind}")
        axis = Axis(str(it.var.name), static_extent(it.dom, f"axis {it.var.name} of {info.name}"), it.kind)
        (spatial if it.kind == "S" else reduce).append(axis)
    return spatial, reduce


# -- buffers and accesses ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def bits(self) -> int:
        return DataType(self.dtype).bits

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.bits // 8


@dataclass(frozen=True, eq=False)
class Access:
    """Every load of one buffer in the output block (or its store), as index expressions over
    the block's iter vars. ``linear[l][d]`` holds, for load ``l`` and buffer dim ``d``, the
    integer coefficient of each block iter (iter order) followed by the constant term; it is
    ``None`` when some index is not affine (then footprints use TVM bound inference)."""

    tensor: TensorInfo
    is_param: bool  # a function parameter (global memory) rather than an intermediate
    indices: tuple[tuple[tirx.PrimExpr, ...], ...]
    iter_vars: tuple[tirx.Var, ...]
    linear: tuple[tuple[tuple[int, ...], ...], ...] | None

    @property
    def name(self) -> str:
        return self.tensor.name

    def depends_on(self, it: int) -> bool:
        """Whether any index of this access varies with block iter ``it`` (iter order)."""
        if self.linear is not None:
            return any(dim[it] != 0 for load in self.linear for dim in load)
        var = self.iter_vars[it]
        return any(var.same_as(v) for load in self.indices for e in load for v in tirx.analysis.undefined_vars(e))

    def innermost_axis(self) -> int | None:
        """The block iter that moves the innermost index with unit stride while no other iter
        touches it (a contiguous, vectorizable run), else None."""
        if self.linear is None:
            return None
        found = None
        for load in self.linear:
            if not load:  # a 0-d buffer (a scalar parameter): nothing to vectorize
                return None
            coef = load[-1][:-1]
            nz = [i for i, c in enumerate(coef) if c != 0]
            if len(nz) != 1 or coef[nz[0]] != 1:
                return None
            if found is not None and found != nz[0]:
                return None
            found = nz[0]
        return found

    def region(self, extents) -> tuple[int, ...]:
        """Shape of the region touched when block iter ``i`` ranges over ``[0, extents[i])``
        (iter order), clipped to the buffer shape."""
        if self.linear is None:
            return self.exact_region(extents)
        shape = self.tensor.shape
        out = []
        for d in range(len(shape)):
            lo = hi = None
            for load in self.linear:
                coef = load[d]
                a = b = coef[-1]
                for c, e in zip(coef, extents):
                    if c > 0:
                        b += c * (e - 1)
                    elif c < 0:
                        a += c * (e - 1)
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
            out.append(min(hi - lo + 1, shape[d]))
        return tuple(out)

    def exact_region(self, extents) -> tuple[int, ...]:
        """Same as :meth:`region`, by TVM interval bound inference over the real index
        expressions (slow: used for non-affine indices and to check the closed form)."""
        ana = sym.Analyzer()
        dom = {v: sym.IntervalSet(0, int(e) - 1) for v, e in zip(self.iter_vars, extents)}
        out = []
        for d, size in enumerate(self.tensor.shape):
            lo = hi = None
            for load in self.indices:
                s = ana.int_set(load[d], dom)
                a, b = s.min_value, s.max_value
                if not (isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm)):
                    lo, hi = 0, size - 1
                    break
                lo = int(a) if lo is None else min(lo, int(a))
                hi = int(b) if hi is None else max(hi, int(b))
            out.append(min(hi - lo + 1, size))
        return tuple(out)


def _linear_form(indices, iter_vars):
    forms = []
    for e in indices:
        coef = sym.detect_linear_equation(e, list(iter_vars))
        if len(coef) != len(iter_vars) + 1 or not all(isinstance(c, tirx.IntImm) for c in coef):
            return None
        forms.append(tuple(int(c) for c in coef))
    return tuple(forms)


def _make_access(tensor, is_param, loads, iter_vars) -> Access:
    indices = tuple(tuple(ld.indices) for ld in loads)
    linear = tuple(_linear_form(ix, iter_vars) for ix in indices)
    return Access(tensor, is_param, indices, tuple(iter_vars), None if any(f is None for f in linear) else linear)


def _tensor(buf) -> TensorInfo:
    shape = tuple(static_extent(d, f"buffer {buf.name}") for d in buf.shape)
    return TensorInfo(str(buf.name), shape, str(buf.dtype))


def _loads(expr) -> list:
    found = []
    tvm_ffi.structural_walk(expr, (ir.TensorLoad, found.append), order="post")
    return found


def _buffer_of(node):
    """The buffer of a load (``ir.TensorLoad.source``) or store (``BufferStore.buffer``)."""
    return node.source if hasattr(node, "source") else node.buffer


# -- the analysis result ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FuncInfo:
    """What policies need to know about one PrimFunc (see module docstring)."""

    func: tirx.PrimFunc = field(repr=False)  # specialized (static shapes), not normalized
    normalized: tirx.PrimFunc = field(repr=False)  # after dlight normalization (unit loops dropped)
    blocks: tuple[str, ...]  # normalized block names, in order
    reduction_blocks: tuple[str, ...]
    output_block: str
    iter_kinds: str  # "S"/"R" per iter of the output block, e.g. "SSR"
    spatial_axes: tuple[Axis, ...]
    reduce_axes: tuple[Axis, ...]
    inputs: tuple[TensorInfo, ...]  # parameters only read
    outputs: tuple[TensorInfo, ...]  # parameters written
    reads: tuple[Access, ...] = field(repr=False)  # loads of the output block (producers inlined)
    write: Access = field(repr=False)  # the output block's store
    kind: str
    #: gemv only: the name of the large operand ("W", contiguous along the reduction)
    gemv_weight: str | None = None
    #: the read whose innermost index drives contiguity (largest read), for reductions
    dominant_read: str | None = None

    # axis bookkeeping
    @cached_property
    def spatial_iters(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.iter_kinds) if k == "S")

    @cached_property
    def reduce_iters(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.iter_kinds) if k == "R")

    @property
    def acc_dtype(self) -> str:
        return self.write.tensor.dtype

    def read(self, name: str) -> Access:
        for a in self.reads:
            if a.name == name:
                return a
        raise KeyError(name)

    def iter_extents(self, block_tile, rstep=None) -> tuple[int, ...]:
        """Per block iter (iter order): the tile clipped to the axis extent; rstep None = the
        whole reduction."""
        if len(block_tile) != len(self.spatial_axes):
            raise ValueError(f"tile {tuple(block_tile)} needs one entry per spatial axis {self.spatial_axes}")
        if rstep is None:
            rstep = [a.extent for a in self.reduce_axes]
        if len(rstep) != len(self.reduce_axes):
            raise ValueError(f"rstep {tuple(rstep)} needs one entry per reduction axis {self.reduce_axes}")
        ext = [0] * len(self.iter_kinds)
        for i, t, a in zip(self.spatial_iters, block_tile, self.spatial_axes):
            ext[i] = max(1, min(int(t), a.extent))
        for i, r, a in zip(self.reduce_iters, rstep, self.reduce_axes):
            ext[i] = max(1, min(int(r), a.extent))
        return tuple(ext)

    def footprint(self, block_tile, rstep=None, params_only: bool = False) -> dict[str, tuple[int, ...]]:
        """Shape of the region of every buffer the output block reads that one thread block
        touches for ``block_tile`` (per spatial axis) and one reduction step ``rstep`` (per
        reduction axis; None = the whole reduction)."""
        ext = self.iter_extents(block_tile, rstep)
        return {a.name: a.region(ext) for a in self.reads if a.is_param or not params_only}

    def footprint_bytes(self, block_tile, rstep=None, params_only: bool = False) -> dict[str, int]:
        """:meth:`footprint` in bytes (elements × dtype bytes)."""
        ext = self.iter_extents(block_tile, rstep)
        return {
            a.name: math.prod(a.region(ext)) * a.tensor.bits // 8 for a in self.reads if a.is_param or not params_only
        }


# -- classification ------------------------------------------------------------------------------


def _strip_cast(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _update_value(block) -> tirx.PrimExpr | None:
    """``x`` of a reduction update ``C = C op x`` (op: + max min), else None."""
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return None
    v = store.value
    if isinstance(v, (tirx.Add, tirx.Max, tirx.Min, tirx.Mul)):
        for acc, other in ((v.a, v.b), (v.b, v.a)):
            acc = _strip_cast(acc)
            if isinstance(acc, ir.TensorLoad) and acc.source.same_as(store.buffer):
                return other
    return None


def _classify(info_parts, block) -> tuple[str, str | None]:
    """(kind, gemv weight name) of a function with exactly one reduction block."""
    spatial_iters, reduce_iters, reads, extents = info_parts
    value = _update_value(block)
    if value is None:
        return "reduction", None
    value = _strip_cast(value)
    if not isinstance(value, tirx.Mul):
        return "reduction", None
    by_name = {a.name: a for a in reads}
    sides = []
    for side in (value.a, value.b):
        names = sorted({str(ld.source.name) for ld in _loads(side)} & set(by_name))
        if not names:
            return "reduction", None
        deps = frozenset(i for i in spatial_iters if any(by_name[n].depends_on(i) for n in names))
        sides.append((names, deps))
    (names_a, deps_a), (names_b, deps_b) = sides
    if deps_a == deps_b or set(names_a) & set(names_b):
        return "reduction", None  # an elementwise product reduced (dot-like): not a matmul
    # GEMV: one reduction axis, the big operand W contiguous along it, the other operand X small
    # ("M" rows <= 16), and the W-independent (M) axes before the W-dependent (N) ones: Y[m, n].
    if len(reduce_iters) == 1:
        for (x_names, x_deps), (w_names, w_deps) in ((sides[0], sides[1]), (sides[1], sides[0])):
            if len(w_names) != 1:
                continue
            w = by_name[w_names[0]]
            # M: the axes only X depends on (a batch axis both index is one more row of W)
            rows = math.prod(extents[i] for i in x_deps - w_deps)
            m_axes = [i for i in spatial_iters if i not in w_deps]
            n_axes = [i for i in spatial_iters if i in w_deps]
            ordered = not m_axes or not n_axes or max(m_axes) < min(n_axes)
            if rows <= GEMV_MAX_ROWS and w.innermost_axis() == reduce_iters[0] and ordered and w_deps:
                return "gemv", w.name
    return "matmul", None


_CACHE: dict = {}


def analyze(func: tirx.PrimFunc, opt_shapes: dict | None = None) -> FuncInfo:
    """Analyze ``func`` (cached per structurally-equal function, buffer names and opt_shapes:
    structural equality ignores names, and configs name buffers, e.g. their vector widths)."""
    if not isinstance(func, tirx.PrimFunc):
        raise ValueError(f"expected a tvm.tirx.PrimFunc, got {type(func).__name__}")
    key = (tvm_ffi.structural_hash(func), _buffer_names(func), tuple(sorted((opt_shapes or {}).items())))
    for cached_func, info in _CACHE.get(key, ()):
        if tvm_ffi.structural_equal(cached_func, func):
            return info
    info = _analyze(func, opt_shapes)
    _CACHE.setdefault(key, []).append((func, info))
    return info


def _buffer_names(func: tirx.PrimFunc) -> tuple[str, ...]:
    """The parameters' names and those of the buffers the root block allocates."""
    names = [str(p.name) for p in func.params]
    root = getattr(func.body, "block", None)
    names += [str(b.name) for b in getattr(root, "alloc_buffers", ())]
    return tuple(names)


def _analyze(func: tirx.PrimFunc, opt_shapes: dict | None) -> FuncInfo:
    check_target(func)
    func = specialize(func, opt_shapes)
    check_index_range(func)
    name = func_name(func)
    sch = s_tir.Schedule(func)
    blocks, anchor, spatial, reduce = _output_axes(sch, name)
    normalized = sch.mod["main"]
    reduction_blocks = tuple(b.name for b in blocks if reduces(b))
    iter_kinds = anchor.dom_kind()
    block = _output_block_inlined(normalized, blocks, anchor.name)
    reads, write, num_stores = _accesses(block, func.params, f"{name}: output block {anchor.name}")
    inputs, outputs = _inputs_and_outputs(func, sch, blocks)
    si, ri, extents = _iter_layout(iter_kinds, spatial, reduce)
    if not reduction_blocks:
        kind, weight = "elementwise", None
    elif len(reduction_blocks) > 1 or num_stores > 1:
        kind, weight = "general_reduction", None
    else:
        kind, weight = _classify((si, ri, reads, extents), block)
    return FuncInfo(
        func=func,
        normalized=normalized,
        blocks=tuple(b.name for b in blocks),
        reduction_blocks=reduction_blocks,
        output_block=anchor.name,
        iter_kinds=iter_kinds,
        spatial_axes=tuple(spatial),
        reduce_axes=tuple(reduce),
        inputs=inputs,
        outputs=outputs,
        reads=reads,
        write=write,
        kind=kind,
        gemv_weight=weight,
        dominant_read=_dominant_read(reads, extents),
    )


def _output_axes(sch: s_tir.Schedule, name: str) -> tuple[list[SBlockInfo], SBlockInfo, list[Axis], list[Axis]]:
    """The normalized blocks, the output block, and its spatial and reduction axes; errors name
    the function ``name``."""
    try:
        blocks, anchor = output_block(sch)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    spatial, reduce = block_axes(anchor)
    if not spatial:
        raise ValueError(f"{name}: output block {anchor.name} has no spatial axis (full reduction to a scalar)")
    return blocks, anchor, spatial, reduce


def _accesses(block, params, where: str) -> tuple[tuple[Access, ...], Access, int]:
    """The loads of the output ``block`` (one access per buffer), its store, and how many
    stores it has; ``where`` names the block in errors."""
    iter_vars = [iv.var for iv in block.iter_vars]
    stores = []
    tvm_ffi.structural_walk(block.body, (tirx.BufferStore, stores.append), order="pre")
    if not stores:
        raise ValueError(f"{where} stores nothing")
    # a block storing several buffers (TVM's layer/group norm: sum and sum of squares in one
    # pass) is analyzed through its first store; it is a general reduction
    store = stores[0]
    param_names = {str(p.name) for p in params}
    out_names = {str(st.buffer.name) for st in stores}
    reads = _reads(block, out_names, param_names, iter_vars)
    write = _make_access(_tensor(store.buffer), str(store.buffer.name) in param_names, [store], iter_vars)
    return reads, write, len(stores)


def _inputs_and_outputs(func: tirx.PrimFunc, sch: s_tir.Schedule, blocks) -> tuple[tuple[TensorInfo, ...], ...]:
    """(buffer parameters only read, buffer parameters some block writes)."""
    written = {str(w.source.name) for b in blocks for w in sch.get(b.block_rv).writes}
    params = [p for p in func.params if param_shape(p) is not None]
    inputs = tuple(_tensor(p) for p in params if str(p.name) not in written)
    outputs = tuple(_tensor(p) for p in params if str(p.name) in written)
    return inputs, outputs


def _iter_layout(iter_kinds: str, spatial, reduce) -> tuple[list[int], list[int], list[int]]:
    """(spatial iters, reduction iters, extent of every iter), in the output block's iter order."""
    si = [i for i, k in enumerate(iter_kinds) if k == "S"]
    ri = [i for i, k in enumerate(iter_kinds) if k == "R"]
    extents = [0] * len(iter_kinds)
    for i, a in [*zip(si, spatial), *zip(ri, reduce)]:
        extents[i] = a.extent
    return si, ri, extents


def _dominant_read(reads, extents) -> str | None:
    """The read the whole block touches most of, parameters before intermediates."""
    if not reads:
        return None
    return max(reads, key=lambda a: (a.is_param, math.prod(a.region(extents)))).name


def _output_block_inlined(normalized: tirx.PrimFunc, blocks, anchor: str):
    """The output block with the injective producers before it (a convolution's padding,
    softmax's exp) inlined, so its loads are over real inputs: on a copy of the schedule (the
    templates do their own)."""
    work = s_tir.Schedule(normalized)
    for b in blocks:
        if b.name == anchor:
            break
        if not reduces(b) and b.is_injective():
            try:
                work.compute_inline(work.get_sblock(b.name))
            except Exception:  # noqa: BLE001 - TVM raises ScheduleError when not inlinable
                pass
    return work.get(work.get_sblock(anchor))


def _reads(block, out_names: set[str], param_names: set[str], iter_vars) -> tuple:
    """One access per buffer the block loads (its own accumulators left out), in load order.
    Buffers are told apart by identity: two of one name (a fused function's parameters, before
    our pipeline renames them) are two accesses, whose indices may not even have one rank."""
    groups: dict = {}
    for ld in _loads(block.body):
        if str(ld.source.name) not in out_names:
            groups.setdefault(ld.source, []).append(ld)
    return tuple(_make_access(_tensor(buf), str(buf.name) in param_names, lds, iter_vars) for buf, lds in groups.items())


