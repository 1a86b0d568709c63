"""``ApplyFastTuning``: tune every PrimFunc of an IRModule (e.g. a legalized Relax model).

    mod = relax.transform.LegalizeOps()(mod)
    mod = fastdlight.ApplyFastTuning(topk=20, target="cuda", meta_database_dir="tuned/")(mod)
    ex = fastdlight.build(mod, target)

Compile the result with :func:`fastdlight.build` (``tvm.compile`` under fastdlight's PassContext
options): the tensor-core kernels need TIR common-subexpression elimination off and every
warp buffer lowered (see :mod:`fastdlight.tune.compile`); plain ``tvm.compile`` fails on them.

For each PrimFunc not already scheduled (``tirx.is_scheduled``): a database hit re-applies the
stored config; otherwise :func:`fastdlight.tune.tune` builds, times and verifies the policy's
top-k (compile-only and ranked by predicted cost when no GPU is present) and the winner is
stored. The scheduled function replaces the original, marked ``tirx.is_scheduled`` so later
Dlight passes leave it alone. A function fastdlight cannot tune (an op family no template
covers, symbolic shapes, every candidate failing) is left as it was, with a warning naming it:
follow with ``dlight.ApplyDefaultSchedule`` to schedule what is left.
"""

from __future__ import annotations

import time
import warnings

from tvm import tirx
from tvm.ir import IRModule
from tvm.ir.transform import PassContext, module_pass

from ..arch import CUDA, auto_arch


def is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


def schedule_with(func: tirx.PrimFunc, config) -> tirx.PrimFunc:
    """``func`` scheduled by ``config`` (the database path: no building, no timing)."""
    from ..tune import build_task

    sch = build_task.apply_template(func, config)
    if sch is None:
        raise ValueError(f"{config!r} does not apply to this function")
    return sch.mod["main"]


@module_pass(opt_level=0, name="fastdlight.ApplyFastTuning")
class ApplyFastTuning:
    """An IRModule pass: ``ApplyFastTuning(topk=20, target=None, parallel_build=True,
    meta_database_dir=None, **tune_kwargs)``.

    target: a Target, tag or :class:`fastdlight.arch.CUDA` (default: the live GPU, else the
    H100 model). meta_database_dir: a directory holding fastdlight's tuning records (see
    :mod:`fastdlight.tune.database`); hits skip tuning. Other keyword arguments go to
    :func:`fastdlight.apply_and_build` (``measure``, ``budget_ms``, ``max_workers``, ...).
    After the pass, ``.report`` lists what happened to each function."""

    def __init__(self, topk: int = 20, target=None, parallel_build: bool = True, meta_database_dir=None,
                 **tune_kwargs):
        if topk <= 0:
            raise ValueError(f"topk must be positive, got {topk}")
        self.topk, self.target, self.parallel_build = topk, target, parallel_build
        self.meta_database_dir, self.tune_kwargs = meta_database_dir, tune_kwargs
        self.report: list[dict] = []

    def transform_module(self, mod: IRModule, _ctx: PassContext) -> IRModule:
        from ..tune.database import TuningDatabase

        arch = self.target if isinstance(self.target, CUDA) else auto_arch(self.target)
        db = TuningDatabase(self.meta_database_dir) if self.meta_database_dir is not None else None
        updated = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            name, t0 = gvar.name_hint, time.perf_counter()
            entry = {"function": name}
            try:
                scheduled = self._schedule(func, arch, db, entry)
            except Exception as e:  # noqa: BLE001 - this function stays as it was
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                warnings.warn(f"fastdlight.ApplyFastTuning: {name} left unscheduled: {first}", stacklevel=2)
                entry.update(status="untuned", error=first)
            else:
                updated[gvar] = scheduled.with_attr("tirx.is_scheduled", True)
            entry["seconds"] = round(time.perf_counter() - t0, 3)
            self.report.append(entry)
        if not updated:
            return mod
        mod = mod.clone()  # never change the caller's module in place
        for gvar, func in updated.items():
            mod[gvar] = func
        return mod

    def _schedule(self, func, arch: CUDA, db, entry: dict) -> tirx.PrimFunc:
        hit = db.lookup(func, arch) if db is not None else None
        if hit is not None and hit.latency_ms is None and self._measures():
            hit = None  # picked without a GPU, by predicted cost: now it can be measured
        if hit is not None:
            entry.update(status="database", config=repr(hit.config), latency_ms=hit.latency_ms)
            return schedule_with(func, hit.config)
        from ..tune.tuner import tune

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="fastdlight: no GPU was found")
            _, best = tune(func, arch, self.topk, parallel_build=self.parallel_build, **self.tune_kwargs)
        entry.update(status="tuned", config=repr(best.config), latency_ms=best.latency_ms, verified=best.verified)
        if db is not None:
            db.commit(func, arch, best.config, best.latency_ms, best.verified)
        # the winner's schedule, re-applied to the function exactly as the module holds it
        return schedule_with(func, best.config)

    def _measures(self) -> bool:
        from ..arch import has_gpu

        measure = self.tune_kwargs.get("measure")
        return has_gpu() if measure is None else bool(measure) and has_gpu()
