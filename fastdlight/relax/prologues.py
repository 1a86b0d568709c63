"""A decode step's elementwise or RMSNorm function merged into the GEMV that reads its output.

FuseOps fuses elementwise ops into the kernel that *produces* their input, never into a matmul
that reads their output: in a decode step the SiLU gate (``silu(gate) * up``, split from one
gate-and-up GEMV) and each RMSNorm before a projection stay kernels of their own, a few
microseconds each of launching, reading a vector of a few thousand elements and writing it back,
and the tuner timed them no faster than stock Dlight's schedules (H200). Merged into the GEMV's
function, the GEMV template computes them where it loads its activations (``schedules.gemv``):
each CTA recomputes the gate of the elements it reads, or first sums the squares of the row (the
norm's statistic) and then normalizes the elements it reads; the vector never goes to memory.

:func:`decode_prologues` runs between FuseOps and FuseTIR, on the fused functions: a function
whose result only fused GEMVs read, as their activations, is merged into each GEMV's function
(the norm in front of LLaMA's separate query, key and value projections: computed by each) when
it is elementwise (all its PrimFuncs injective) or an RMSNorm (TVM's ``rms_norm``, followed
by casts). A GEMV here: exactly one matmul-pattern PrimFunc in the function, reading the merged
value first and a bound 2-D weight ``[N, K]`` second, with at most :data:`DECODE_ROWS` rows (what
``decode.decode_weight_layout`` makes of a decode step's projections).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.ir import IRModule
from tvm.relax.utils import copy_with_new_vars

from fastdlight.policies.select import DECODE_ROWS

#: relax OpPatternKind values AnnotateTIROpPattern gives PrimFuncs
INJECTIVE, OUT_ELEMWISE_FUSABLE = 2, 4


def decode_prologues() -> tvm.transform.Pass:
    """Merge each decode GEMV's elementwise or RMSNorm producer into its function (see module)."""

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.DecodePrologues")
    def run(mod: IRModule, _ctx) -> IRModule:
        builder = relax.BlockBuilder(mod)
        changed = False
        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and not _is_primitive(func):
                new = _merge_in(builder, func)
                if new is not None:
                    builder.update_func(gvar, new)
                    changed = True
        if not changed:
            return mod
        return relax.transform.DeadCodeElimination()(builder.get())

    return run


def _merge_in(builder: relax.BlockBuilder, func: relax.Function) -> relax.Function | None:
    """``func`` with each mergeable (producer, GEMV) pair of calls as one call, else None."""
    if not isinstance(func.body, relax.SeqExpr):
        return None
    mod = builder.get()
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    uses = _use_counts(func)
    readers: dict = {}  # producer variable -> the decode GEMVs reading it as their activations
    for var, value in bindings.items():
        gemv = _group(mod, value)
        if gemv is not None and _is_decode_gemv(mod, *gemv[1:]):
            readers.setdefault(gemv[2][0], []).append((var, gemv))
    replaced = {}
    for x, gemvs in readers.items():
        producer = _group(mod, bindings.get(x))
        if uses.get(x) != len(gemvs) or producer is None or not _is_prologue(mod, producer[1]):
            continue  # read by something else too (the residual stream): it stays
        for var, gemv in gemvs:
            gvar = builder.add_func(_merged(producer[1], gemv[1]), f"{producer[0]}_{gemv[0]}")
            replaced[var] = relax.Call(gvar, [*producer[2], *gemv[2][1:]])
    if not replaced:
        return None
    blocks = []
    for block in func.body.blocks:
        new = [relax.VarBinding(b.var, replaced[b.var]) if b.var in replaced else b for b in block.bindings]
        blocks.append(relax.DataflowBlock(new) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(new))
    out = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs)
    return builder.normalize(out)


def _use_counts(func: relax.Function) -> dict:
    counts: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def _is_primitive(func: relax.Function) -> bool:
    return func.attrs is not None and "Primitive" in func.attrs and bool(func.attrs["Primitive"])


def _group(mod: IRModule, value) -> tuple[str, relax.Function, list] | None:
    """``(name, fused function, arguments)`` of a call of a fused function, or of a ``call_tir``
    FuseOps left alone (a group of one PrimFunc, given a fused function of its own here)."""
    if not isinstance(value, relax.Call):
        return None
    if isinstance(value.op, relax.GlobalVar):
        func = mod[value.op]
        if isinstance(func, relax.Function) and _is_primitive(func):
            return value.op.name_hint, func, list(value.args)
        return None
    if getattr(value.op, "name", "") != "relax.call_tir" or len(value.args) != 2:
        return None
    args = list(value.args[1].fields) if isinstance(value.args[1], relax.Tuple) else [value.args[1]]
    params = [relax.Var(f"p{i}", a.ty) for i, a in enumerate(args)]
    out = relax.Var("out", value.ty)
    call = relax.Call(value.op, [value.args[0], relax.Tuple(params)], value.attrs, value.ty_args)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(out, call)])], out)
    func = relax.Function(params, body, value.ty).with_attr("Primitive", True)
    return value.args[0].name_hint, func, args


def _prim_calls(mod: IRModule, func: relax.Function) -> list[tuple[relax.Call, object]]:
    """The ``call_tir`` calls in a fused function, with their PrimFuncs."""
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            calls.append((expr, mod[expr.args[0]]))

    relax.analysis.post_order_visit(func.body, visit)
    return calls


def _pattern(prim) -> int:
    return int(prim.attrs["op_pattern"]) if prim.attrs is not None and "op_pattern" in prim.attrs else 8


def _is_decode_gemv(mod: IRModule, func: relax.Function, args: list) -> bool:
    """One matmul-pattern PrimFunc, reading parameter 0 of ``func`` and a 2-D constant weight
    whose K is the activations' last axis, with at most DECODE_ROWS rows."""
    anchors = [(c, p) for c, p in _prim_calls(mod, func) if _pattern(p) == OUT_ELEMWISE_FUSABLE]
    if len(anchors) != 1 or not func.params or not isinstance(args[0], relax.Var):
        return False
    if not isinstance(func.body, relax.SeqExpr) or len(func.body.blocks) != 1:
        return False
    inner, _ = anchors[0]
    reads = list(inner.args[1].fields) if isinstance(inner.args[1], relax.Tuple) else []
    if len(reads) != 2 or not reads[0].same_as(func.params[0]) or not isinstance(reads[1], relax.Var):
        return False
    try:
        w_index = [p.same_as(reads[1]) for p in func.params].index(True)
    except ValueError:
        return False
    x_shape, w_shape = _static_shape(func.params[0]), _static_shape(func.params[w_index])
    weight = args[w_index]
    return (x_shape is not None and w_shape is not None and len(w_shape) == 2 and x_shape[-1] == w_shape[1]
            and math.prod(x_shape[:-1]) <= DECODE_ROWS and isinstance(weight, tvm.ir.expr.Constant))


def _is_prologue(mod: IRModule, func: relax.Function) -> bool:
    """Elementwise (every PrimFunc injective) or an RMSNorm followed by injective ones."""
    if not isinstance(func.body, relax.SeqExpr) or len(func.body.blocks) != 1:
        return False
    calls = _prim_calls(mod, func)
    heavy = [(c, p) for c, p in calls if _pattern(p) > INJECTIVE]
    if not heavy:
        return bool(calls)
    # TVM's legalized ``nn.rms_norm`` (``rewrites.rms_norms`` makes models' norms that op)
    return len(heavy) == 1 and heavy[0][0].args[0].name_hint.startswith("rms_norm")


def _static_shape(var) -> list[int] | None:
    ty = getattr(var, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    values = ty.shape.values
    return [int(v) for v in values] if all(isinstance(v, tvm.tirx.IntImm) for v in values) else None


def _merged(producer: relax.Function, gemv: relax.Function) -> relax.Function:
    """One fused function: ``producer``'s bindings, then ``gemv``'s reading the producer's result
    as its parameter 0. Parameters: the producer's, then the GEMV's others, renamed where a name
    repeats (FuseTIR names the PrimFunc's buffers after them, and the analysis tells inputs apart
    by name)."""
    producer, gemv = copy_with_new_vars(producer), copy_with_new_vars(gemv)
    taken = {p.name for p in producer.params}
    substitute, params = {gemv.params[0]: producer.body.body}, list(producer.params)
    for p in gemv.params[1:]:
        name, n = p.name, 0
        while name in taken:
            n += 1
            name = f"{p.name}_{n}"
        taken.add(name)
        if name != p.name:
            substitute[p] = relax.Var(name, p.ty)
        params.append(substitute.get(p, p))
    bound = gemv.bind_params(substitute)
    bindings = [*producer.body.blocks[0].bindings, *bound.body.blocks[0].bindings]
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], bound.body.body)
    return relax.Function(params, body, bound.ret_ty, attrs=gemv.attrs)
