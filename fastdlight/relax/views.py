"""Views folded into the matmuls that read them: attention's head split without copies.

``torch.export`` writes attention's ``qkv.reshape(b, s, 3, h, d).permute(2, 0, 3, 1, 4)``, the
slices of it and ``k.transpose(-1, -2)`` as view operators; FuseOps makes them copy kernels
(``fused_strided_slice_transpose1_squeeze_reshape2``...) that write Q, K and V out of the QKV
projection's output for the attention matmuls to read, and a copy of the attention output back
to ``[tokens, h * d]`` for the output projection. On an H100 these copies took 9 µs of a
132 µs LLaMA layer at one sequence of 512 tokens, more than torch.compile's single copy. (An
unbound weight's transpose is such a copy too, at every call.)

The wgmma template loads its operands with TMA, whose tensor maps take any strides:
:func:`fold_views` lets a matmul read the view's source directly. A *view* is a fused function
that only moves elements (every block a plain load, its indices simplifying to one element of
its one input per output element). A matmul function reading a view's output gets the view's
input in its place, its loads indexed through the view; the fold is kept where the wgmma
template takes the result (``match_wgmma``: each operand a TMA box of the source) and every
reader of the view folds it, so the copy kernel goes away. Only where the target has wgmma.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, sym, tirx
from tvm.ir import IRModule
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.s_tir.dlight.analysis import get_root_block

from fastdlight.arch import CUDA
from fastdlight.analysis.prepare import scalar_dtype
from fastdlight.analysis.wgmma_match import match_wgmma
from fastdlight.analysis.wgmma_view import as_dtype, substitute
from fastdlight.relax.rewrites import mutator_pass

CALL_TIR = tvm.ir.Op.get("relax.call_tir")
#: rounds of folding (views of views: attention's permuted QKV, then its slices)
MAX_ROUNDS = 4


@dataclass(frozen=True)
class View:
    """``out[v] = src[index(v)]``: the element each output element is."""

    src: tirx.Buffer
    out_vars: tuple  # tirx.Var per output axis
    index: tuple  # tirx.PrimExpr per source axis, in ``out_vars``
    #: all the elements in their order (a reshape): TVM makes it a free view at run time, which
    #: folding would not improve on (and stock Dlight's schedule of the matmul then suffers)
    in_order: bool = False

    def at(self, indices) -> list:
        """The source's indices of the output element at ``indices``."""
        binding = [(v, as_dtype(scalar_dtype(v), i)) for v, i in zip(self.out_vars, indices)]
        return [sym.Analyzer().simplify(substitute(e, binding)) for e in self.index]


def view_of(func: tirx.PrimFunc) -> View | None:
    """The view ``func`` is (one input, one output, only element moves), else None."""
    if len(func.params) != 2:
        return None
    src, out = func.params
    try:
        sch = s_tir.Schedule(func)
        root = get_root_block(sch)
        blocks = sch.get_child_blocks(root)
        for block in blocks[:-1]:
            sch.compute_inline(block)
        last = sch.get(sch.get_child_blocks(root)[-1])
    except Exception:  # noqa: BLE001 - not a chain of inlinable element moves
        return None
    store = last.body
    if not isinstance(store, tirx.BufferStore) or not store.buffer.same_as(out) or len(last.iter_vars) != len(out.shape):
        return None
    load = store.value
    if not isinstance(load, ir.TensorLoad) or not load.source.same_as(src):
        return None
    if any(iv.iter_type != tirx.IterVar.DataPar for iv in last.iter_vars):
        return None
    if not all(isinstance(i, tirx.Var) and i.same_as(iv.var) for i, iv in zip(store.indices, last.iter_vars)):
        return None
    ana = sym.Analyzer()
    for iv in last.iter_vars:
        ana.bind(iv.var, iv.dom)
    index = tuple(ana.simplify(i) for i in load.indices)
    out_vars = tuple(iv.var for iv in last.iter_vars)
    offset = ana.simplify(_flat(index, src.shape) - _flat(out_vars, out.shape))
    same_size = ana.simplify(_size(src.shape) - _size(out.shape))
    reshape = all(isinstance(x, tirx.IntImm) and x.value == 0 for x in (offset, same_size))
    return View(src, out_vars, index, reshape)


def _size(shape):
    size = tirx.const(1, scalar_dtype(shape[0]) if len(shape) else "int64")
    for extent in shape:
        size = size * extent
    return size


def _flat(indices, shape):
    """The row-major offset of ``indices`` in a tensor of ``shape``."""
    offset = tirx.const(0, scalar_dtype(indices[0]) if indices else "int64")
    for i, extent in zip(indices, shape):
        offset = offset * extent + i
    return offset


def fold_view(func: tirx.PrimFunc, param_index: int, view: View) -> tirx.PrimFunc:
    """``func`` reading ``view``'s source where it read its parameter ``param_index`` (the view's
    output): the parameter becomes a buffer of the source's shape, each load goes through the
    view, each read region of it becomes the whole source."""
    old = func.params[param_index]
    new = tirx.decl_buffer(view.src.shape, view.src.dtype, str(old.name))

    def load(node):
        return tirx.BufferLoad(new, view.at(node.indices)) if node.source.same_as(old) else node

    def region(node):
        if node.source.same_as(old):
            return tirx.BufferRegion(new, [ir.Range.from_min_extent(tirx.const(0, scalar_dtype(e)), e) for e in new.shape])
        return node

    body = tvm_ffi.structural_map(func.body, [(ir.TensorLoad, load), (ir.TensorRegion, region)])
    params = list(func.params)
    params[param_index] = new
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs)


def fold_views(target=None) -> tvm.transform.Pass:
    """After FuseTIR: every view whose readers all become matmuls the wgmma template takes once
    the view is folded into them is folded, and the view's kernel dropped (module docstring).
    Not applied where the target (or the current one) has no wgmma."""

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.FoldViews")
    def run(mod: IRModule, _ctx) -> IRModule:
        t = target if target is not None else tvm.target.Target.current(allow_none=True)
        if t is None or not CUDA(t).has_wgmma:
            return mod
        for _ in range(MAX_ROUNDS):  # a view of a view folds once the first is in the matmul
            views = {gv: v for gv, f in mod.functions_items()
                     if isinstance(f, tirx.PrimFunc) and (v := view_of(f)) is not None and not v.in_order}
            folds = {}
            for func in mod.functions.values():
                if views and isinstance(func, relax.Function):
                    try:
                        folds.update(_plan(func, mod, views))
                    except Exception as e:  # noqa: BLE001 - an optimization: the copies still compute
                        warnings.warn(f"fastdlight: views left as copy kernels ({type(e).__name__}: {e})",
                                      stacklevel=2)
            if not folds:
                break
            mod = mutator_pass("fastdlight.FoldViews", _rewriter(folds), relax.transform.DeadCodeElimination())(mod)
        return mod

    return run


@dataclass(frozen=True)
class _Fold:
    """A reader's new call: its function with the views folded in, and its arguments."""

    func: tirx.PrimFunc
    args: tuple
    views: tuple  # the arguments (views' results) it no longer reads


def _plan(func: relax.Function, mod: IRModule, views: dict) -> dict:
    """{reader call: _Fold} for the calls of ``func`` that read views: each view goes where
    every call reading it takes it as a matmul operand (the view's copy then goes)."""
    values = relax.analysis.get_var2val(func)

    def is_view(arg):
        return arg in values and _view_call(values[arg], views) is not None

    readers = {}  # view var -> [reader calls]
    for value in values.values():
        for arg in _call_tir_args(value):
            if is_view(arg) and not any(c.same_as(value) for c in readers.get(arg, [])):
                readers.setdefault(arg, []).append(value)
    calls = {c for cs in readers.values() for c in cs}
    taken = {c: fold.views for c in calls if (fold := _folded(mod, c, values, views, is_view)) is not None}
    folded = [v for v, cs in readers.items() if all(c in taken and any(v.same_as(t) for t in taken[c]) for c in cs)]
    out = {}
    for call in taken:
        fold = _folded(mod, call, values, views, lambda a: any(a.same_as(v) for v in folded))
        if fold is not None:
            out[call] = fold
    return out


def _folded(mod, call, values, views, chosen) -> _Fold | None:
    """``call`` with its matmul operands among the arguments ``chosen`` (views' results)
    replaced by the views' inputs, the views folded into the function, where the wgmma
    template takes the result; else None. An epilogue's read through a view is left alone: it
    gains nothing."""
    prim = mod[call.args[0]]
    fields = list(call.args[1].fields)
    positions = [pos for pos, arg in enumerate(fields) if chosen(arg)]
    for _ in range(2):
        folded, args = prim, list(fields)
        for pos in positions:
            folded = fold_view(folded, pos, views[values[fields[pos]].args[0]])
            args[pos] = values[fields[pos]].args[1].fields[0]
        match = match_wgmma(folded)[0] if positions else None
        if match is None:
            return None
        operands = [pos for pos in positions if str(prim.params[pos].name) in (match.a_name, match.b_name)]
        if operands == positions:
            return _Fold(folded, tuple(args), tuple(fields[pos] for pos in positions))
        positions = operands  # again without the epilogue's reads
    return None


def _call_tir_args(value) -> list:
    if isinstance(value, relax.Call) and value.op.same_as(CALL_TIR):
        return list(value.args[1].fields)
    return []


def _view_call(value, views):
    """``value`` when it is a call of a view on one argument, else None."""
    args = _call_tir_args(value)
    return value if len(args) == 1 and value.args[0] in views else None


def _rewriter(folds: dict):
    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            fold = folds.get(call)
            if fold is None:
                return super().visit_call_(call)
            hint = call.args[0].name_hint
            name = hint if hint.endswith("_view") else f"{hint}_view"
            gv = self.builder_.add_func(fold.func, name)
            return relax.call_tir(gv, [self.visit_expr(a) for a in fold.args], call.ty_args[0])

    return Rewriter
