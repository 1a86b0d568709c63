"""``ApplyFastTuning``: tune every PrimFunc of an IRModule (e.g. a legalized, fused Relax model).

    mod = fastdlight.relax.prepare(target)(mod)   # legalize and fuse, once
    mod = fastdlight.ApplyFastTuning(topk=20, target=target, meta_database_dir="tuned/")(mod)
    ex = fastdlight.build(mod, target)             # lowers without fusing again

Build the result with :func:`fastdlight.build` (:mod:`fastdlight.relax.pipeline`): it does not
fuse or legalize again, so the tuned functions are what runs. A plain ``tvm.compile`` builds it
too: each tuned function carries the PassContext options its kernels need
(``fastdlight.pass_config``), and TVM's default TIR pipeline is routed so that TIRx (wgmma)
kernels, symbolic dispatchers and those options are honoured
(:func:`fastdlight.compiler.compile.route_default_pipeline`); but its default Relax pipeline
fuses again, which can merge a tuned function into a new, untuned one.

For each PrimFunc not already scheduled (``tirx.is_scheduled``) the candidate path shared with
``fastdlight.tune`` and the CLI (:mod:`fastdlight.search.candidates`) runs: a database hit is
re-applied (a record was verified when stored; ``recheck_database=True`` checks it again on a
GPU); otherwise the policy's top-k and stock Dlight's schedule are built, timed and verified
(compile-only and ranked by predicted cost when no GPU is present), and a verified winner is
stored. The scheduled function replaces the original, marked ``tirx.is_scheduled`` so later
Dlight passes leave it alone. A function nothing could schedule is left as it was, with a
warning naming it: the build's Dlight rules schedule what is left.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import tvm
import tvm_ffi
from tqdm import tqdm

from tvm import relax, tirx
from tvm.relax.analysis import has_reshape_pattern
from tvm.ir import IRModule
from tvm.ir.transform import PassContext, module_pass

from fastdlight.arch import CUDA, auto_arch
from fastdlight.compiler.compile import route_default_pipeline, with_pass_config
from fastdlight.config import Config
from fastdlight.analysis.matmul_match import anchor_key
from fastdlight.analysis.prepare import shape_var_names, unique_buffer_names
from fastdlight.measure import clock
from fastdlight.measure.gpu_turns import check_devices
from fastdlight.measure.inputs import INPUT_VALUES, known_input_values
from fastdlight.relax.rewrites import scalar_constant
from fastdlight.search.candidates import best_configs, measures, scheduled_function, tune_function
from fastdlight.search.database import TuningDatabase
from fastdlight.search.dynamic import check_dispatch, is_symbolic, tune_dispatch
from fastdlight.search.options import TuneOptions
from fastdlight.search.report import failure_counts


#: functions tuned at once: enough to keep the build workers busy while the GPUs time other
#: functions' candidates. On a 32-CPU machine with two H200s (2026-11-29), one GPU tuned
#: ResNet-18 b16 in 27.3 s at 8 against 32.8 s at 4 (27.3 against 31.0 in another run), a LLaMA
#: layer as fast either way (17.0 / 16.9 s, 15.5 / 15.0); two GPUs at 8 took 25.8-28.3 s for
#: ResNet-18 and 30.8 at 16
DEFAULT_JOBS = 8
#: a sibling's fastest configs measured for a function with the same matmul or convolution
#: (ResNet's layers recur with and without the residual add; LLaMA's gate and up projections)
SIBLING_SEEDS = 4


def is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


@dataclass(frozen=True)
class FunctionReport:
    """What the pass did with one PrimFunc. status: "tuned", "database", "view" (a reshape:
    it runs as a view of its input, no kernel) or "untuned" (no verified kernel at all).
    winner: "fastdlight" or "stock" (stock Dlight's schedule was
    measured as a candidate and was the fastest); stock_ms: stock Dlight's time in the same run,
    taken the way latency_ms was (both hot, both from CUDA graphs or both queued: the numbers the
    pick compared), None when it has no such time.
    same_as: the function whose tuning this structurally equal one reused."""

    function: str
    status: str
    seconds: float
    config: Config | None = None
    latency_ms: float | None = None
    verified: bool | None = None
    error: str | None = None
    stock_ms: float | None = None
    same_as: str | None = None
    failed: str = ""  # the candidates that failed, by stage ("2 wrong result, 1 nvcc")
    dispatch: str = ""  # a symbolic function: the kernel tuned at each value ("m<=16: matmul_tc; ...")
    seeded: bool = False  # tuned from a sibling's best configs (see sibling_leaders)
    fallback: str = ""  # why an earlier candidate set failed as a whole (its first lines), if one did
    #: candidates built for it, and the winner's place among the policy's (0: the policy's first
    #: config; None for stock Dlight or a database hit): where a smaller top-k would have done
    candidates: int = 0
    rank: int | None = None
    #: the fastest time among the policy's first 4 and first 8 configs (what a smaller top-k had won)
    best_of_first: tuple = ()

    @property
    def winner(self) -> str | None:
        if self.config is None:
            return None
        return "stock" if self.config.is_stock else "fastdlight"

    @property
    def speedup_vs_stock(self) -> float | None:
        if self.latency_ms and self.stock_ms:
            return self.stock_ms / self.latency_ms
        return None


@module_pass(opt_level=0, name="fastdlight.ApplyFastTuning")
class ApplyFastTuning:
    """An IRModule pass: ``ApplyFastTuning(topk=20, target=None, parallel_build=True,
    meta_database_dir=None, options=None, **tune_options)``.

    target: a Target, tag or :class:`fastdlight.arch.CUDA` (default: the live GPU, else the
    H100 model). meta_database_dir: a directory holding fastdlight's tuning records (see
    :mod:`fastdlight.search.database`); a hit is re-applied without building (``recheck_database=True``:
    built, timed and verified again first). Other
    keywords are :class:`fastdlight.TuneOptions` fields (``measure``, ``budget_ms``,
    ``max_workers``, ...); an unknown one is refused here. After the pass, ``.report`` lists a
    :class:`FunctionReport` per function and ``.stage_seconds`` where the time went.
    Structurally equal functions are tuned once; ``jobs``
    functions are tuned at a time (default :data:`DEFAULT_JOBS`), their candidates built
    by one shared worker pool while each GPU times one candidate at a time
    (:mod:`fastdlight.measure.gpu_turns`). ``devices=(0, 1, ...)`` (a TuneOptions field): a
    function's first-pass timings go to whichever of those GPUs is free, its finalists to one.
    ``on_function(report, scheduled)`` is called as each function is done."""

    def __init__(self, topk: int = 20, target=None, parallel_build: bool = True, meta_database_dir=None,
                 options: TuneOptions | None = None, progress: bool | None = None, jobs: int | None = None,
                 opt_shapes: dict | None = None, on_function=None, **tune_options):
        if not isinstance(topk, int) or topk <= 0:
            raise ValueError(f"topk must be a positive integer, got {topk!r}")
        if jobs is not None and (not isinstance(jobs, int) or jobs <= 0):
            raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
        #: symbolic dimensions' values, by name ({"seq_len": [1, 128, 2048]}): functions with
        #: symbolic dimensions get one kernel per value behind a dispatcher (values a function's
        #: variable is not given come from the hardware model: ``tune.dynamic.default_points``)
        self.opt_shapes = dict(opt_shapes or {})
        self.topk, self.target, self.meta_database_dir = topk, target, meta_database_dir
        self.options = TuneOptions.of(options, parallel_build=parallel_build, **tune_options)
        self.jobs = jobs if jobs is not None else DEFAULT_JOBS
        self.progress = progress
        self.report: list[FunctionReport] = []
        #: where the last run's time went (:mod:`fastdlight.measure.clock`)
        self.stage_seconds: dict[str, float] = {}
        #: called with (report, scheduled function or None) as each function is done
        self.on_function = on_function

    def arch(self) -> CUDA:
        return self.target if isinstance(self.target, CUDA) else auto_arch(self.target)

    def transform_module(self, mod: IRModule, _ctx: PassContext) -> IRModule:
        arch = self.arch()
        if self.options.devices and measures(self.options):
            check_devices(self.options.devices)  # before any function is tuned
        before = clock.snapshot()
        db = TuningDatabase(self.meta_database_dir) if self.meta_database_dir is not None else None
        todo, views = [], []
        constants = scalar_constant_inputs(mod)
        for gv, f in mod.functions_items():
            if isinstance(f, tirx.PrimFunc) and not is_scheduled(f):
                f = unique_buffer_names(f)  # the scheduled function replaces f: same parameters, by position
                # a reshape runs as a view of its input (lowering's RewriteDataflowReshape): no kernel
                if has_reshape_pattern(f):
                    views.append((gv, f))
                else:
                    # (values the function carries already, e.g. a merged decode step's zero tickets, kept)
                    known = {**known_input_values(f), **constants.get(gv, {})}
                    todo.append((gv, f.with_attr(INPUT_VALUES, known) if known else f))
        self.report.extend(FunctionReport(gv.name_hint, "view", 0.0) for gv, _ in views)
        groups = _structural_groups(todo)
        leaders = sibling_leaders([members[0][1] for members in groups])
        bar = tqdm(total=len(groups), desc="fastdlight: tuning", unit="func", disable=self._quiet())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = self._tune_groups(groups, leaders, arch, db, bar)
        bar.close()
        _rewarn(caught)
        self.stage_seconds = clock.since(before)
        updated = {}
        for i, members in enumerate(groups):
            scheduled, entry, _seeds = results[i]
            (first_gv, _), *others = members
            self.report.append(entry)
            self.report.extend(dataclasses.replace(entry, function=gv.name_hint, seconds=0.0, same_as=first_gv.name_hint)
                               for gv, _ in others)
            if scheduled is not None:
                for gvar, _ in members:  # structurally equal: one scheduled function serves all
                    updated[gvar] = with_pass_config(scheduled.with_attr("tirx.is_scheduled", True))
        if not updated:
            return mod
        route_default_pipeline()  # a plain tvm.compile of the result lowers each kernel as it was tuned
        mod = mod.clone()  # never change the caller's module in place
        for gvar, func in updated.items():
            mod[gvar] = func
        return mod

    def _tune_groups(self, groups, leaders, arch: CUDA, db, bar) -> list[tuple]:
        """Each group's (scheduled function or None, report, seeds), tuned ``jobs`` at a time;
        a sibling after its leader, seeded with the leader's best configs."""
        with ThreadPoolExecutor(self.jobs) as pool:
            futures: dict[int, Future] = {}
            index: dict[Future, int] = {}

            def submit(i: int, seeds=()):
                name, func = groups[i][0][0].name_hint, groups[i][0][1]
                futures[i] = pool.submit(self._tune_one, name, func, arch, db, seeds)
                index[futures[i]] = i

            # matmuls and convolutions first: their candidates take the longest to compile, and
            # the quick functions fill the build workers' gaps at the end
            for i in sorted(range(len(groups)), key=lambda i: leaders[i] != SELF):
                if leaders[i] in (None, SELF):
                    submit(i)
            pending = set(futures.values())
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    scheduled, entry, seeds = future.result()
                    bar.update()
                    if self.on_function is not None:
                        self.on_function(entry, scheduled)
                    for j in (j for j, leader in enumerate(leaders) if leader == index[future]):  # its siblings, seeded
                        submit(j, seeds)
                        pending.add(futures[j])
        return [futures[i].result() for i in range(len(groups))]

    def _quiet(self) -> bool | None:
        return None if self.progress is None else not self.progress

    def _tune_one(self, name: str, func, arch: CUDA, db, seeds=()):
        """(the scheduled function or None, its report, its best configs: seeds for siblings)."""
        t0 = time.perf_counter()
        if is_symbolic(func):
            return (*self._dispatch_one(name, func, arch, db, t0), ())
        try:
            tuned = tune_function(func, arch, self.topk, self.options, db=db, seeds=seeds)
            # the winner's schedule, re-applied to the function exactly as the module holds it
            # (or the kernel tuning made or the database stored for it)
            scheduled = tuned.kernel if tuned.kernel is not None else scheduled_function(func, tuned.config, arch)
        except Exception as e:  # noqa: BLE001 - this function stays as it was
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            warnings.warn(f"fastdlight.ApplyFastTuning: {name} left unscheduled: {first}", stacklevel=2)
            return None, FunctionReport(name, "untuned", round(time.perf_counter() - t0, 3), error=first), ()
        best, stock = tuned.best, tuned.stock
        return scheduled, FunctionReport(
            name, tuned.source, round(time.perf_counter() - t0, 3), tuned.config,
            best.latency_ms if best else None, best.verified if best else None,
            stock_ms=stock.latency_ms if stock else None, failed=failure_counts(tuned.results),
            seeded=bool(seeds), fallback=tuned.fallback_summary, candidates=len(tuned.results),
            rank=policy_rank(tuned), best_of_first=best_of_first(tuned)), best_configs(tuned, SIBLING_SEEDS)


    def _dispatch_one(self, name: str, func, arch: CUDA, db, t0: float):
        """A function with symbolic dimensions: a kernel per value, one dispatcher, checked on
        the GPU at and between the values before it replaces the function."""
        own = {k: v for k, v in self.opt_shapes.items() if k in shape_var_names(func)}
        try:
            dispatched = tune_dispatch(func, arch, self.topk, self.options, own, db=db)
            checks = check_dispatch(dispatched, func, arch, self.options)
            wrong = [c for c in checks if not c.passed]
            if wrong:
                at = ", ".join(f"{n}={v}" for n, v in wrong[0].point)
                raise ValueError(f"the dispatcher is wrong at {at}: {wrong[0].message}")
        except Exception as e:  # noqa: BLE001 - this function stays as it was
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            warnings.warn(f"fastdlight.ApplyFastTuning: {name} left unscheduled: {first}", stacklevel=2)
            return None, FunctionReport(name, "untuned", round(time.perf_counter() - t0, 3), error=first)
        top = dispatched.buckets[-1]
        summary = "; ".join(", ".join(f"{n}{'=' if b.exact else '<='}{v}" for n, v in b.point) + f": {b.config.kind}"
                            for b in dispatched.buckets)
        if dispatched.defaulted:
            summary += f" (default values for {', '.join(dispatched.defaulted)})"
        return dispatched.func, FunctionReport(
            name, "tuned", round(time.perf_counter() - t0, 3), top.config, top.kernel_ms,
            all(c.passed for c in checks) if checks else None, dispatch=summary)


def policy_rank(tuned) -> int | None:
    """The winner's place among the policy configs tuned beside it (0: the first emitted)."""
    best = tuned.best
    if best is None or best.config.is_stock or tuned.source != "tuned":
        return None
    return sum(1 for r in tuned.results if not r.config.is_stock and r.index < best.index)


def best_of_first(tuned, ks=(4, 8)) -> tuple:
    """``((k, ms), ...)``: the fastest timed, not refuted policy config among the first ``k``
    the policy emitted (None where none was), for each ``k``."""
    if tuned.source != "tuned":
        return ()
    policy = sorted((r for r in tuned.results if not r.config.is_stock), key=lambda r: r.index)
    out = []
    for k in ks:
        times = [r.latency_ms for r in policy[:k] if r.latency_ms is not None and r.verified is not False]
        out.append((k, round(min(times), 5) if times else None))
    return tuple(out)


def scalar_constant_inputs(mod: IRModule) -> dict:
    """Per PrimFunc (by GlobalVar), the parameters every ``call_tir`` of it in ``mod`` passes the
    same scalar constant, ``{name: value}``: a model's 0.5, 3.0 or attention scale, which the
    tuning run's inputs then hold instead of random values (:data:`INPUT_VALUES`)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found: dict = {}

    def visit(expr):
        if not (isinstance(expr, relax.Call) and expr.op.same_as(call_tir)
                and isinstance(expr.args[0], tvm.ir.GlobalVar)):
            return
        gv, args = expr.args[0], expr.args[1]
        params = mod[gv].params
        args = args.fields if isinstance(args, relax.Tuple) else [args]
        values = {}
        for param, arg in zip(params, args):
            value = scalar_constant(arg)
            if value is not None:
                values[str(param.name)] = value
        # a call site that passes another value (or none) leaves the parameter random
        found[gv] = values if gv not in found else {k: v for k, v in found[gv].items() if values.get(k) == v}

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return found


def _rewarn(caught) -> None:
    """Warnings the tuning threads raised, re-raised once each in the caller's thread (warning
    filters are process-wide and not thread-safe, so the threads only record)."""
    seen = set()
    for w in caught:
        text = str(w.message)
        if text in seen or text.startswith("fastdlight: no GPU was found"):
            continue
        seen.add(text)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _structural_groups(items) -> list[list[tuple]]:
    """(gvar, func) pairs grouped by structural equality, in module order."""
    groups: list[list[tuple]] = []
    by_hash: dict[int, list[int]] = {}
    for gvar, func in items:
        bucket = by_hash.setdefault(tvm_ffi.structural_hash(func), [])
        for i in bucket:
            if tvm_ffi.structural_equal(groups[i][0][1], func):
                groups[i].append((gvar, func))
                break
        else:
            bucket.append(len(groups))
            groups.append([(gvar, func)])
    return groups


#: in :func:`sibling_leaders`: a matmul or convolution tuned in full
SELF = -1


def sibling_leaders(funcs) -> list[int | None]:
    """Per function, the index of an earlier one computing the same matmul or convolution
    (same operands' shapes and dtypes, same reduction) with another epilogue: it is tuned after
    that one, from its best configs (``tune_function``'s ``seeds``); ``SELF``: the first of its
    matmul or convolution, tuned in full; None: not a matmul."""
    first: dict[tuple, int] = {}
    leaders: list[int | None] = []
    for i, func in enumerate(funcs):
        key = anchor_key(func)
        if key is None:
            leaders.append(None)
        elif key in first:
            leaders.append(first[key])
        else:
            first[key] = i
            leaders.append(SELF)
    return leaders
