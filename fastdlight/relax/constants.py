"""Values a model computes without reading its inputs, computed once at compile time.

Hugging Face's causal-LM models build their attention masks from ``arange``'d positions
(``cache_position``), not from the tokens: GPT-2's graph at 1x512 spends a chain of small kernels
per forward pass on it (gathers of the positions, a ``cumsum``, comparisons, ``where``), none of
which depends on the input. Relax's FoldConstant leaves the chain alone: it does not fold a
call whose result is larger than its arguments, and ``arange`` has none.

:func:`input_independent_values` evaluates every value of ``main`` that depends on no parameter
and no weight (a constant of more than :data:`WEIGHT_BYTES`: weights are ``prepare``'s to fold)
and that a parameter-dependent value (or the output) uses, on the host (an LLVM build of the
bindings that make them), and binds the results as constants. Comparisons of bools are compared
as int8 there: LLVM rejects an ``fcmp`` of ``i1`` operands, which TVM emits for them.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.ir import IRModule
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.relax.rewrites import call_to, constant_value, mutator_pass, static_shape

#: the most bytes of constants the evaluated values may add to a model (a mask is B*TQ*TKV)
MAX_BYTES = 256 * 2**20
#: a value that reads a constant larger than this (a weight) is left to prepare's FoldConstant
WEIGHT_BYTES = 2**20
#: the host target of values computed once: LLVM without optimizations. Swin-T's 61 values
#: (its window masks and relative position indices, 450 small functions) took 4.1 s to compile
#: and 4.0 s to load at LLVM's default level, 0.8 and 2.3 s at level 0 (the same bytes; 2026-11-30)
HOST_ONCE = {"kind": "llvm", "opt-level": 0}
#: comparisons whose bool operands are compared as int8 on the host
BOOL_COMPARISONS = ("relax.equal", "relax.not_equal")


def input_independent_values(max_bytes: int = MAX_BYTES) -> tvm.transform.Pass:
    """See the module docstring. A module whose values cannot be evaluated (a build error) or
    would add more than ``max_bytes`` of constants is returned as it was."""

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.InputIndependentValues")
    def run(mod: IRModule, _ctx) -> IRModule:
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()] or not isinstance(mod["main"], relax.Function):
            return mod
        flat = relax.transform.ToNonDataflow()(mod)
        main = flat["main"]
        independent, frontier = _split(main)
        sizes = [_nbytes(v) for v in frontier]
        if not frontier or None in sizes or sum(sizes) > max_bytes:
            return mod
        try:
            values = _evaluate(flat, independent, frontier)
        except Exception:  # noqa: BLE001 - the values stay computed at run time
            return mod
        consts = {v: relax.const(value) for v, value in zip(frontier, values)}
        # the independent bindings that are constants already stay (the frontier leaves them
        # out: nothing to evaluate); DeadCodeElimination drops those no kept value reads
        kept = [relax.VarBinding(b.var, consts[b.var]) if b.var in consts else b
                for b in _bindings(main) if b.var in consts or b.var not in independent
                or isinstance(b.value, tvm.ir.expr.Constant)]
        body = relax.SeqExpr([relax.BindingBlock(kept)], main.body.body)
        flat["main"] = relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
        seq = tvm.transform.Sequential([relax.transform.ConvertToDataflow(), relax.transform.DeadCodeElimination()])
        return seq(flat)

    return run


def fold_weight_layouts() -> tvm.transform.Pass:
    """``permute_dims``, reshapes and casts of constants (a model's weights, as the exporter and
    ToMixedPrecision leave them: transposed linear weights, fp16 copies) computed with numpy.
    Run before LegalizeOps: FoldConstant builds and runs an LLVM function for each of them
    (EfficientNet-B0: 300, 17.8 s of ``prepare``'s 18.9 on two cores)."""

    @mutator
    class Folder(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call_to(call, "relax.reshape") is not None:
                value, shape = constant_value(self, call.args[0]), static_shape(call)
                value = None if value is None or shape is None else value.reshape(shape)
            elif call_to(call, "relax.permute_dims", "relax.astype") is not None:
                value = constant_value(self, call)  # casts to fp16, bf16 and fp32 only
            else:
                return call
            return call if value is None else relax.const(value, str(call.ty.dtype))

    return mutator_pass("fastdlight.FoldWeightLayouts", Folder)


def _bindings(func: relax.Function) -> list:
    return [b for block in func.body.blocks for b in block.bindings]


def _split(main: relax.Function):
    """(the bindings that read no parameter, by var; those of them a parameter-dependent value
    or the output uses, as a list of vars in binding order)."""
    dependent = set(main.params)
    independent = {}
    for b in _bindings(main):
        if not isinstance(b, relax.VarBinding) or not _pure(b.value) or _reads_a_weight(b.value) \
                or any(v in dependent for v in relax.analysis.free_vars(b.value)):
            dependent.add(b.var)
        else:
            independent[b.var] = b
    used = set(relax.analysis.free_vars(main.body.body))
    for b in _bindings(main):
        if b.var in dependent and b.var not in main.params:
            used.update(relax.analysis.free_vars(b.value))
    frontier = [v for v, b in independent.items() if v in used and not isinstance(b.value, tvm.ir.expr.Constant)]
    return independent, frontier


def _pure(value) -> bool:
    if isinstance(value, relax.Call):
        return isinstance(value.op, tvm.ir.Op) and not value.op.name.startswith(("relax.call_", "relax.print"))
    return isinstance(value, (relax.Tuple, relax.TupleGetItem, relax.Var, tvm.ir.expr.Constant))


def _reads_a_weight(value) -> bool:
    found = []
    relax.analysis.post_order_visit(value, lambda e: found.append(e) if isinstance(e, tvm.ir.expr.Constant) else None)
    return any((_nbytes(c) or 0) > WEIGHT_BYTES for c in found)


def _nbytes(expr) -> int | None:
    """Bytes of a tensor-typed expression of static shape, else None."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        dims = [int(d) for d in ty.shape.values]
    except (TypeError, AttributeError):
        return None
    return math.prod(dims) * max(1, tvm.DataType(str(ty.dtype)).bits // 8)


def _evaluate(flat: IRModule, independent: dict, frontier: list) -> list[np.ndarray]:
    body = relax.SeqExpr([relax.BindingBlock(list(independent.values()))], relax.Tuple(frontier))
    consts = flat.clone()
    consts["main"] = relax.Function([], body, relax.TupleType([v.ty for v in frontier]))
    consts = bool_comparisons_as_int8()(consts)
    out = relax.VirtualMachine(tvm.compile(consts, target=tvm.target.Target(HOST_ONCE)), tvm.cpu())["main"]()
    return [out[i].numpy() for i in range(len(frontier))]


def bool_comparisons_as_int8() -> tvm.transform.Pass:
    """``equal``/``not_equal`` of bools as the same comparison of their int8 casts."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            cmp = call_to(call, *BOOL_COMPARISONS)
            if cmp is None or any(str(getattr(a.ty, "dtype", "")) != "bool" for a in cmp.args):
                return call
            a, b = (relax.op.astype(x, "int8") for x in cmp.args)
            return relax.op.equal(a, b) if cmp.op.name == "relax.equal" else relax.op.not_equal(a, b)

    return mutator_pass("fastdlight.BoolComparisonsAsInt8", Rewriter)
