"""``@fastdlight.autotune``: search a space of your own schedules with fastdlight's machinery.

    @fastdlight.autotune(space={"bm": [32, 64, 128], "bn": [32, 64, 128], "bk": [8, 16, 32]},
                         constraints=[lambda bm, bn: bm * bn <= 128 * 128],
                         key="my_gemm_1024", reference=gemm, database="tuned/")
    def my_gemm(bm, bn, bk):
        sch = tvm.s_tir.Schedule(gemm)
        ...                                   # tiles from the parameters, threads bound
        return sch.mod["main"]

    func = my_gemm()                          # the winning scheduled PrimFunc
    result = my_gemm.tune()                   # an AutotuneResult: params, trials, what was cut

A run reads as its phases, each returning a value (all frozen dataclasses):

    space     every point of the named values, in the order given; a constraint that
              rejects a point records its name or source                  -> Pruned("constraint")
    schedule  the function called on each point (None: the point does not apply; raising:
              a failure as data); the same kernel twice is built once; every kernel must
              take the reference's parameters       -> Pruned("schedule" | "duplicate" | "signature")
    lower     TVM's lowering pipeline up to the device kernels (tens of ms, no nvcc): threads
              per block, grid, static and dynamic shared memory           -> Resources, or Pruned("lower")
    limits    the arch's limits (threads per block and per dimension, grid, shared memory per
              block: static 48 KB, static + dynamic the opt-in maximum)   -> Pruned("threads" | ...)
    rank      with ``reference=`` (the unscheduled PrimFunc) of a family fastdlight's analysis
              knows, the kernel's block tile, thread tile and reduction step are read off the
              schedule and scored by the Roller cost model DefaultPolicy ranks its own configs
              with; the best ``topk`` are built. Candidates it cannot score are all built.
    build / time / verify
              ``apply_and_build`` with each survivor as a ``Config("prebuilt", (n,))`` whose
              template loads the scheduled function: the same workers, nvcc, probe, timing and
              element-by-element verification as every tuning run      -> Trial (CompileResult)
    cache     a verified winner is stored in the ``TuningDatabase`` under ``key`` and the GPU;
              a later call (any process) re-makes the winner's schedule (no build, no timing)
              and checks it is the kernel stored; in-process, the result is kept

Registers are known only after nvcc: TVM writes ``__launch_bounds__(threads)``, so ptxas keeps
every kernel within the register file (spilling instead); each trial reports its registers and
spills. Without a GPU the survivors are compiled to cubins and ranked by predicted cost, and
nothing is stored (only verified winners are).
"""

from __future__ import annotations

import collections
import functools
import inspect
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from fastdlight.arch import CUDA, auto_arch
from fastdlight.config import Config
from fastdlight.measure.workload import param_buffers
from fastdlight.search.autotune_screen import (  # noqa: F401 - re-exported
    GRID_DIM_LIMITS,
    PRUNE_STAGES,
    THREAD_DIM_LIMITS,
    Pruned,
    Resources,
    Screening,
    Survivor,
    Tile,
    Ranker,
    kernel_resources,
    over_limits,
    read_tile,
)
from fastdlight.search.autotune_space import AutotuneError, Constraint, Params, Space, fmt_params  # noqa: F401
from fastdlight.search.results import CompileResult, Failure
from fastdlight.search.candidates import measures
from fastdlight.search.database import TuningDatabase, target_key
from fastdlight.search.options import TuneOptions
from fastdlight.search.runner import TuningError, apply_and_build
from fastdlight.compiler.workers import one_line


# -- what a run returns -----------------------------------------------------------------------
@dataclass(frozen=True)
class Trial:
    """A built survivor and what happened to it (``result``: the tuning run's row)."""

    params: Params
    resources: Resources
    predicted_cost: float | None
    result: CompileResult = field(repr=False)
    func: tirx.PrimFunc = field(default=None, repr=False, compare=False)  # the scheduled function built

    @property
    def latency_ms(self) -> float | None:
        return self.result.latency_ms

    @property
    def verified(self) -> bool | None:
        return self.result.verified

    @property
    def failure(self) -> Failure | None:
        """The stage and one-line reason it failed in (``build_task``'s stages), or None."""
        if self.result.failure is None and self.result.verified is False:
            return Failure.of("verify", self.result.check_message)
        return self.result.failure

    @property
    def registers(self) -> int | None:
        return self.result.registers

    @property
    def spill_bytes(self) -> int | None:
        return self.result.spill_bytes


@dataclass(frozen=True)
class AutotuneResult:
    """The winner (``params``, its scheduled ``func``) and how it was found. ``source``:
    "tuned" (timed and verified on a GPU), "compiled" (no GPU: the best predicted among those
    that compiled), or "database" (stored by an earlier run; nothing built)."""

    key: str | None
    arch: str
    params: Params
    func: tirx.PrimFunc = field(repr=False, compare=False)
    source: str
    latency_ms: float | None = None
    verified: bool | None = None
    reference: str | None = None
    screening: Screening | None = None
    trials: tuple[Trial, ...] = ()
    stored: bool = False

    @property
    def kwargs(self) -> dict:
        """The winning parameters, ready for ``fn(**kwargs)``."""
        return dict(self.params)

    @property
    def failures(self) -> tuple[Pruned | Trial, ...]:
        """Every point that did not make it: cut before building, or failed in a stage."""
        cut = self.screening.pruned if self.screening else ()
        return tuple(cut) + tuple(t for t in self.trials if t.failure is not None)

    def report(self) -> str:
        where = f"autotune {self.key or ''} on {self.arch}".replace("  ", " ")
        lines = [where]
        if self.screening is not None:
            lines += ["  " + ln for ln in self.screening.summary().splitlines()]
        if self.trials:
            failed = collections.Counter(t.failure.stage for t in self.trials if t.failure is not None)
            lines.append(f"  {len(self.trials)} built: {len(self.trials) - sum(failed.values())} usable"
                         + (f", failed: {', '.join(f'{s} {n}' for s, n in failed.items())}" if failed else ""))
        how = {"tuned": "timed, " + ("verified" if self.verified else "not verified"),
               "compiled": "compiled only (no GPU): best predicted",
               "database": "from the database (stored verified)"}[self.source]
        ms = f"{self.latency_ms:.4f} ms, " if self.latency_ms is not None else ""
        lines.append(f"  winner {fmt_params(self.params)}: {ms}{how}" + (" [stored]" if self.stored else ""))
        return "\n".join(lines)


# -- the build seam ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PrebuiltTemplate:
    """The template of ``Config("prebuilt", (n,))``: candidate ``n``'s scheduled PrimFunc, read
    from ``directory`` (picklable: build workers load it there)."""

    directory: str

    def path(self, n: int) -> str:
        return os.path.join(self.directory, f"candidate_{n}.json")

    def __call__(self, func, config: Config):
        try:
            with open(self.path(config.block[0])) as f:
                return tvm.ir.load_json(f.read())
        except FileNotFoundError:
            raise FileNotFoundError(f"candidate {config.block[0]} is gone with its run's temporary directory; "
                                    "a Trial's func is the scheduled function") from None


def build_survivors(workload_func, chosen: Sequence[Survivor], arch: CUDA, opts: TuneOptions):
    """Build, time and verify ``chosen`` through :func:`apply_and_build`; returns its
    ``(ranked results, best)``. Result ``index`` n is ``chosen[n]``."""
    costs = [s.predicted_cost for s in chosen if s.predicted_cost is not None]
    last = max(costs, default=0.0)
    with tempfile.TemporaryDirectory(prefix="fastdlight_autotune_") as directory:
        template = PrebuiltTemplate(directory)
        configs = []
        for n, s in enumerate(chosen):
            with open(template.path(n), "w") as f:
                f.write(tvm.ir.save_json(s.func))
            cost = s.predicted_cost if s.predicted_cost is not None else last + 1.0 + n  # unranked: after
            configs.append(Config("prebuilt", (n,), cost=cost))
        return apply_and_build(workload_func, configs, arch, parallel_build=opts.parallel_build,
                               options=opts.replace(template=template))


# -- the decorated function ----------------------------------------------------------------------
def _as_primfunc(out, who: str) -> tirx.PrimFunc | None:
    if out is None or isinstance(out, tirx.PrimFunc):
        return out
    mod = out.mod if isinstance(out, s_tir.Schedule) else out
    if isinstance(mod, tvm.IRModule):
        funcs = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
        if len(funcs) == 1:
            return funcs[0]
        raise AutotuneError(f"autotune: {who} returned an IRModule with {len(funcs)} PrimFuncs; return one")
    raise AutotuneError(f"autotune: {who} returned {type(out).__name__}, not a PrimFunc "
                        "(or an s_tir.Schedule / IRModule holding one)")


def _signature(func) -> list[tuple]:
    return [(tuple(str(d) for d in b.shape), str(b.dtype)) for b in param_buffers(func)]


class Autotuner:
    """What ``@autotune(...)`` makes of a function. Call it for the winning PrimFunc, ``.tune()``
    for the :class:`AutotuneResult`, ``.screen()`` for the pruning and ranking alone,
    ``.schedule(**params)`` for one point."""

    def __init__(self, fn: Callable, space: Space, key: str | None, reference, target, topk: int,
                 database, options: TuneOptions):
        self.fn, self.space, self.key, self.reference = fn, space, key, reference
        self.target, self.topk, self.database, self.options = target, topk, database, options
        self._memo: dict[str, AutotuneResult] = {}
        self._name = getattr(fn, "__name__", None) or repr(fn)
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<autotuned {getattr(self.fn, '__qualname__', self.fn)!r}: {self.space.size} points, key={self.key!r}>"

    def __call__(self, target=None, **overrides) -> tirx.PrimFunc:
        return self.tune(target, **overrides).func

    # -- one point -------------------------------------------------------------------------
    @property
    def symbol(self) -> str:
        """The name every candidate is built under (the reference's, else "main")."""
        ref = self.reference
        if ref is not None and ref.attrs is not None and "global_symbol" in ref.attrs:
            return str(ref.attrs["global_symbol"])
        return "main"

    def schedule(self, **params) -> tirx.PrimFunc | None:
        """``fn(**params)`` as a PrimFunc named for building (None: the point does not apply)."""
        func = _as_primfunc(self.fn(**params), f"{self._name}({fmt_params(tuple(params.items()))})")
        return None if func is None else func.with_attr("global_symbol", self.symbol)

    # -- before building ---------------------------------------------------------------------
    def screen(self, target=None, topk: int | None = None) -> Screening:
        """Schedule and lower every point the constraints accept, cut those over the arch's
        limits, rank the rest. Builds nothing."""
        arch = target if isinstance(target, CUDA) else auto_arch(target if target is not None else self.target)
        topk = _check_topk(self.topk if topk is None else topk)
        ranker = Ranker(self.reference, arch)
        signature = _signature(self.reference) if self.reference is not None else None
        with arch.target:  # a schedule that reads the target (Dlight's rules) sees this one
            return self._screen(arch, topk, ranker, signature)

    def _screen(self, arch: CUDA, topk: int, ranker: Ranker, signature) -> Screening:
        pruned, survivors, seen = [], [], {}
        for params in self.space.points():
            why = self.space.rejection(params)
            if why is not None:
                pruned.append(Pruned(params, "constraint", why))
                continue
            try:
                func = self.schedule(**dict(params))
            except AutotuneError:
                raise
            except Exception as e:  # noqa: BLE001 - the user's schedule failing here is data
                pruned.append(Pruned(params, "schedule", one_line(e)))
                continue
            if func is None:
                pruned.append(Pruned(params, "schedule", "the function returned None (the point does not apply)"))
                continue
            same = next((p for p, f in seen.get(tvm_ffi.structural_hash(func), ())
                         if tvm_ffi.structural_equal(f, func)), None)
            if same is not None:
                pruned.append(Pruned(params, "duplicate", f"the same kernel as {fmt_params(same)}"))
                continue
            seen.setdefault(tvm_ffi.structural_hash(func), []).append((params, func))
            signature = signature or _signature(func)
            if _signature(func) != signature:
                pruned.append(Pruned(params, "signature", f"parameters {_signature(func)} differ from "
                                                          f"{signature} (the reference's or the first point's)"))
                continue
            try:
                res = kernel_resources(func, arch.target)
            except Exception as e:  # noqa: BLE001 - TVM's lowering errors are many types
                pruned.append(Pruned(params, "lower", one_line(e)))
                continue
            over = over_limits(res, arch)
            if over is not None:
                pruned.append(Pruned(params, *over))
                continue
            cost, tile = ranker.cost(func, res)
            survivors.append(Survivor(params, func, res, cost, tile))
        ranked = sorted(enumerate(survivors),
                        key=lambda e: (e[1].predicted_cost is None, e[1].predicted_cost or 0.0, e[0]))
        return Screening(self.space.size, tuple(s for _, s in ranked), tuple(pruned), ranker.why, topk)

    # -- the run -------------------------------------------------------------------------------
    def tune(self, target=None, *, topk: int | None = None, database=None, use_cache: bool = True,
             options: TuneOptions | None = None, **tune_options) -> AutotuneResult:
        """The winner for ``target`` (default: the decorator's, else the live GPU, else the H100
        model): from this process's memo or the database when there is one (``use_cache``),
        else screened, built, timed and verified; a verified winner is stored under ``key``."""
        arch = target if isinstance(target, CUDA) else auto_arch(target if target is not None else self.target)
        opts = TuneOptions.of(options or self.options, **tune_options)
        _check_options(opts)
        db = _database(self.database if database is None else database, self.key)
        where = target_key(arch)
        if use_cache:
            if where in self._memo:
                return self._memo[where]
            hit = self._from_database(db, arch) if db is not None else None
            if hit is not None:
                self._memo[where] = hit
                return hit
        measured = measures(opts)
        if measured and opts.check != "none" and self.reference is None and opts.ref is None:
            raise AutotuneError("autotune: give reference= (the unscheduled PrimFunc) or ref= (a float64 numpy "
                                "function) to verify candidates on the GPU, or check='none'")
        screening = self.screen(arch, topk)
        if not screening.survivors:
            cut = "\n".join(f"  {p}" for p in screening.pruned[:10])
            raise _no_winner(f"every point was cut before building\n{screening.summary()}\n{cut}", screening, self)
        chosen = screening.chosen
        workload = self.reference if self.reference is not None else chosen[0].func
        try:
            results, best = build_survivors(workload, chosen, arch, opts)
        except TuningError as e:
            raise _no_winner(f"{screening.summary()}\n{e}", screening, self) from None
        trials = tuple(Trial(chosen[r.index].params, chosen[r.index].resources, chosen[r.index].predicted_cost, r,
                             chosen[r.index].func) for r in results)
        winner = chosen[best.index]
        verified = best.verified
        reference = best.verdict.reference if best.verdict is not None else None
        stored = False
        if db is not None and verified and self.key is not None:
            db.commit_key(self.key, arch, dict(_json_params(winner.params)), winner.func, best.latency_ms, True,
                          reference, self.space.to_json())
            stored = True
        result = AutotuneResult(self.key, arch.name, winner.params, winner.func,
                                "tuned" if best.latency_ms is not None else "compiled", best.latency_ms, verified,
                                reference, screening, trials, stored)
        self._memo[where] = result
        return result

    def _from_database(self, db: TuningDatabase, arch: CUDA) -> AutotuneResult | None:
        record = db.lookup_key(self.key, arch)
        if record is None:
            return None
        params = self.space.find(record.params)
        stale = None
        if params is None:
            stale = f"its parameters {record.params} are not a point of the space any more"
        elif self.space.rejection(params) is not None:
            stale = f"{fmt_params(params)} is {self.space.rejection(params)}"
        else:
            try:
                with arch.target:
                    func = self.schedule(**dict(params))
                same = func is not None and tvm_ffi.structural_equal(func, record.func)
            except AutotuneError:
                raise
            except Exception as e:  # noqa: BLE001 - the function changed so that it fails now
                same, func = False, None
                stale = f"{self._name}({fmt_params(params)}) raises {one_line(e)}"
            if not same and stale is None:
                stale = f"{self._name}({fmt_params(params)}) no longer makes the kernel stored"
        if stale is not None:
            warnings.warn(f"fastdlight.autotune: the record of {self.key!r} for {arch.name} is stale ({stale}); "
                          "tuning afresh", stacklevel=4)
            return None
        return AutotuneResult(self.key, arch.name, params, func, "database", record.latency_ms, True, record.reference)


def _no_winner(message: str, screening: Screening, tuner: Autotuner) -> TuningError:
    """The run's TuningError, carrying its :class:`Screening` (``err.screening``) as data."""
    err = TuningError(f"autotune {tuner.key or tuner._name}: {message}")
    err.screening = screening
    return err


def _json_params(params: Params) -> Params:
    return tuple((k, json.loads(json.dumps(v))) for k, v in params)


def _check_topk(topk) -> int:
    if not isinstance(topk, int) or isinstance(topk, bool) or topk <= 0:
        raise AutotuneError(f"autotune: topk must be a positive integer, got {topk!r}")
    return topk


def _check_options(opts: TuneOptions) -> None:
    if opts.template is not None:
        raise AutotuneError("autotune: template= is autotune's own (each point's function is the schedule)")


def _database(database, key, open_it: bool = True) -> TuningDatabase | None:
    """The database to read and store in (None: none); ``open_it=False`` only checks."""
    if database is None:
        return None
    if key is None:
        raise AutotuneError("autotune: a database needs key= (the name the winner is stored under)")
    if not isinstance(database, (TuningDatabase, str, os.PathLike)):
        raise AutotuneError(f"autotune: database must be a directory or a TuningDatabase, "
                            f"got {type(database).__name__}")
    if isinstance(database, TuningDatabase) or not open_it:
        return database
    return TuningDatabase(database)


def autotune(space: Mapping[str, Sequence], *, constraints: Sequence[Callable] = (), key: str | None = None,
             reference: tirx.PrimFunc | None = None, target=None, topk: int = 20, database=None,
             options: TuneOptions | None = None, **tune_options) -> Callable[[Callable], Autotuner]:
    """Decorate ``fn(**params) -> scheduled PrimFunc`` (or an ``s_tir.Schedule`` / IRModule
    holding one; None: the point does not apply) to search ``space``.

    space: ``{name: [values, ...]}``, every name a keyword ``fn`` takes. constraints: callables
        taking some of the names, False to skip a point. key: the name a verified winner is
        stored under in ``database`` (a directory or a :class:`TuningDatabase`), with the GPU.
    reference: the unscheduled PrimFunc the schedules implement: candidates are ranked by the
        Roller cost model where fastdlight's analysis knows its family, and verified against
        its naive float64 schedule (or pass ``ref=``, a float64 numpy function).
    target: a tag, Target or :class:`CUDA` (default: the live GPU, else the H100 model).
    topk: ranked survivors to build. ``options`` / keywords: :class:`TuneOptions`.
    Bad input raises :class:`AutotuneError` (one line) here or, for what the function returns,
    when tuning starts."""
    the_space = Space.of(space, constraints)
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise AutotuneError(f"autotune: key must be a non-empty string, got {key!r}")
    if reference is not None and not isinstance(reference, tirx.PrimFunc):
        raise AutotuneError(f"autotune: reference must be the unscheduled PrimFunc, got {type(reference).__name__} "
                            "(a numpy function goes in ref=)")
    _check_topk(topk)
    opts = TuneOptions.of(options, **tune_options)
    _check_options(opts)
    _database(database, key, open_it=False)  # checked now, opened when used
    if key is not None:
        try:
            json.dumps(the_space.to_json())
        except TypeError as e:
            raise AutotuneError(f"autotune: the values of a keyed space must be JSON values (int, float, str, "
                                f"bool, None, lists) to be stored: {e}") from None

    def wrap(fn: Callable) -> Autotuner:
        if not callable(fn):
            raise AutotuneError(f"autotune decorates a function, got {type(fn).__name__}")
        _check_signature(fn, the_space)
        return Autotuner(fn, the_space, key, reference, target, topk, database, opts)

    return wrap


def _check_signature(fn: Callable, space: Space) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    ps = sig.parameters.values()
    named = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    name = getattr(fn, "__name__", "the function")
    if not any(p.kind == p.VAR_KEYWORD for p in ps):
        unknown = [n for n in space.names if n not in named]
        if unknown:
            raise AutotuneError(f"autotune: {name}() takes no parameter {', '.join(unknown)} "
                                f"(it takes {', '.join(sorted(named)) or 'none'})")
    missing = [p.name for p in ps if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and p.name not in space.names]
    if missing:
        raise AutotuneError(f"autotune: {name}() needs {', '.join(missing)}, which the space does not give")
