"""Which check each output of a function gets, read from its TIR blocks: the sum-of-products
bound or the elementwise one, K, the accumulator and the narrowest float on the way (the rule
is stated in :mod:`fastdlight.measure.verify`'s docstring, which uses it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

import tvm_ffi
from tvm import ir, tirx
from tvm.s_tir.stmt import SBlock

from fastdlight.analysis.attention import match_attention
from fastdlight.measure import host
from fastdlight.measure.workload import output_indices, param_buffers

#: unit roundoff (half an ulp at 1.0) per float dtype; integers are exact (0)
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53,
                 "float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3}
#: the accumulator of a float32 sum of 8-bit float products: Hopper's tensor cores keep about 14
#: bits of such a running sum (as torch's ``_scaled_mm(use_fast_accum=True)`` and cuBLAS's fast
#: accumulation do): on an H200 every wgmma tile of a 1000x520x272 e4m3 GEMM erred by up to 0.0042
#: (6e-5 of S) at the same elements, where the float32 bound allowed 1.2e-4
FP8_MMA_ACC = "float32_fp8_mma"
UNIT_ROUNDOFF[FP8_MMA_ACC] = 2.0**-14

@dataclass(frozen=True)
class CheckKind:
    """How one output is checked (see the module docstring): the bound, K (additions feeding
    it), the accumulator dtype (``""`` when nothing accumulates), the least precise float any
    value feeding it is rounded to, and the output buffer's name."""

    sum_of_products: bool
    k: int
    acc_dtype: str
    narrow_dtype: str
    output: str = ""
    #: the least precise float an intermediate buffer holds ("" when none): a value rounded
    #: there errs relative to itself, and a later addend (a bias) may cancel it in the output
    inner_dtype: str = ""

    @property
    def bound(self) -> str:
        return "sum-of-products bound" if self.sum_of_products else "elementwise tolerance"


# -- how each output is checked ----------------------------------------------------------------
def is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def unit_roundoff(dtype: str) -> float:
    return UNIT_ROUNDOFF.get(str(dtype), UNIT_ROUNDOFF["float32"]) if is_float(dtype) else 0.0


def _least_precise(dtypes) -> str:
    floats = [d for d in dtypes if is_float(d)]
    return max(floats, key=unit_roundoff) if floats else ""


def expr_dtype(node) -> str:
    """An expression's dtype (TVM 0.27 keeps it in the expression's type, ``ty``)."""
    return str(getattr(getattr(node, "ty", None), "dtype", ""))


def walk_exprs(node, cls) -> list:
    found = []
    tvm_ffi.structural_walk(node, (cls, found.append), order="pre")
    return found


def _leaf_blocks(func: tirx.PrimFunc) -> list:
    """Blocks holding no other block (the root block is left out)."""
    return [b for b in walk_exprs(func.body, SBlock) if len(walk_exprs(b.body, SBlock)) == 0]


def _feeding(out, blocks) -> list:
    """The blocks that write ``out`` and, transitively, every buffer they read."""
    writers: dict = {}
    for b in blocks:
        for w in b.writes:
            writers.setdefault(w.source, []).append(b)
    if out not in writers:
        return list(blocks)  # not found through the regions: judge by every block
    todo, seen, found = [out], set(), []
    while todo:
        buf = todo.pop()
        if buf in seen:
            continue
        seen.add(buf)
        for b in writers.get(buf, ()):
            if not any(b.same_as(f) for f in found):
                found.append(b)
                todo += [r.source for r in b.reads]
    return found


def _reduction(block) -> tuple[str, int]:
    """("sum" | "extreme" | "other", K) of a reduction block, ("", 1) for a spatial one."""
    red = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if not red:
        return "", 1
    k = math.prod(int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else 1 for iv in red)
    store = block.body
    if isinstance(store, tirx.BufferStore) and isinstance(store.value, (tirx.Add, tirx.Max, tirx.Min)):
        v = store.value
        if any(isinstance(s, ir.TensorLoad) and s.source.same_as(store.buffer) for s in (v.a, v.b)):
            return ("sum" if isinstance(v, tirx.Add) else "extreme"), k
    return "other", k


def _plain_condition(cond) -> bool:
    """A condition that reads no float or signed data (padding bounds on indices): it picks
    the same branch when the inputs are |inputs|."""
    for e in walk_exprs(cond, ir.Expr):
        if is_float(expr_dtype(e)):
            return False
        if isinstance(e, ir.TensorLoad) and not str(e.source.dtype).startswith(("uint", "bool")):
            return False
    return True


def _bounded(e) -> bool:
    """Whether ``e`` run on |inputs| bounds |e| and each term's magnitude (module docstring)."""
    if isinstance(e, (ir.TensorLoad, ir.Var)):
        return True  # an integer's sign matters where it becomes a float (Cast, below)
    if isinstance(e, (tirx.FloatImm, tirx.IntImm)):
        return e.value >= 0
    if isinstance(e, tirx.Cast):
        v = e.value
        if is_float(expr_dtype(v)):
            return _bounded(v)
        return (isinstance(v, ir.TensorLoad) and str(v.source.dtype).startswith(("uint", "bool"))) or (
            isinstance(v, tirx.IntImm) and v.value >= 0)
    if isinstance(e, (tirx.Add, tirx.Mul, tirx.Max)):
        return _bounded(e.a) and _bounded(e.b)
    if isinstance(e, tirx.Div):
        return _bounded(e.a) and isinstance(e.b, (tirx.FloatImm, tirx.IntImm)) and e.b.value > 0
    if isinstance(e, tirx.Select):
        return _plain_condition(e.condition) and _bounded(e.true_value) and _bounded(e.false_value)
    if isinstance(e, ir.Call) and str(e.op.name).endswith(".if_then_else"):
        cond, then, other = e.args
        return _plain_condition(cond) and _bounded(then) and _bounded(other)
    return False


def _kind_of(out, blocks) -> CheckKind:
    reductions = [(b, *_reduction(b)) for b in blocks]
    accumulating = [(b, k) for b, how, k in reductions if how in ("sum", "other")]
    only_sums = all(how in ("", "sum") for _, how, _ in reductions)
    values = [s.value for b in blocks for s in walk_exprs(b.body, (tirx.BufferStore, tirx.Bind))]
    sop = bool(accumulating) and only_sums and all(map(_bounded, values))
    acc = _least_precise(str(w.source.dtype) for b, _ in accumulating for w in b.writes)
    if acc == "float32" and any(str(e.source.dtype).startswith("float8") for b, _ in accumulating
                                for e in walk_exprs(b.body, ir.TensorLoad)):
        acc = FP8_MMA_ACC
    # roundings: every stored value and computed expression; loads of inputs are exact values
    rounded = [str(w.source.dtype) for b in blocks for w in b.writes] + [str(out.dtype)]
    for b in blocks:
        rounded += [expr_dtype(e) for e in walk_exprs(b.body, ir.Expr)
                    if not isinstance(e, (ir.TensorLoad, ir.Var, tirx.FloatImm))]
    inner = _least_precise(str(w.source.dtype) for b in blocks for w in b.writes if not w.source.same_as(out))
    return CheckKind(sop, max(1, sum(k for _, k in accumulating)), acc,
                     _least_precise(rounded) or str(out.dtype), str(out.name), inner)


def output_kinds(func: tirx.PrimFunc) -> tuple[CheckKind, ...]:
    """How each output of ``func`` (in :func:`~fastdlight.measure.workload.output_indices` order)
    is checked; see the module docstring for the rule."""
    params = param_buffers(func)
    attention = match_attention(func)
    if attention is not None:
        # a weighted average: Σ_j p_j v_j with the weights p_j rounded to 16 bits (the
        # probabilities that feed the tensor cores) errs relative to Σ_j p_j |v_j|, which the
        # magnitude run gives (see absolute_inputs), not relative to the average, which cancels
        out = params[output_indices(func)[0]]
        return (CheckKind(True, attention.seq_kv, "float32", attention.dtype, str(out.name), attention.dtype),)
    blocks = _leaf_blocks(func)
    return tuple(_kind_of(params[i], _feeding(params[i], blocks)) for i in output_indices(func))


#: which part of an input the magnitude run takes as absolute values: all of it (True), none
#: (False), or the elements an index selects (a tuple of slices)
AbsolutePart = Union[bool, tuple[slice, ...]]


def absolute_inputs(func: tirx.PrimFunc, count: int) -> tuple[AbsolutePart, ...]:
    """Which of the ``count`` inputs the magnitude run takes as absolute values (see
    :data:`AbsolutePart`): all, except in an attention function, where only V is: its softmax
    weights must stay the function's own, and with |V| the run gives each output's
    Σ_j p_j |v_j| (in a packed QKV tensor, V's heads)."""
    shape = match_attention(func)
    if shape is None:
        return (True,) * count
    if shape.layout == "packed" and count == 1:
        first, last = shape.value_heads
        return ((slice(None), slice(None), slice(first, last), slice(None)),)
    return (False, False, True) if count == 3 else (True,) * count


def take_absolute(a: np.ndarray, part: AbsolutePart) -> np.ndarray:
    """``a`` with :data:`AbsolutePart` ``part`` of it in absolute values (a new array unless
    ``part`` is False)."""
    if part is False:
        return a
    if part is True:
        return host.absolute(a)
    out = np.array(a, copy=True)
    out[part] = np.abs(out[part])
    return out


def wants_own_dtype_run(func: tirx.PrimFunc) -> bool:
    """Whether an output takes the elementwise bound through a 16-bit (or narrower) float, where
    the function's own arithmetic may cancel beyond it (see the module docstring)."""
    return any(not k.sum_of_products and unit_roundoff(k.narrow_dtype) >= UNIT_ROUNDOFF["float16"]
               for k in output_kinds(func))


def check_kind(func: tirx.PrimFunc) -> CheckKind:
    """The check of ``func``'s first output (:func:`output_kinds` for every output)."""
    return output_kinds(func)[0]
