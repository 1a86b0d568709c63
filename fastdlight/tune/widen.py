"""The float64 twin of a PrimFunc and its naive schedule: the reference a tuning run checks
candidates against when no numpy reference is given (see :mod:`fastdlight.tune.reference`).
Nothing here is shared with any template; the schedule is stock Dlight's Fallback rule alone."""

from __future__ import annotations

import re

import tvm
from tvm import ir, tirx

from .verify import _expr_dtype, _is_float, _walk

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
    narrow = sorted({_expr_dtype(e) for e in _walk(wide, ir.Expr)
                     if _is_float(_expr_dtype(e)) and _expr_dtype(e) != "float64"})
    if narrow:  # float8/float4 data, or a spelling the rewrite missed
        raise ValueError(f"could not widen {', '.join(narrow)} values to float64")
    return wide


def _refuse_unwidenable(func: tirx.PrimFunc) -> None:
    for call in _walk(func.body, ir.Call):
        name = str(getattr(call.op, "name", "")).rsplit(".", 1)[-1]
        if name == "reinterpret":
            raise ValueError("the function reinterprets bits; it has no float64 twin")
        floats = [_expr_dtype(call)] + [_expr_dtype(a) for a in call.args]
        if name in _EXTERN and any(map(_is_float, floats)):
            raise ValueError(f"the function calls the external routine {call.args[0]} on floats; "
                             "it has no float64 twin")


def naive_reference_module(func: tirx.PrimFunc, target) -> tvm.IRModule:
    """The float64 twin of ``func`` (:func:`widen_to_float64`) under stock Dlight's Fallback
    rule only: injective blocks inlined, one thread per output element, every reduction serial
    in its thread; no tiling, nothing shared with any template. Ready for ``tvm.compile``."""
    from tvm.s_tir import dlight as dl

    wide = widen_to_float64(func)
    if wide.attrs is None or "global_symbol" not in wide.attrs:
        wide = wide.with_attr("global_symbol", "main")
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(tvm.IRModule({"main": wide}))
    if not any(f.kind == tirx.ForKind.THREAD_BINDING for f in _walk(mod["main"].body, tirx.For)):
        raise ValueError("the naive schedule (Dlight Fallback) does not apply to this function "
                         "(not in block form, or its loops cannot be normalized)")
    return mod
