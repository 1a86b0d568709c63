"""The float64 twin of a PrimFunc and its naive schedule: the reference a tuning run checks
candidates against when no numpy reference is given (see :mod:`fastdlight.search.reference`).
Nothing here is shared with any template: the schedule is :func:`tiled_reference_schedule` for a
plain contraction, :func:`staged_reference_schedule` for several reductions among which plain
contractions (attention), stock Dlight's Fallback rule for everything else."""

from __future__ import annotations

import math
import re

import tvm
from tvm import ir, s_tir, tirx

from fastdlight.measure.check_kinds import (
    expr_dtype,
    is_float,
    walk_exprs,
    wants_own_dtype_run,
)

_FLOAT_NAME = re.compile(r'"b?float(16|32)"')
_FLOAT_TYPE = re.compile(r"\bT\.b?float(16|32)\b")  # constants T.float16(1), types T.let[T.float32]
#: calls with no float64 twin: bit reinterpretation, and C routines of a fixed precision
#: (expf on a widened argument would silently compute in single precision)
_EXTERN = ("call_extern", "call_pure_extern", "call_llvm_intrin", "call_llvm_pure_intrin")


def widen_to_float64(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float buffer, intermediate, let variable, cast and constant in
    float64; integer and bool buffers untouched. Raises ValueError for what has no exact
    float64 twin (bit reinterpretation, external float routines, float8/float4 data).

    How: print the function as TVMScript with every buffer dtype spelled out, rewrite the
    float16/bfloat16/float32 dtype names to float64, parse it back, and check that no
    narrower float is left anywhere. Parsing re-derives every expression's type and keeps
    each buffer one object across parameters, allocations, regions, loads and stores, which
    an IR mutator would have to redo by hand for every node kind (TVM 0.27 stores types in
    every expression and makes buffers variables of a BufferType)."""
    from tvm.runtime import script_printer

    _refuse_unwidenable(func)
    # script() leaves out dtypes equal to a default; "void" is no buffer's, so all are written
    config = script_printer.PrinterConfig(buffer_dtype="void", extra_config={"tirx.prefix": "T"})
    text = script_printer._script(func, config)
    wide = tvm.script.from_source(_FLOAT_TYPE.sub("T.float64", _FLOAT_NAME.sub('"float64"', text)))
    narrow = sorted({expr_dtype(e) for e in walk_exprs(wide, ir.Expr)
                     if is_float(expr_dtype(e)) and expr_dtype(e) != "float64"})
    if narrow:  # float8/float4 data, or a spelling the rewrite missed
        raise ValueError(f"could not widen {', '.join(narrow)} values to float64")
    return wide


def _refuse_unwidenable(func: tirx.PrimFunc) -> None:
    for call in walk_exprs(func.body, ir.Call):
        name = str(getattr(call.op, "name", "")).rsplit(".", 1)[-1]
        if name == "reinterpret":
            raise ValueError("the function reinterprets bits; it has no float64 twin")
        floats = [expr_dtype(call)] + [expr_dtype(a) for a in call.args]
        if name in _EXTERN and any(map(is_float, floats)):
            raise ValueError(f"the function calls the external routine {call.args[0]} on floats; "
                             "it has no float64 twin")


#: the function in its own dtypes, beside the float64 twin in a reference module where
#: :func:`~fastdlight.measure.verify.wants_own_dtype_run` asks for it
OWN_DTYPES = "own_dtypes"


def naive_reference_module(func: tirx.PrimFunc, target) -> tvm.IRModule:
    """The float64 twin of ``func`` (:func:`widen_to_float64`), ready for ``tvm.compile``.
    Its schedule is one thread per output element with every reduction serial in its thread,
    nothing shared with any template: :func:`tiled_reference_schedule` where the twin is one
    plain contraction, :func:`staged_reference_schedule` where it holds contractions among
    other reductions, else stock Dlight's Fallback rule (injective blocks inlined), which then
    also schedules ``func`` as it is, as :data:`OWN_DTYPES`, where its own arithmetic may cancel
    beyond the elementwise bound."""
    from tvm.s_tir import dlight as dl

    wide = widen_to_float64(func)
    if wide.attrs is None or "global_symbol" not in wide.attrs:
        wide = wide.with_attr("global_symbol", "main")
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    tiled = tiled_reference_schedule(wide) or staged_reference_schedule(wide)
    funcs = {} if tiled is not None else {"main": wide}
    if wants_own_dtype_run(func):
        funcs[OWN_DTYPES] = func.with_attr("global_symbol", OWN_DTYPES)
    with _narrow_blocks(target):
        mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(tvm.IRModule(funcs)) if funcs else tvm.IRModule({})
    if tiled is not None:
        # the twin tiled, and (where wanted) the function itself as Fallback schedules it: a
        # matmul whose epilogue cancels (BatchNorm's subtraction after an fp16 cast) needs its own
        # error as much under the tiled twin as under Fallback's (MobileNetV2's 1x1 convolutions
        # of 16 and 32 channels had no candidate verified without it, stock Dlight's included)
        return tvm.IRModule({"main": tiled.mod["main"], **{gv.name_hint: f for gv, f in mod.functions_items()}})
    if not any(f.kind == tirx.ForKind.THREAD_BINDING for f in walk_exprs(mod["main"].body, tirx.For)):
        raise ValueError("the naive schedule (Dlight Fallback) does not apply to this function "
                         "(not in block form, or its loops cannot be normalized)")
    return mod


#: threads a block of the Fallback schedule: its default (1024) put a softmax's 4096 row
#: reductions of 32000 serial loads on four SMs (1.5 s of a 12.9 s tune on an H200); the
#: threads and each one's order of summation stay the same
NAIVE_BLOCK_THREADS = 64


def _narrow_blocks(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with :data:`NAIVE_BLOCK_THREADS` threads a block, to schedule by."""
    spec = {k: v for k, v in target.export().items() if k != "host"}
    spec["max_num_threads"] = spec["max_threads_per_block"] = NAIVE_BLOCK_THREADS
    return tvm.target.Target(spec, host=target.host) if target.host is not None else tvm.target.Target(spec)


#: the tiled reference's output tile per thread block (TILE x TILE threads, one output each) and
#: reduction step held in shared memory: Fallback's kernel re-reads both operands from global
#: memory per output, 4.05 s for one 8192^3 float64 product on an H100 against 0.24 s tiled
TILE = 16


def tiled_reference_schedule(func: tirx.PrimFunc):
    """A shared-memory tiled schedule for a float64 twin that is one plain contraction (a
    matmul or batched matmul: every operand indexed by iteration variables alone, the last two
    spatial extents and the reduction divisible by :data:`TILE`) with elementwise blocks
    around it; None for any other function. Still one thread per output and a serial reduction
    in it, in the naive order; each thread block stages TILE-deep slices of its operands in
    shared memory, and the epilogue runs in the thread that owns the output."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    infos = try_inline(sch, infos) if infos is not None else None
    reductions = [i for i in infos or () if i.is_reduction()]
    if len(reductions) != 1 or infos[0] is not reductions[0]:
        return None
    info, epilogues = reductions[0], infos[1:]
    if (not _tileable(sch, info)
            or not all(e.is_injective() and _plain_operands(sch.get(e.block_rv)) for e in epilogues)):
        return None
    try:
        _tile(sch, info.block_rv, info.dom_kind(), [e.block_rv for e in epilogues])
    except s_tir.ScheduleError:  # an epilogue that does not fit the thread's one output
        return None
    return sch


def _tileable(sch, info) -> bool:
    """Whether a block is a plain contraction :func:`_tile` can stage: a reduction of two
    operands or more (not a row's max or sum), spatial and reduction axes only, at least two
    spatial, static extents, operands indexed by iteration variables alone, the last two
    spatial extents and the reduction divisible by :data:`TILE`."""
    kinds, extents = info.dom_kind(), info.dom()
    block = sch.get(info.block_rv)
    outputs = {w.source.name for w in block.writes}
    if (not info.is_reduction() or set(kinds) - {"S", "R"} or kinds.count("S") < 2
            or len({r.source.name for r in block.reads} - outputs) < 2 or not _plain_operands(block)
            or not all(isinstance(e, (int, tirx.IntImm)) for e in extents)):
        return False
    s_ext = [int(e) for e, k in zip(extents, kinds) if k == "S"]
    r_total = math.prod(int(e) for e, k in zip(extents, kinds) if k == "R")
    return not (s_ext[-1] % TILE or s_ext[-2] % TILE or r_total % TILE)


def staged_reference_schedule(func: tirx.PrimFunc):
    """A schedule for a float64 twin of several reduction blocks, at least one of them a plain
    contraction (attention: the scores, the row max and sum, the weighted values), with every
    block a kernel of its own: the contractions tiled (:func:`_tile`), every other block one
    thread per output (:data:`NAIVE_BLOCK_THREADS` a block) with its reduction serial. An
    elementwise block is inlined into its readers unless a contraction reads it: inlined there,
    it would be computed again for every output of the contraction that reads its value
    (attention's exponentials once per head-dimension column). Each output is still summed in
    one thread in the naive order, so the values are Fallback's. None for any other function."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None or sum(i.is_reduction() for i in infos) < 2:
        return None
    tiled = {sch.get(i.block_rv).name_hint for i in infos if _tileable(sch, i)}
    if not tiled:
        return None
    try:
        for info in infos:
            readers = {sch.get(c).name_hint for c in sch.get_consumers(info.block_rv)}
            if info.is_injective() and readers and not readers & tiled:
                sch.compute_inline(info.block_rv)
        for info in normalize_prim_func(sch):
            if sch.get(info.block_rv).name_hint in tiled:
                _tile(sch, info.block_rv, info.dom_kind(), [])
            else:
                _one_thread_per_output(sch, info.block_rv, info.dom_kind())
    except (s_tir.ScheduleError, ValueError):  # a primitive refused, or a fused extent past int32
        return None
    return sch if _global_bytes(sch.mod["main"]) <= STAGED_MAX_BYTES else None


#: at most this many bytes of float64 intermediates in global memory for the staged schedule
#: (attention at B1 H32 T8192: the scores and the exponentials, 17 GB each; Fallback, which
#: inlines the exponentials, keeps the scores only)
STAGED_MAX_BYTES = 40 << 30


def _global_bytes(func: tirx.PrimFunc) -> int:
    """Bytes of the buffers the function's root block allocates in global memory."""
    root = func.body.block
    return sum(math.prod(int(d) for d in b.shape) * b.dtype.bits // 8
               for b in root.alloc_buffers if b.scope() == "global")


def _one_thread_per_output(sch, rv, kinds: str) -> None:
    loops = sch.get_loops(rv)
    spatial = [l for l, k in zip(loops, kinds) if k == "S"]
    sch.reorder(*spatial, *[l for l, k in zip(loops, kinds) if k != "S"])
    bx, tx = sch.split(sch.fuse(*spatial) if spatial else sch.add_unit_loop(rv), [None, NAIVE_BLOCK_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _tile(sch, rv, kinds: str, epilogues) -> None:
    block = sch.get(rv)
    loops = sch.get_loops(rv)
    s_loops = [l for l, k in zip(loops, kinds) if k == "S"]
    r_loops = [l for l, k in zip(loops, kinds) if k == "R"]
    sch.reorder(*s_loops, *r_loops)
    by, ty = sch.split(s_loops[-2], [None, TILE])
    bx, tx = sch.split(s_loops[-1], [None, TILE])
    ko, _ = sch.split(sch.fuse(*r_loops), [None, TILE])
    batch = s_loops[:-2]
    sch.reorder(*batch, by, bx, ty, tx, ko)
    sch.bind(sch.fuse(*batch) if batch else sch.add_unit_loop(by), "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    out = block.writes[0].source
    for i, region in enumerate(block.reads):
        if region.source.same_as(out):
            continue
        cache = sch.cache_read(rv, i, "shared", consumer_blocks=[rv])  # not the others reading it
        sch.compute_at(cache, ko)
        sch.storage_align(cache, 0, axis=-2, factor=TILE, offset=1)  # rows in distinct banks
        own = sch.get_loops(cache)[len(sch.get_loops(rv)) - 1:]  # below ko (unit loops dropped)
        _, fy, fx = sch.split(sch.fuse(*own), [None, TILE, TILE])
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
    for epilogue in epilogues:
        sch.reverse_compute_at(epilogue, tx)
    if epilogues:
        sch.set_scope(rv, 0, "local")
    sch.decompose_reduction(rv, ko)


def _plain_operands(block: tirx.SBlock) -> bool:
    """Every region the block reads or writes is indexed by its iteration variables alone (or
    by a constant: a batch of one, whose axis normalization drops)."""
    ivars = {iv.var for iv in block.iter_vars}
    for region in list(block.reads) + list(block.writes):
        for r in region.region:
            if not ((isinstance(r.min, tirx.Var) and r.min in ivars or isinstance(r.min, tirx.IntImm))
                    and isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1):
                return False
    return True
