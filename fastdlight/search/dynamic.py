"""Tuning a function with symbolic dimensions: one kernel per tuned value, one dispatcher.

    plan      the values of each symbolic variable (``opt_shapes={"m": [1, 16, 128, 2048]}``, or
              :func:`default_points` from the hardware model)
    tune      each combination of values as a static function (the shared candidate path and
              its database records)
    generalize  each winner's schedule replayed on the symbolic function, bounds-checked
              (:func:`fastdlight.schedules.symbolic.generalize`; the wgmma kernel is rebuilt
              with M symbolic); a range of one value keeps its static winner behind ``==``;
              when the winner does not replay, the next fastest candidate that does stands in,
              and stock Dlight's rules (made for symbolic extents) where none does
    dispatch  one PrimFunc with the function's signature: the kernel tuned at ``v`` serves the
              values above the previous one up to ``v``; the largest value's kernel, compiled
              with the dimension symbolic, serves everything above it
    check     (on a GPU) the dispatcher against the float64 reference at each value, inside each
              range and above the largest, and its time at each tuned value beside the static
              winner's
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import tvm
from tvm import tirx

from fastdlight.arch import CUDA
from fastdlight.config import Config, StockSchedule
from fastdlight.analysis.prepare import shape_var_names, specialize
from fastdlight.schedules.dispatch import dispatch_config
from fastdlight.schedules.symbolic import Branch, bind_params, dispatch_func, generalize
from fastdlight.compiler import build_task
from fastdlight.compiler.compile import build, pre_lower
from fastdlight.search.candidates import Tuned, measures, tune_function
from fastdlight.search.options import TuneOptions
from fastdlight.search.reference import naive_expected
from fastdlight.search.runner import verify_module
from fastdlight.measure.gpu_turns import GPU_TURNS
from fastdlight.measure.timing import function_name, time_module
from fastdlight.measure.workload import Workload
from fastdlight.measure.widen import naive_reference_module

#: checked combinations of values at most (several variables multiply)
MAX_CHECKS = 32


def default_points(arch: CUDA) -> tuple[int, ...]:
    """Values to tune a symbolic dimension at when none are given: one row (decode), 16 (one
    mma.sync M tile), 128 (one tensor-core block tile) and the rows at which 32-row tiles fill
    every SM once (rounded down to a power of two: 4096 on an H100)."""
    wave = 1 << ((arch.sm_count * 32).bit_length() - 1)
    return (1, 16, 128, max(wave, 256))


@dataclass(frozen=True)
class Bucket:
    """The kernel tuned at ``point`` (one value per variable); ``exact``: the static winner
    itself, run only at the point (its range holds nothing else). ``static_ms``: the point's
    winner timed as a static function; ``kernel_ms``: the time of the candidate whose schedule the dispatcher runs, in
    the same run (equal to ``static_ms`` unless a stand-in replaced a winner that does not
    replay, ``note`` says which)."""

    point: tuple[tuple[str, int], ...]
    config: Config
    static_ms: float | None = None
    kernel_ms: float | None = None
    note: str = ""
    exact: bool = False


@dataclass(frozen=True)
class Dispatched:
    """A dispatcher and how it was made. ``values``: per variable, the tuned values;
    ``defaulted``: variables whose values came from :func:`default_points`."""

    func: tirx.PrimFunc
    values: tuple[tuple[str, tuple[int, ...]], ...]
    buckets: tuple[Bucket, ...]
    defaulted: tuple[str, ...] = ()

    def describe(self) -> str:
        rows = []
        for b in self.buckets:
            at = ", ".join(f"{n}={v}" for n, v in b.point)
            rows.append(f"{at}: {b.config!r}" + (" (exact)" if b.exact else "") + (f" [{b.note}]" if b.note else ""))
        return "\n".join(rows)


def plan_values(func: tirx.PrimFunc, opt_shapes: dict | None, arch: CUDA) -> tuple[tuple, tuple[str, ...]]:
    """``((name, sorted values), ...)`` for every symbolic variable of ``func`` and the names
    given no values. Raises ValueError for a value that is not a positive integer."""
    opt_shapes = dict(opt_shapes or {})
    names = shape_var_names(func)
    unknown = sorted(set(opt_shapes) - set(names))
    if unknown:
        raise ValueError(f"opt_shapes names {', '.join(unknown)}, which the function does not have "
                         f"(its symbolic dimensions: {', '.join(names) or 'none'})")
    values, defaulted = [], []
    for name in names:
        given = opt_shapes.get(name)
        if given is None:
            defaulted.append(name)
            given = default_points(arch)
        given = [given] if isinstance(given, int) else list(given)
        if not given or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in given):
            raise ValueError(f"opt_shapes[{name!r}] must be a positive integer or a list of them, got {given!r}")
        values.append((name, tuple(sorted(set(given)))))
    return tuple(values), tuple(defaulted)


def is_symbolic(func: tirx.PrimFunc) -> bool:
    return bool(shape_var_names(func))


def tune_dispatch(func: tirx.PrimFunc, arch: CUDA, topk: int, opts: TuneOptions, opt_shapes: dict | None = None,
                  db=None) -> Dispatched:
    """Tune ``func`` at every combination of its variables' values and return the dispatcher.
    Raises ValueError when ``func`` has no symbolic dimension, TuningError when a value has no
    usable kernel."""
    values, defaulted = plan_values(func, opt_shapes, arch)
    if not values:
        raise ValueError("the function has no symbolic dimension: tune it with fastdlight.tune")
    names = [n for n, _ in values]
    buckets, branches = [], []
    for combo in itertools.product(*(vs for _, vs in values)):
        point = tuple(zip(names, combo))
        static = specialize(func, dict(point))
        tuned = tune_function(static, arch, topk, opts, db=db)
        bucket, kernel = _kernel_at(func, static, tuned, arch, single=_single(values, point))
        buckets.append(bucket)
        branches += _branches(values, point, pre_lower(kernel, arch.target), bucket.exact, func, arch)
    dispatcher = dispatch_func(func, names, _dedupe(branches))
    return Dispatched(dispatcher, values, tuple(buckets), defaulted)


def _single(values, point) -> bool:
    """Whether the range the point serves holds the point alone (1, or v right after v - 1)."""
    for name, vs in values:
        v = dict(point)[name]
        i = vs.index(v)
        if v != (vs[i - 1] if i else 0) + 1:
            return False
    return True


def _ranked(tuned: Tuned) -> list[tuple[Config, float | None]]:
    """The winner first, then the other candidates that built (and, where checked, ran right)
    in the run's ranking: fastest first, or by predicted cost when nothing was timed."""
    rows = [(tuned.config, tuned.best.latency_ms if tuned.best is not None else None)]
    others = [r for r in tuned.results if r.compiled and r.failure is None and r.verified is not False
              and r.config != tuned.config]
    return rows + [(r.config, r.latency_ms) for r in others]


def _kernel_at(func, static, tuned: Tuned, arch: CUDA, single: bool) -> tuple[Bucket, tirx.PrimFunc]:
    """The point's kernel: the winner's schedule made symbolic; else, for a range of one value,
    the winner itself behind ``==``; else the fastest candidate whose schedule is symbolic."""
    point_ms = tuned.best.latency_ms if tuned.best is not None else None
    point = tuple((n, int(v)) for n, v in _point_of(func, static))
    # a schedule whose tiles divide the point pads nothing there, but must pad at other values:
    # one value past the point has the symbolic function's padding steps, so its trace replays
    past = specialize(func, {n: v + 1 for n, v in point})
    ranked = _ranked(tuned)
    kernel = _generalized(func, (static, past), ranked[0][0], arch)
    if kernel is not None:
        return Bucket(point, tuned.config, point_ms, ranked[0][1]), kernel
    if single:
        with arch.target:
            exact = bind_params(func, build_task.as_module(build_task.apply_template(static, tuned.config))["main"])
        if exact is not None:
            return Bucket(point, tuned.config, point_ms, point_ms, exact=True), func.with_body(exact.body)
    for config, ms in ranked[1:]:
        kernel = _generalized(func, (static, past), config, arch)
        if kernel is not None:
            return Bucket(point, config, point_ms, ms, f"{tuned.config.kind} winner has no symbolic form"), kernel
    return Bucket(point, _stock(arch), point_ms, None, "no candidate has a symbolic form: stock Dlight"), \
        _general(func, arch)


def _generalized(func, probes, config: Config, arch: CUDA) -> tirx.PrimFunc | None:
    """The config's own template (never the generic fallback) at a probe value, replayed."""
    if build_task.needs_tensor_intrinsics(config):
        build_task.import_tensor_intrinsics(config)
    for probe in probes:
        with arch.target:
            try:
                scheduled = dispatch_config(probe, config, allow_fallback=False).schedule
            except Exception:  # noqa: BLE001 - the config does not apply at this value
                continue
            kernel = generalize(func, probe, scheduled, config, arch.sm_count) if scheduled is not None else None
        if kernel is not None and not _fails_to_build(kernel, arch):
            return kernel
    return None


def _fails_to_build(kernel: tirx.PrimFunc, arch: CUDA) -> bool:
    """Whether ``kernel`` (a schedule replayed on the symbolic function) fails to compile: a
    replay can leave a whole symbolic-length intermediate to a thread ("Can only handle constant
    size stack allocation", a decode step's transposed scores) or code TVM's CUDA generator cannot
    print (the CUDA-core matmul's vector stores with the length symbolic). Such a schedule does
    not replay; the next candidate, or stock Dlight, stands in."""
    try:
        build(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), arch.target)
    except Exception:  # noqa: BLE001 - any failure: not this schedule
        return True
    return False


def _point_of(func, static) -> list[tuple[str, int]]:
    """The values ``static`` fixes, read back from its parameters' shapes."""
    out = {}
    for p, q in zip(func.params, static.params):
        for d, s in zip(getattr(p, "shape", None) or (), getattr(q, "shape", None) or ()):
            if isinstance(d, tvm.ir.expr.Var):
                out[str(d.name)] = int(s)
    return sorted(out.items())


def _branches(values, point, kernel, exact: bool, func, arch: CUDA) -> list[Branch]:
    """The point's branch (``kernel`` lowered up to the split), and the ``else`` branches of the
    variables at whose largest value the point sits: its kernel serves them (compiled symbolic, it is right at any value), or, when it
    is exact, stock Dlight's general kernel does."""
    tops = [n for n, vs in values if dict(point)[n] == vs[-1]]
    out = [Branch(tuple(point), kernel, exact)]
    above = pre_lower(_general(func, arch), arch.target) if exact and tops else kernel
    for k in range(1, len(tops) + 1):
        for opened in itertools.combinations(tops, k):
            out.append(Branch(tuple((n, None if n in opened else v) for n, v in point), above))
    return out


def _stock(arch: CUDA) -> StockSchedule:
    return StockSchedule(arch.arch)  # Dlight's rules take symbolic extents


def _general(func, arch: CUDA) -> tirx.PrimFunc:
    with arch.target:
        return build_task.as_module(build_task.apply_template(func, _stock(arch)))["main"]


def _dedupe(branches: list[Branch]) -> list[Branch]:
    seen, out = set(), []
    for b in branches:
        if b.when not in seen:
            seen.add(b.when)
            out.append(b)
    return out


# -- check -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DispatchCheck:
    """The dispatcher run at ``point``: verified against the float64 reference; at a tuned value
    also timed (``latency_ms``) beside the static winner (``static_ms``)."""

    point: tuple[tuple[str, int], ...]
    passed: bool
    message: str
    latency_ms: float | None = None
    static_ms: float | None = None


def check_values(values) -> list[tuple[tuple[str, int], ...]]:
    """Each tuned value, one inside each range (odd, so no tile divides it) and one above the
    largest, for every variable; combined, at most :data:`MAX_CHECKS` combinations."""
    per_var = []
    for name, vs in values:
        picks, prev = [], 0
        for v in vs:
            if v - prev > 2:
                picks.append((prev + v) // 2 | 1)
            picks.append(v)
            prev = v
        picks.append(vs[-1] + vs[-1] // 2 + 1)
        per_var.append([(name, p) for p in picks])
    combos = list(itertools.product(*per_var))
    if len(combos) > MAX_CHECKS:  # several variables: walk them together instead
        longest = max(len(p) for p in per_var)
        combos = [tuple(p[i % len(p)] for p in per_var) for i in range(longest)]
    return combos


def check_dispatch(dispatched: Dispatched, func: tirx.PrimFunc, arch: CUDA, opts: TuneOptions,
                   points=None) -> list[DispatchCheck]:
    """Build the dispatcher once; on the GPU run it at every check point (see
    :func:`check_values`) against the float64 reference, timing it at the tuned values."""
    name = str(func.attrs["global_symbol"]) if func.attrs is not None and "global_symbol" in func.attrs else "main"
    built = build(tvm.IRModule({name: dispatched.func.with_attr("global_symbol", name)}), arch.target)
    if not measures(opts):
        return []
    static_ms = {b.point: b.static_ms for b in dispatched.buckets}
    checks = []
    with GPU_TURNS.function_device(opts.devices or (0,)) as device:
        dev, turn = tvm.cuda(device), GPU_TURNS.turn(device)
        for point in points or check_values(dispatched.values):
            static = specialize(func, dict(point))
            wl = Workload(static, dev, opts.seed, turn)
            ref = build(naive_reference_module(static, arch.target), arch.target)
            fn = ref[function_name(ref, static)]
            expected = naive_expected(fn, wl)
            verdict = verify_module(built, wl, expected)
            ms = None
            if point in static_ms and verdict.ok:
                with turn:
                    ms = time_module(built, function_name(built, static), wl.timing_arg_sets(arch.l2_bytes),
                                     dev, opts.budget_ms).median_ms
            checks.append(DispatchCheck(point, verdict.ok, verdict.message, ms, static_ms.get(point)))
    return checks
