"""Screening for ``@fastdlight.autotune``, everything decided before building: what each
scheduled point's lowered kernel asks of the GPU (:func:`kernel_resources`), the arch's limits
(:func:`over_limits`), the tiles the Roller cost model ranks by (:func:`read_tile`), and the
values a screening produces (:class:`Pruned`, :class:`Survivor`, :class:`Screening`). See
:mod:`fastdlight.search.autotune`."""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import sym, tirx

from fastdlight.arch import CUDA
from fastdlight.search.autotune_space import Params, fmt_params
from fastdlight.compiler.compile import PASS_CONFIG, tir_pipeline
from fastdlight.compiler.workers import one_line
from fastdlight.policies.default import DefaultPolicy
from fastdlight.policies.roller import blocks_per_sm

#: CUDA's per-dimension limits (the same on every GPU since compute capability 3.0)
THREAD_DIM_LIMITS = {"threadIdx.x": 1024, "threadIdx.y": 1024, "threadIdx.z": 64}
GRID_DIM_LIMITS = {"blockIdx.x": 2**31 - 1, "blockIdx.y": 65535, "blockIdx.z": 65535}
#: why a point was not built, in pipeline order
PRUNE_STAGES = ("constraint", "schedule", "duplicate", "signature", "lower", "threads", "grid", "shared_memory")


# -- what a candidate asks of the GPU ------------------------------------------------------------
@dataclass(frozen=True)
class Resources:
    """What one candidate's lowered kernel asks for (the largest, when there are several)."""

    kernels: int
    threads: int  # per block
    thread_dims: tuple[tuple[str, int], ...]  # threadIdx.* extents
    grid: tuple[tuple[str, int], ...]  # blockIdx.* extents
    static_smem: int  # bytes, "shared" allocations
    dynamic_smem: int  # bytes, "shared.dyn" allocations

    @property
    def blocks(self) -> int:
        return math.prod(n for _, n in self.grid)

    @property
    def smem(self) -> int:
        return self.static_smem + self.dynamic_smem


def _walk(node, cls) -> list:
    found = []
    tvm_ffi.structural_walk(node, (cls, found.append), order="pre")
    return found


def _alloc_bytes(buf) -> int | None:
    shape = [int(d) if isinstance(d, (int, tirx.IntImm)) else None for d in buf.shape]
    if None in shape:
        return None
    dt = tvm.DataType(str(buf.dtype))
    return math.prod(shape) * dt.bits * dt.lanes // 8


def kernel_resources(func: tirx.PrimFunc, target) -> Resources:
    """Lower ``func`` with fastdlight's pass config through TVM's TIR pipeline (no codegen, no
    nvcc) and read each device kernel's launch extents and shared-memory allocations. Raises
    whatever TVM's lowering raises (an unbound loop: "Did you forget to bind?")."""
    mod = tvm.IRModule({"main": func})
    with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
        mod = tirx.transform.BindTarget(target.with_host("llvm" if tvm.runtime.enabled("llvm") else "c"))(mod)
        lower, _, _ = tirx.get_tir_pipeline(tir_pipeline(mod))
        mod = lower(mod)
    found = []
    for _, kernel in mod.functions_items():
        attrs = kernel.attrs
        if attrs is None or int(attrs.get("calling_conv", 0)) != 2:  # 2: a device kernel launch
            continue
        extents: dict[str, int] = {}
        for a in _walk(kernel.body, tirx.AttrStmt):
            if a.attr_key == "thread_extent" and isinstance(a.value, tirx.IntImm):
                tag = str(a.node.thread_tag)
                extents[tag] = max(extents.get(tag, 1), int(a.value))
        smem = {"shared": 0, "shared.dyn": 0}
        for alloc in _walk(kernel.body, tirx.AllocBuffer):
            scope = alloc.buffer.scope()
            if scope in smem:
                smem[scope] += _alloc_bytes(alloc.buffer) or 0
        threads = tuple(sorted((t, n) for t, n in extents.items() if t.startswith("threadIdx")))
        grid = tuple(sorted((t, n) for t, n in extents.items() if t.startswith("blockIdx")))
        found.append(Resources(0, math.prod(n for _, n in threads), threads, grid, smem["shared"], smem["shared.dyn"]))
    if not found:
        raise ValueError("lowering gave no device kernel (is any loop bound to blockIdx/threadIdx?)")
    worst = max(found, key=lambda r: (r.threads, r.smem))
    return dataclasses.replace(worst, kernels=len(found))


def over_limits(res: Resources, arch: CUDA) -> tuple[str, str] | None:
    """(stage, reason) of the first limit of ``arch`` the kernel exceeds, else None."""
    for tag, n in res.thread_dims:
        if n > THREAD_DIM_LIMITS.get(tag, arch.max_threads_per_block):
            return "threads", f"{tag} = {n} > {THREAD_DIM_LIMITS[tag]}"
    if res.threads > arch.max_threads_per_block:
        return "threads", f"{res.threads} threads per block > {arch.max_threads_per_block} ({arch.name})"
    for tag, n in res.grid:
        if n > GRID_DIM_LIMITS.get(tag, GRID_DIM_LIMITS["blockIdx.x"]):
            return "grid", f"{tag} = {n} > {GRID_DIM_LIMITS[tag]}"
    if res.static_smem > arch.smem_per_block:
        return "shared_memory", (f"{res.static_smem} B of static shared memory > {arch.smem_per_block} B, the "
                                 f"static limit per block (dynamic shared memory may use up to "
                                 f"{arch.smem_per_block_optin} B on {arch.name})")
    if res.smem > arch.smem_per_block_optin:
        return "shared_memory", (f"{res.smem} B of shared memory > {arch.smem_per_block_optin} B, the opt-in "
                                 f"limit per block of {arch.name}")
    return None


# -- ranking -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tile:
    """A schedule's tiles over the reference's normalized axes (the Config convention): output
    elements per block and per thread on each spatial axis, elements per main-loop step on each
    reduction axis."""

    block: tuple[int, ...]
    thread: tuple[int, ...]
    rstep: tuple[int, ...]


def read_tile(func: tirx.PrimFunc, info) -> Tile | None:
    """The tiles of ``func`` (a scheduled version of ``info``'s function) on its output block:
    the range each block iterator covers with the blockIdx loops fixed (block tile), with the
    threadIdx loops fixed too (thread tile), and, on a reduction axis, with its outermost
    serial loop fixed too (the step). None when the block or its axes cannot be matched."""
    from tvm.s_tir.stmt import SBlockRealize

    loops = {}
    for depth, loop in enumerate(_walk(func.body, tirx.For)):
        tag = str(loop.thread_binding.thread_tag) if loop.thread_binding is not None else ""
        loops[loop.loop_var] = (depth, loop, tag)
    names = (info.output_block, f"{info.output_block}_update")
    realizes = [r for r in _walk(func.body, SBlockRealize) if str(r.block.name_hint) in names]
    if not realizes:
        return None
    realize = max(realizes, key=lambda r: sum(iv.iter_type == tirx.IterVar.CommReduce for iv in r.block.iter_vars))
    pairs = [(iv, v) for iv, v in zip(realize.block.iter_vars, realize.iter_values)
             if not (isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == 1)]
    kinds = "".join("R" if iv.iter_type == tirx.IterVar.CommReduce else "S" for iv, _ in pairs)
    axes = iter(info.spatial_axes), iter(info.reduce_axes)
    want = [next(axes[k == "R"]).extent for k in info.iter_kinds]
    have = [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else None for iv, _ in pairs]
    if kinds != info.iter_kinds or have != want:
        return None
    analyzer = sym.Analyzer()

    def covered(expr, fixed) -> int | None:
        dom = {}
        for var in tirx.analysis.undefined_vars(expr):
            if var not in loops:
                continue
            _, loop, tag = loops[var]
            hi = loop.min if fixed(var, tag) else loop.min + loop.extent - 1
            dom[var] = sym.IntervalSet(loop.min, hi)
        s = analyzer.int_set(expr, dom)
        lo, hi = s.min_value, s.max_value
        if not (isinstance(lo, tirx.IntImm) and isinstance(hi, tirx.IntImm)):
            return None
        return int(hi) - int(lo) + 1

    block, thread, rstep = [], [], []
    for (iv, value), kind in zip(pairs, kinds):
        b = covered(value, lambda v, t: t.startswith("blockIdx"))
        if kind == "S":
            block.append(b)
            thread.append(covered(value, lambda v, t: t.startswith(("blockIdx", "threadIdx"))))
            continue
        serial = sorted((loops[v][0], i, v) for i, v in enumerate(tirx.analysis.undefined_vars(value))
                        if v in loops and not loops[v][2])
        outer = serial[0][2] if len(serial) > 1 else None
        rstep.append(covered(value, lambda v, t: t.startswith(("blockIdx", "threadIdx"))
                             or (outer is not None and v.same_as(outer))))
    if None in block + thread + rstep:
        return None
    return Tile(tuple(block), tuple(thread), tuple(rstep))


class Ranker:
    """Scores candidates with DefaultPolicy's planner for the reference's family, or says why not."""

    def __init__(self, reference, arch: CUDA):
        self.arch, self.planner, self.info = arch, None, None
        if reference is None:
            self.why = "unranked: no reference= PrimFunc to analyze"
            return
        try:
            policy = DefaultPolicy(reference, arch)
        except Exception as e:  # noqa: BLE001 - analysis refuses what it does not understand
            self.why = f"unranked: the analysis does not cover the reference ({one_line(e)})"
            return
        self.planner, self.info = policy.planner, policy.info
        self.why = f"Roller cost model of DefaultPolicy ({self.info.kind})"

    def cost(self, func, res: Resources) -> tuple[float | None, Tile | None]:
        if self.planner is None or res.kernels != 1:
            return None, None
        tile = read_tile(func, self.info)
        if tile is None:
            return None, None
        per_sm = blocks_per_sm(self.arch, res.threads, 0, res.smem)  # registers: known after nvcc
        if per_sm == 0:
            return None, tile
        try:
            cost = self.planner.cost(tile.block, tile.thread, tile.rstep, res.threads, per_sm, res.blocks)
        except Exception:  # noqa: BLE001 - a tile the model cannot score is built unranked
            return None, tile
        return float(cost), tile


# -- the values a run produces -------------------------------------------------------------------
@dataclass(frozen=True)
class Pruned:
    """A point not built: the stage that cut it (:data:`PRUNE_STAGES`) and why, in one line."""

    params: Params
    stage: str
    reason: str

    def __str__(self) -> str:
        return f"{fmt_params(self.params)}: {self.stage}: {self.reason}"


@dataclass(frozen=True)
class Survivor:
    """A point that passed every check before building, with its predicted cost (None: not
    ranked) and the tiles the cost was computed from."""

    params: Params
    func: tirx.PrimFunc = field(repr=False, compare=False)
    resources: Resources
    predicted_cost: float | None = None
    tile: Tile | None = None


@dataclass(frozen=True)
class Screening:
    """Everything decided before building: survivors (ranked ones by predicted cost, then the
    unranked in space order), what was cut and why, how survivors were ranked, ``topk``."""

    space_size: int
    survivors: tuple[Survivor, ...]
    pruned: tuple[Pruned, ...]
    ranking: str
    topk: int

    @property
    def chosen(self) -> tuple[Survivor, ...]:
        """What is built: the ``topk`` best ranked survivors and every unranked one."""
        ranked = [s for s in self.survivors if s.predicted_cost is not None]
        return tuple(ranked[: self.topk]) + tuple(s for s in self.survivors if s.predicted_cost is None)

    @property
    def not_built(self) -> tuple[Survivor, ...]:
        chosen = {id(s) for s in self.chosen}
        return tuple(s for s in self.survivors if id(s) not in chosen)

    def cut_counts(self) -> dict[str, int]:
        """Points cut per reason: per constraint, then per stage."""
        counts = collections.Counter(p.reason if p.stage == "constraint" and p.reason.startswith("rejected by")
                                     else p.stage for p in self.pruned)
        return dict(counts.most_common())

    def summary(self) -> str:
        cut = "; ".join(f"{why}: {n}" for why, n in self.cut_counts().items())
        lines = [f"{self.space_size} points; {len(self.pruned)} cut before building" + (f" ({cut})" if cut else "")]
        ranked = sum(s.predicted_cost is not None for s in self.survivors)
        lines.append(f"{len(self.survivors)} survivors ranked by {self.ranking}" if ranked else
                     f"{len(self.survivors)} survivors, {self.ranking}")
        if ranked and ranked < len(self.survivors):
            lines[-1] += f" ({len(self.survivors) - ranked} could not be scored and are all built)"
        lines.append(f"{len(self.chosen)} built (topk {self.topk}), {len(self.not_built)} ranked below them not built")
        return "\n".join(lines)
