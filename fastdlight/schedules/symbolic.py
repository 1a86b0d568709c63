"""Kernels for functions with symbolic dimensions: a config tuned at one value, applied to the
function with the dimension left symbolic, and one PrimFunc that picks a kernel by the values.

* :func:`generalize` – the schedule a config gives the function specialized at one value,
  replayed on the symbolic function: every split keeps its factors and, where a factor does not
  divide the symbolic extent, TVM adds a bounds predicate (``pad_einsum`` pads to the tile).
  Templates whose result has no ``s_tir`` trace (the TIRx wgmma kernel), or whose trace does not
  rebuild their result, give None.
* :func:`bind_params` – a kernel scheduled at fixed values, rebound to the symbolic parameters,
  for a branch that runs only at those values (one row: the GEMV schedule drops the unit axis,
  so its trace does not replay).
* :func:`dispatch_func` – one PrimFunc with the symbolic function's signature whose body is an
  ``if/else`` chain over the variables, one kernel per branch, each branch with definitions of
  its own. The branches come lowered up to the host/device split, each by its own pipeline
  (``tune.compile.pre_lower``: TVM's s_tir pipeline refuses kernels under a host condition, and
  a TIRx kernel and s_tir code share no pipeline); the function is marked :data:`DISPATCHER`
  and ``tune.compile`` lowers only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T

from fastdlight.analysis.prepare import scalar_dtype
from fastdlight.schedules.decode_attention import DecodeAttentionTemplate
from fastdlight.schedules.decode_attention_mma import DecodeAttentionMmaTemplate
from fastdlight.schedules.wgmma.template import symbolic_kernel


def generalize(symbolic: tirx.PrimFunc, static: tirx.PrimFunc, scheduled, config=None,
               num_sms: int = 0) -> tirx.PrimFunc | None:
    """``symbolic`` scheduled the way ``scheduled`` (a template's result for ``static``,
    ``symbolic`` specialized at one value) schedules ``static``, or None when that schedule
    cannot be replayed: it has no trace, its trace does not rebuild it (a template that
    rewrites the function outside the schedule), or a step depends on the fixed value. The wgmma
    kernel (TIRx, no trace) is rebuilt for a symbolic M by its template (``config``,
    ``num_sms``: its persistent grid)."""
    trace = getattr(scheduled, "trace", None)
    if config is not None and config.kind == "decode_attention":
        return DecodeAttentionTemplate().apply_config(symbolic, config)  # reads the length at run time
    if config is not None and config.kind == "decode_attention_mma":
        return DecodeAttentionMmaTemplate().apply_config(symbolic, config)
    if trace is None:
        if config is not None and config.kind == "matmul_wgmma":
            return symbolic_kernel(symbolic, static, config, num_sms)
        return None
    try:
        again = s_tir.Schedule(static)
        trace.apply_to_schedule(again, remove_postproc=False)
        if not tvm_ffi.structural_equal(again.mod, scheduled.mod):
            return None
        replayed = s_tir.Schedule(symbolic)
        trace.apply_to_schedule(replayed, remove_postproc=False)
    except Exception:  # noqa: BLE001 - TVM's ScheduleError: the schedule depends on the fixed value
        return None
    return replayed.mod["main"]


#: attribute marking a dispatcher PrimFunc, lowered up to the split (read by ``tune.compile``)
DISPATCHER = "fastdlight.dispatcher"


def bind_params(symbolic: tirx.PrimFunc, kernel: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``kernel`` (``symbolic`` specialized at fixed values, then scheduled) with its parameters
    resolved by name to ``symbolic``'s, as a parameterless PrimFunc whose body a dispatch branch
    can hold: right only at those values. Its TVMScript is parsed again with the names bound to
    the symbolic parameters; None when the kernel does not print as parseable TVMScript (TVM
    0.27 prints some tensor-core intrinsics in a form its parser refuses)."""
    lines = kernel.script().splitlines()
    if any("metadata[" in ln for ln in lines):
        return None
    at = next((i for i, ln in enumerate(lines) if ln.startswith("def ")), None)
    if at is None:
        return None
    lines[at] = "def kernel():"
    names = {str(p.name): p for p in symbolic.params}
    try:
        return tvm.script.from_source("\n".join(lines), extra_vars={"T": T, **names}, check_well_formed=False)
    except Exception:  # noqa: BLE001 - the printer's form is not parseable: no exact branch
        return None


@dataclass(frozen=True)
class Branch:
    """One kernel of a dispatch chain: ``when`` gives each variable's bound (``None``: no bound,
    what lies above the variable's largest bound); the kernel runs at every value up to it, or,
    ``exact`` (a kernel scheduled at the bounds themselves, see :func:`bind_params`), only there."""

    when: tuple[tuple[str, int | None], ...]
    func: tirx.PrimFunc
    exact: bool = False


def dispatch_func(symbolic: tirx.PrimFunc, names: Sequence[str], branches: Sequence[Branch]) -> tirx.PrimFunc:
    """One PrimFunc (``symbolic``'s signature and attributes) running the branch whose bounds
    hold: variables are tested in ``names`` order, bounds ascending, each variable's ``None``
    branch taking what lies above its largest bound. Every branch's kernel must be ``symbolic``
    scheduled (same parameters). Raises ValueError when the branches leave a value uncovered."""
    shape_vars = {}
    for p in symbolic.params:
        for d in getattr(p, "shape", None) or ():
            for v in tirx.analysis.undefined_vars(d):
                shape_vars.setdefault(str(v.name), v)
    body = _chain([shape_vars[n] for n in names], list(branches))
    return symbolic.with_body(body).with_attr(DISPATCHER, True)


def _chain(variables: list, branches: list[Branch]):
    if not variables:
        if len(branches) != 1:
            raise ValueError(f"{len(branches)} kernels for one set of bounds")
        return _fresh(branches[0].func.body)
    var, rest = variables[0], variables[1:]
    name = str(var.name)
    bounds = sorted({dict(b.when)[name] for b in branches} - {None})
    above = [b for b in branches if dict(b.when)[name] is None]
    if not above:
        raise ValueError(f"no kernel for {name} above {bounds[-1] if bounds else 'any value'}")
    if len(above) == 1 and bounds:
        last = [b for b in branches if dict(b.when)[name] == bounds[-1]]
        if len(last) == 1 and last[0].func.same_as(above[0].func) and not last[0].exact:
            bounds = bounds[:-1]  # the largest value's kernel also serves what lies above: one branch
    stmt = _chain(rest, above)
    for bound in reversed(bounds):
        chosen = [b for b in branches if dict(b.when)[name] == bound]
        value = tirx.const(bound, scalar_dtype(var))
        exact = all(b.exact for b in chosen)
        stmt = tirx.IfThenElse(var == value if exact else var <= value, _chain(rest, chosen), stmt)
    return stmt


def _fresh(body):
    """``body`` with new variables for everything it defines (buffers, loops, blocks), so two
    branches never share a definition; the parameters it uses stay (they are free in it)."""
    return s_tir.renew_defs(tirx.PrimFunc([], body)).body
