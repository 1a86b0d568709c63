"""What a PrimFunc must satisfy before it is analyzed: a value for every symbolic dimension
(``specialize``), offsets that fit its index dtype (``check_index_range``), and no target of its
own other than CUDA (``check_target``)."""

from __future__ import annotations

import math

import tvm.script
import tvm_ffi
from tvm import ir, tirx
from tvm.s_tir.stmt import SBlock

#: the largest element count an int32 offset can address
INT32_MAX = 2**31 - 1


def specialize(func: tirx.PrimFunc, opt_shapes: dict | None) -> tirx.PrimFunc:
    """Bind symbolic shape vars (by name) to the ints of ``opt_shapes``; raise ValueError
    naming every symbolic var left without a value.

    TVM specializes a buffer parameter only through dimensions that are bare vars, so each
    var is bound where it is defined: a scalar parameter, or a buffer whose symbolic dims are
    all bare vars. Buffers with composite dims (``n * 256``) follow from those bindings."""
    opt_shapes = dict(opt_shapes or {})
    missing = [n for n in shape_var_names(func) if n not in opt_shapes]
    if missing:
        raise ValueError(
            f"symbolic shape var(s) {', '.join(missing)} of {func_name(func)} need values: pass opt_shapes="
            + "{" + ", ".join(f"'{m}': <int>" for m in missing) + "} (or tune a dispatcher over several "
            "values with fastdlight.tune_dispatch)"
        )
    lists = [n for n, v in opt_shapes.items() if not isinstance(v, int)]
    if lists:
        raise ValueError(f"opt_shapes[{lists[0]!r}] = {opt_shapes[lists[0]]!r} is not one integer: several values "
                         "tune one kernel each behind a dispatcher (fastdlight.tune_dispatch)")
    binds, bound = {}, set()
    for p in func.params:
        shape = param_shape(p)
        if shape is None:  # a scalar parameter
            if str(p.name) in opt_shapes:
                binds[p] = tirx.IntImm(scalar_dtype(p), int(opt_shapes[str(p.name)]))
                bound.add(str(p.name))
            continue
        if all(isinstance(d, tirx.IntImm) for d in shape) or not all(
                isinstance(d, (tirx.IntImm, ir.expr.Var)) for d in shape):
            continue  # static, or composite dims: follows from the other bindings
        dims = [d if isinstance(d, tirx.IntImm) else tirx.IntImm(scalar_dtype(d), int(opt_shapes[str(d.name)]))
                for d in shape]
        binds[p] = tirx.decl_buffer(dims, str(p.dtype), name=str(p.name))
        bound.update(str(d.name) for d in shape if isinstance(d, ir.expr.Var))
    unbound = [n for n in shape_var_names(func) if n not in bound]
    if unbound:
        raise ValueError(f"symbolic var(s) {', '.join(unbound)} of {func_name(func)} appear only inside composite "
                         "dimensions (like n * 256): no parameter defines them, so they cannot be given a value")
    return func.specialize(binds) if binds else func


def shape_var_names(func: tirx.PrimFunc) -> list[str]:
    names = []
    for p in func.params:
        for d in param_shape(p) or ():
            names += [str(v.name) for v in tirx.analysis.undefined_vars(d)]
    return list(dict.fromkeys(names))


def scalar_dtype(v) -> str:
    return str(getattr(v.ty, "dtype", "int64"))


def param_shape(p):
    try:
        return list(p.shape)
    except (AttributeError, TypeError):
        return None


def params_agree(func: tirx.PrimFunc, want) -> bool:
    """Whether ``func``'s parameters are, in order, buffers of ``want``'s ``(dims, dtype)`` (what
    a function's shape attribute says of them): an int dim is that static size, any other the
    very expression (a symbolic length the function defines)."""
    if len(func.params) != len(want):
        return False
    for buf, (dims, dtype) in zip(func.params, want):  # TIRx parameters are the buffers themselves
        if getattr(buf, "shape", None) is None or str(buf.dtype) != dtype or len(buf.shape) != len(dims):
            return False
        if not all(_dim_is(x, d) for x, d in zip(buf.shape, dims)):
            return False
    return True


def _dim_is(dim, want) -> bool:
    if isinstance(want, int):
        return isinstance(dim, tirx.IntImm) and int(dim) == want
    return dim.same_as(want)


def func_name(func: tirx.PrimFunc) -> str:
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return "PrimFunc"


def check_index_range(func: tirx.PrimFunc) -> None:
    """Refuse a buffer too large for the int32 offsets its shape's dtype asks for (TVM would
    fail deep in lowering, or wrap around)."""
    for buf in _buffers(func):
        if not buf.shape or any(not isinstance(d, tirx.IntImm) for d in buf.shape):
            continue
        n = math.prod(int(d) for d in buf.shape)
        if n > INT32_MAX and all(scalar_dtype(d) == "int32" for d in buf.shape):
            raise ValueError(f"buffer {buf.name} has {n} elements, beyond int32 indexing; "
                             "declare its dimensions as T.int64 (or te.create_prim_func(..., index_dtype_override='int64'))")


def _buffers(func: tirx.PrimFunc) -> list:
    bufs = [p for p in func.params if getattr(p, "shape", None) is not None]
    tvm_ffi.structural_walk(func.body, (SBlock, lambda b: bufs.extend(b.alloc_buffers)), order="post")
    return bufs


def unique_buffer_names(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with no two buffers of one name. Relax's FuseTIR names a fused function's
    parameters after the Relax values passed in, and two values may share a name hint
    (EfficientNet's squeeze-excite scale and the feature map it scales were both ``lv9``); the
    analysis and a config's per-buffer vector widths tell buffers apart by name. A round trip
    through TVMScript renames the later ones (``lv9_1``) and changes nothing else."""
    names = [str(b.name) for b in _buffers(func)]
    if len(set(names)) == len(names):
        return func
    return tvm.script.from_source(func.script())


def as_prim_func(func) -> tirx.PrimFunc:
    """``func`` itself, or the one PrimFunc of an IRModule; a TypeError in one line naming what
    was given otherwise (the entry points' first check, before anything reads an attribute)."""
    if isinstance(func, tirx.PrimFunc):
        return func
    if isinstance(func, tvm.IRModule):
        prims = [f for _, f in func.functions_items() if isinstance(f, tirx.PrimFunc)]
        if len(prims) == 1:
            return prims[0]
        raise TypeError(f"expected a tirx.PrimFunc or an IRModule holding one; this IRModule holds {len(prims)} "
                        "PrimFuncs (pick one: mod[\"name\"], or tune a Relax model with ApplyFastTuning)")
    raise TypeError(f"expected a tirx.PrimFunc (or an IRModule holding one), got {type(func).__name__}")


def check_target(func: tirx.PrimFunc) -> None:
    """Refuse a function that carries a non-CUDA target of its own (a CPU kernel in a GPU model)."""
    target = func.attrs["target"] if func.attrs is not None and "target" in func.attrs else None
    if target is not None and target.kind.name != "cuda":
        raise ValueError(f"{func_name(func)} carries its own target ({target.kind.name}); fastdlight tunes CUDA "
                         "functions only")
