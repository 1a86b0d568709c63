"""Strict, per-element verification of a candidate's outputs against an independent reference.

Every element is checked; NaN/Inf where the reference is finite always fails; a failure says
how many elements failed, of how many, and the worst one (index, got, expected, allowed).

Two kinds of bound (chosen per function by :func:`check_kind`):

* **sum of products** (matmul, conv, GEMV, sum reductions and their add/mul/cast/relu
  epilogues): the error of element i is bounded by the magnitudes that formed it,

      |out_i - ref_i| <= C_SUM * u(acc) * sqrt(K) * S_i  +  C_OUT * u(out) * |ref_i|  +  FLOOR

  where S is the same function run on |inputs| (the reference run on absolute values), K the
  longest reduction, u the unit roundoff (half an ulp) of the accumulator dtype (the output
  dtype of the reduction block: what TIR says the sum is carried in) and of the stored output.
  sqrt(K)·u·S is the probabilistic bound of Higham & Mary (SIAM J. Sci. Comput. 2019) for any
  summation order, split-K and tree orders included. With C_SUM = 1 it is still far above what
  correct kernels show on our zero-mean random inputs (there the error is near u·S: measured
  below 1/10 of the bound for fp16 accumulation over K = 4096, tests/tune/test_verify.py), while
  a sign flip, a zeroed or shifted row, a dropped tile or a NaN exceed it. It is loosest for
  fp16 accumulators over long K (±32 on outputs of magnitude ~20 at K = 4096): there only the
  larger wrong elements stand out, because such kernels are that imprecise. The second term is
  the final rounding to an fp16/bf16 output (and one more for epilogue casts), in the least
  precise float the function computes in. A max/min against anything but a constant (a mask)
  makes a function "everything else": min(|x|, |m|) bounds nothing.
* **everything else** (elementwise, max/min reductions, softmax/norm chains):

      |out_i - ref_i| <= RTOL * (|ref_i| + rms(ref)),  RTOL = C_REL * u(out) * sqrt(K_internal)

  rms(ref) is the scale-aware absolute part: elements near zero are judged relative to the
  output's own scale. u is that of the least precise float the function computes in (an fp32
  output of an fp16 GEMV is only as precise as fp16). K_internal (1 without reductions) widens it for internal reductions
  (a softmax row sum, a norm's variance).

Integers must match exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, tirx
from tvm.s_tir.stmt import SBlock

from .measure import param_buffers

#: unit roundoff (half an ulp at 1.0) per dtype
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
#: multiplier of the Higham-Mary sqrt(K)·u·S accumulation bound (see the module docstring)
C_SUM = 1.0
#: roundings of the stored result (the final cast, plus one in an epilogue)
C_OUT = 2.0
#: multiplier of the elementwise relative tolerance (a few roundings per element)
C_REL = 8.0
#: absolute floor for sums of products: far below any fp16 normal (6.1e-5) yet above fp32 noise
FLOOR = 1e-6
#: float expressions that keep a function a sum of products (its bound by |inputs| holds)
_POLYNOMIAL = (tirx.Add, tirx.Mul, tirx.Cast, tirx.Max, tirx.Min, ir.TensorLoad, tirx.FloatImm, tirx.Select, ir.Var)


@dataclass(frozen=True)
class CheckKind:
    """How a function's outputs are checked: ``sum_of_products`` or ``elementwise``, with the
    reduction length K and the accumulator dtype the bound uses."""

    sum_of_products: bool
    k: int
    acc_dtype: str
    #: the least precise float dtype the function computes in (an fp16 intermediate bounds
    #: the precision of an fp32 output)
    narrow_dtype: str = "float32"


@dataclass(frozen=True)
class Expected:
    """What a candidate must produce: the reference outputs, the same run on |inputs| (None
    unless sums of products), how to compare, and the reference's name."""

    outputs: tuple[np.ndarray, ...]
    magnitudes: tuple[np.ndarray, ...] | None
    kind: CheckKind
    reference: str


@dataclass(frozen=True)
class Verdict:
    ok: bool
    bad: int  # elements out of bound
    total: int
    message: str
    reference: str

    @classmethod
    def passed(cls, reference: str, message: str, total: int = 0) -> Verdict:
        return cls(True, 0, total, message, reference)

    @classmethod
    def failed(cls, message: str, reference: str, bad: int = 0, total: int = 0) -> Verdict:
        return cls(False, bad, total, message, reference)


# -- what kind of function is it --------------------------------------------------------------
def _blocks(func: tirx.PrimFunc) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, (SBlock, found.append), order="post")
    return found


def _is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def check_kind(func: tirx.PrimFunc) -> CheckKind:
    """Sum of products when every reduction adds into itself and every float expression is an
    add, mul, cast, max, min, select, load or constant (so running the function on |inputs|
    bounds the magnitude of every term)."""
    reductions = []
    for block in _blocks(func):
        extents = [int(iv.dom.extent) for iv in block.iter_vars
                   if iv.iter_type == tirx.IterVar.CommReduce and isinstance(iv.dom.extent, tirx.IntImm)]
        if extents:
            reductions.append((math.prod(extents), block))
    k = max((n for n, _ in reductions), default=1)
    acc = next((str(b.writes[0].source.dtype) for n, b in reductions if n == k and b.writes), "float32")
    sums = bool(reductions) and all(_adds_into_itself(b) for _, b in reductions)
    floats = [str(b.dtype) for b in _all_buffers(func) if _is_float(b.dtype)] or ["float32"]
    narrow = max(floats, key=_u)
    return CheckKind(sums and _polynomial(func), k, acc, narrow)


def _expr_dtype(node) -> str:
    """An expression's dtype (TVM 0.27 keeps it in the expression's type, ``ty``)."""
    return str(getattr(getattr(node, "ty", None), "dtype", ""))


def _clamp(node) -> bool:
    """max/min against a constant (relu, a clamp): |inputs| still bound it; against another
    value (min(x, mask)) they do not."""
    return any(isinstance(_strip_casts(v), (tirx.FloatImm, tirx.IntImm)) for v in (node.a, node.b))


def _strip_casts(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _polynomial(func: tirx.PrimFunc) -> bool:
    other = []

    def visit(node):
        if not _is_float(_expr_dtype(node)):
            return
        if not isinstance(node, _POLYNOMIAL) or (isinstance(node, (tirx.Max, tirx.Min)) and not _clamp(node)):
            other.append(node)

    tvm_ffi.structural_walk(func.body, (ir.expr.Expr, visit), order="post")
    return not other


def _adds_into_itself(block) -> bool:
    body = block.body
    return isinstance(body, tirx.BufferStore) and isinstance(body.value, tirx.Add)


# -- comparing --------------------------------------------------------------------------------
def _u(dtype: str) -> float:
    return UNIT_ROUNDOFF.get(str(dtype), UNIT_ROUNDOFF["float32"])


def _allowed(ref: np.ndarray, mag: np.ndarray | None, kind: CheckKind, out_dtype: str) -> np.ndarray:
    if kind.sum_of_products and mag is not None:
        acc = C_SUM * _u(kind.acc_dtype) * math.sqrt(kind.k) * np.abs(mag)
        return acc + C_OUT * max(_u(out_dtype), _u(kind.narrow_dtype)) * np.abs(ref) + FLOOR
    rtol = C_REL * max(_u(out_dtype), _u(kind.narrow_dtype)) * math.sqrt(kind.k)
    rms = float(np.sqrt(np.mean(np.square(ref)))) if ref.size else 0.0
    return rtol * (np.abs(ref) + rms) + FLOOR


def _describe_worst(diff, allowed, out, ref) -> str:
    excess = np.where(np.isfinite(diff), diff - allowed, np.inf)
    flat = int(np.argmax(excess))
    idx = tuple(int(i) for i in np.unravel_index(flat, out.shape))
    return f"worst at {idx}: got {out.flat[flat]:.6g}, expected {ref.flat[flat]:.6g} (allowed ±{allowed.flat[flat]:.3g})"


def check_output(out: np.ndarray, ref: np.ndarray, mag: np.ndarray | None, kind: CheckKind,
                 out_dtype: str) -> tuple[int, str]:
    """(elements out of bound, worst element described) for one output."""
    if out.shape != ref.shape:
        return out.size or 1, f"shape {out.shape} != expected {ref.shape}"
    out64, ref64 = out.astype(np.float64), np.asarray(ref, dtype=np.float64)
    if not _is_float(out_dtype):
        bad = out64 != ref64
        return int(np.count_nonzero(bad)), (_describe_worst(np.abs(out64 - ref64), np.zeros_like(ref64), out64, ref64)
                                            if bad.any() else "")
    allowed = _allowed(ref64, None if mag is None else np.asarray(mag, dtype=np.float64), kind, out_dtype)
    diff = np.abs(out64 - ref64)
    finite_ref = np.isfinite(ref64)
    bad = (~np.isfinite(out64) & finite_ref) | (finite_ref & ~(diff <= allowed))
    n_bad = int(np.count_nonzero(bad))
    return n_bad, (_describe_worst(np.where(finite_ref, diff, 0.0), allowed, out64, ref64) if n_bad else "")


def check_outputs(outputs: Sequence[np.ndarray], expected: Expected, out_dtypes: Sequence[str]) -> Verdict:
    """Every element of every output within its bound, or a verdict saying how many were not."""
    if len(outputs) != len(expected.outputs):
        return Verdict.failed(f"{len(outputs)} outputs, the reference gave {len(expected.outputs)}",
                              expected.reference)
    total = sum(o.size for o in outputs)
    bad, worst = 0, ""
    mags = expected.magnitudes or (None,) * len(outputs)
    for out, ref, mag, dtype in zip(outputs, expected.outputs, mags, out_dtypes):
        n, desc = check_output(out, ref, mag, expected.kind, dtype)
        if n and not worst:
            worst = desc
        bad += n
    if bad:
        return Verdict.failed(f"{bad} of {total} elements out of bound; {worst}", expected.reference, bad, total)
    bound = "sum-of-products bound" if expected.kind.sum_of_products else "elementwise tolerance"
    return Verdict.passed(expected.reference, f"all {total} elements within the {bound}", total)


# -- references -------------------------------------------------------------------------------
def _as_list(out) -> list[np.ndarray]:
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def expected_from_numpy(ref: Callable, host_inputs: Sequence[np.ndarray], func: tirx.PrimFunc) -> Expected:
    """Run a float64 numpy reference on the inputs (and, for sums of products, on |inputs|)."""
    kind = check_kind(func)
    outputs = tuple(_as_list(ref(*host_inputs)))
    mags = None
    if kind.sum_of_products:
        mags = tuple(_as_list(ref(*[np.abs(a) if _is_float(a.dtype) else a for a in host_inputs])))
    return Expected(outputs, mags, kind, "float64 numpy reference")


def expected_from_outputs(outputs, abs_outputs, func: tirx.PrimFunc, name: str) -> Expected:
    kind = check_kind(func)
    return Expected(tuple(outputs), tuple(abs_outputs) if kind.sum_of_products else None, kind, name)


_FLOAT_NAME = re.compile(r'"b?float(16|32)"')
_FLOAT_TYPE = re.compile(r"\bT\.b?float(16|32)\b")  # constants T.float16(1) and types T.let[T.float32]


def widen_to_float64(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float buffer, intermediate, cast and constant in float64 (integers
    untouched). Done on the printed TVMScript with every buffer dtype spelled out, then parsed
    back: a rewrite of dtype names only, checked afterwards. A function that reinterprets bits
    (its float values are not the values it computes with) cannot be widened."""
    from tvm.runtime import script_printer

    # script() omits float32 buffer dtypes; a non-float default makes the printer spell them out
    text = script_printer._script(func, script_printer.PrinterConfig(buffer_dtype="int8",
                                                                      extra_config={"tirx.prefix": "T"}))
    if "T.reinterpret" in text:
        raise ValueError("the function reinterprets bits; it has no float64 twin")
    wide = tvm.script.from_source(_FLOAT_TYPE.sub("T.float64", _FLOAT_NAME.sub('"float64"', text)))
    narrow = [b.name for b in _all_buffers(wide) if _is_float(b.dtype) and str(b.dtype) != "float64"]
    if narrow:
        raise ValueError(f"could not widen buffer(s) {', '.join(narrow)} to float64")
    return wide


def _all_buffers(func: tirx.PrimFunc) -> list:
    bufs = list(param_buffers(func))
    for block in _blocks(func):
        bufs += list(block.alloc_buffers)
    return bufs


def naive_reference_module(func: tirx.PrimFunc, target) -> tvm.IRModule:
    """The float64 twin of ``func`` under stock Dlight's Fallback rule only: one thread per
    output element and serial reductions, no tiling, nothing shared with any template."""
    from tvm.s_tir import dlight as dl

    wide = widen_to_float64(func)
    if wide.attrs is None or "global_symbol" not in wide.attrs:
        wide = wide.with_attr("global_symbol", "main")
    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Fallback())(tvm.IRModule({"main": wide}))
