"""The one candidate path that ``fastdlight.tune``, the CLI and ``ApplyFastTuning`` share:

    database hit?  -> the stored config and time as the winner (recheck_database: built, timed,
                      verified again)
    policies       -> TensorCorePolicy first where the function is tensor-core eligible, then
                      DefaultPolicy if every tensor-core candidate fails
    apply_and_build each candidate set until one gives a verified winner
    database       <- only a verified winner is stored
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Callable

import tvm_ffi

from fastdlight.analysis.prepare import check_target, specialize
from fastdlight.arch import CUDA, has_gpu
from fastdlight.arch.cuda import parse_sm
from fastdlight.compiler import build_task
from fastdlight.compiler.pool import shared_pool
from fastdlight.config import Config, StockSchedule
from fastdlight.measure.timing import Timing
from fastdlight.policies.select import CandidateSet, TensorCoreMatch, candidate_sets, match_tensor_core
from fastdlight.search.database import Record
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult
from fastdlight.search.runner import TuningError, apply_and_build


@dataclass(frozen=True)
class Tuned:
    """What tuning one function gave: the winning config, the ranked results and the winner. A
    database hit not rechecked on a GPU has one row, ``origin="database"``, with the stored time."""

    config: Config
    source: str  # "tuned" or "database"
    policy: str
    results: tuple[CompileResult, ...] = ()
    best: CompileResult | None = None
    kernel: object = None  # the scheduled PrimFunc, where the database stores it (wgmma)
    #: why earlier candidate sets failed as a whole ("TensorCorePolicy: no candidate could be used ...")
    fallbacks: tuple[str, ...] = ()

    @property
    def fallback_summary(self) -> str:
        """:attr:`fallbacks`, each by its first lines: the reason and the first failures."""
        return "; ".join(_brief(e) for e in self.fallbacks)

    @property
    def stock(self) -> CompileResult | None:
        """The fastest timed stock Dlight candidate measured beside the winner (not refuted by a
        check; with ``check="winner"`` only the winner is verified), timed the way the winner was
        (:func:`timed_alike`): the pick compared them on those numbers, and the report shows
        them side by side. None when no stock candidate was."""
        rows = [r for r in self.results if r.config.is_stock and not r.replayed and r.verified is not False
                and r.latency_ms is not None and timed_alike(r, self.best)]
        return min(rows, key=lambda r: r.speed_key, default=None)


def timed_alike(r: CompileResult, other: CompileResult | None) -> bool:
    """Whether ``r``'s time compares with ``other``'s: both hot or both first-pass, both from a
    CUDA graph or both queued. Under concurrent tuning a short kernel's queued time is the
    host's launch pace, several times its graph time: GPT-2's ``fused_matmul1_cast5`` was
    reported at 83 us beside stock Dlight's 18 us, the one queued and hot, the other from a
    graph and first-pass (H200)."""
    if other is None or other.timing is None:
        return True  # nothing timed to compare with (compiled only)
    return r.timing is not None and (r.timing.hot, r.timing.graph) == (other.timing.hot, other.timing.graph)


def stock_configs(func, arch: CUDA, match: TensorCoreMatch | None = None) -> tuple[StockSchedule, ...]:
    """Stock Dlight's schedule at the tuning arch and, on an arch-specific target (``sm_90a``),
    also at its base (``sm_90``) when Dlight schedules the function differently there: its
    Matmul rule uses tensor cores at ``sm_90`` (matmuls, convolutions), not at ``sm_90a``.
    Where the two schedules are the same (softmax, GEMV, fp32 matmul, elementwise) one is built."""
    own = StockSchedule(arch.arch)
    suffix = parse_sm(arch.arch)[1]
    if not suffix:
        return (own,)
    other = StockSchedule(arch.arch[: -len(suffix)])
    match = match if match is not None else match_tensor_core(func, arch)
    return (own, other) if _schedules_differ(func, arch, own, other, match) else (own,)


#: input dtypes stock Dlight's Matmul rule puts on tensor cores at a plain arch (``sm_90``)
STOCK_TENSOR_CORE_DTYPES = ("float16", "bfloat16", "int8")


def _schedules_differ(func, arch: CUDA, a: StockSchedule, b: StockSchedule, match: TensorCoreMatch) -> bool:
    """Whether the two configs schedule ``func`` differently (True when either does not apply:
    then measurement decides). A tensor-core matmul is taken to differ without scheduling it:
    stock Dlight at ``sm_90`` tensorizes it, and applying that here would import the tensor
    intrinsics into this process (2-5 s) before the first candidate could go to the builders."""
    if match.eligible and match.in_dtype in STOCK_TENSOR_CORE_DTYPES:
        return True
    try:
        with arch.target:
            schedules = [build_task.apply_template(func, c) for c in (a, b)]
    except Exception:  # noqa: BLE001 - a rule that raises is built and fails as a candidate
        return True
    if any(sch is None for sch in schedules):
        return True
    return not tvm_ffi.structural_equal(schedules[0].mod, schedules[1].mod)


def prewarm(opts: TuneOptions) -> None:
    """Start the shared build workers now, so they are ready when the policy's configs arrive
    (a worker registers the tensor-core intrinsics a config names when it schedules it:
    ``schedules.intrinsics``, 0.03 s)."""
    if opts.parallel_build and opts.pool is None:
        shared_pool(opts.max_workers).warm_up()


def measures(opts: TuneOptions) -> bool:
    return has_gpu() if opts.measure is None else bool(opts.measure) and has_gpu()


#: with seeds (a sibling's best configs), a policy's own best-ranked configs measured beside them
SEEDED_OWN_TOP = 2


def seeded(cand: CandidateSet, seeds: tuple[Config, ...]) -> CandidateSet:
    """``cand`` cut to the configs among ``seeds`` and its own ``SEEDED_OWN_TOP`` best-ranked
    policy configs (stock and recorded ones stay); unchanged when no seed is among its configs."""
    own = [c for c in cand.configs if not c.is_stock]
    if not any(c in seeds for c in own):
        return cand
    keep = set(own[:SEEDED_OWN_TOP]) | set(seeds)
    return dataclasses.replace(cand, configs=tuple(c for c in cand.configs if c.is_stock or c in keep))


def best_configs(tuned: Tuned, n: int) -> tuple[Config, ...]:
    """The ``n`` fastest timed policy configs of a tuning run that no check refuted (a database
    hit not rebuilt was not timed in this run)."""
    rows = sorted((r for r in tuned.results if not r.config.is_stock and not r.replayed and r.latency_ms is not None
                   and r.verified is not False), key=lambda r: r.speed_key)
    return tuple(dict.fromkeys(r.config for r in rows))[:n]


def tune_function(func, arch: CUDA, topk: int, opts: TuneOptions, *, opt_shapes: dict | None = None,
                  db=None, on_set: Callable[[CandidateSet], None] | None = None,
                  seeds: tuple[Config, ...] = ()) -> Tuned:
    """Tune ``func`` (symbolic dims given values by ``opt_shapes``) and return the winner, which
    is never slower than stock Dlight's schedule measured in the same run (a fused attention's
    stock schedule, Dlight's fallback, is measured only where the template fails). ``seeds``: the best
    configs of a sibling (a function computing the same matmul or convolution with another
    epilogue): the first candidate set is cut to them and its own best-ranked few
    (:func:`seeded`); if the cut set fails as a whole, the full set is tried before the next.
    Raises :class:`TuningError` (every policy's reasons) when nothing usable was found."""
    check_target(func)  # a CPU kernel is the caller's mistake, not a gap for stock Dlight to fill
    if opt_shapes:
        func = specialize(func, opt_shapes)
    hit = db.lookup(func, arch) if db is not None else None
    if hit is not None:
        replayed = _replay(func, arch, hit, opts)
        if replayed is not None:
            return replayed
    match = match_tensor_core(func, arch)
    prewarm(opts)
    errors, failed, held = [], None, None
    recorded = db.meta_schedule.records(func) if db is not None else ()
    stock = stock_configs(func, arch, match)
    for i, full in enumerate(candidate_sets(func, arch, topk, stock, stock_last=not measures(opts),
                                            recorded=recorded, match=match,
                                            memory_bound_topk=opts.memory_bound_topk)):
        cut = seeded(full, seeds) if seeds and i == 0 else full
        tuned = _tune_cut_then_full(cut, full, failed, errors, arch, opts, on_set)
        failed = None if tuned is not None else full.policy
        if tuned is None:
            continue
        held = tuned if held is None else faster_of(held, tuned)
        if not held.config.is_stock:
            break  # a policy config beat stock Dlight; otherwise the next policy gets its chance
    if held is None:
        raise TuningError("\n".join(errors) or "no candidate configs")
    if errors:
        held = dataclasses.replace(held, fallbacks=tuple(errors))
    if db is not None and held.best.verified:
        held = _with_kernel(held, func, arch)
        db.commit(func, arch, held.config, held.best.latency_ms, True, reference=held.best.verdict.reference,
                  kernel=held.kernel)
    return held


def _tune_cut_then_full(cut: CandidateSet, full: CandidateSet, failed: str | None, errors: list[str], arch: CUDA,
                        opts: TuneOptions, on_set: Callable[[CandidateSet], None] | None) -> Tuned | None:
    """The winner of ``cut`` (``full`` cut to a sibling's seeds, or ``full`` itself) or, when
    every config of the cut fails, of ``full``; None when that fails too. Each failure's reason
    is appended to ``errors``, and each attempt after a failure says so in a warning (``failed``:
    the policy whose set failed just before this call, else None)."""
    for cand in (cut, full) if cut is not full else (full,):  # a failed cut: the full set gets its chance
        if failed is not None:
            why = _brief(errors[-1])[:300]
            warnings.warn(f"fastdlight: every {failed} candidate failed ({why}); trying {cand.policy}",
                          stacklevel=3)  # at tune_function's caller
        if on_set is not None:
            on_set(cand)
        try:
            results, best = apply_and_build(cand.func, cand.configs, arch, options=opts)
        except TuningError as e:
            errors.append(f"{cand.policy}{' (seeded)' if cand is not full else ''}: {e}")
            failed = cand.policy
            continue
        return Tuned(best.config, "tuned", cand.policy, tuple(results), best)
    return None


def _with_kernel(held: Tuned, func, arch: CUDA) -> Tuned:
    """``held`` with its scheduled kernel (scheduled here when the tuning did not keep it), to be
    stored with its config: a replay loads the kernel instead of scheduling again (MobileNetV3's
    70 functions: 7.5 s of scheduling, 0.8 s of loading, on two CPU cores; a tensor-core schedule
    also imports TVM's tensor intrinsics first)."""
    if held.kernel is None:
        held = dataclasses.replace(held, kernel=scheduled_function(func, held.config, arch))
    return held


def scheduled_function(func, config: Config, arch: CUDA):
    """``func`` scheduled by ``config`` for ``arch`` (no building, no timing)."""
    with arch.target:
        sch = build_task.apply_template(func, config)
    if sch is None:
        raise ValueError(f"{config!r} does not apply to this function")
    return build_task.as_module(sch)["main"]


def _brief(error: str) -> str:
    return " | ".join(error.splitlines()[:3])


def faster_of(stock_won: Tuned, later: Tuned) -> Tuned:
    """A later policy's winner against the stock Dlight winner of an earlier set: the faster
    when both were timed (the policy's when not), keeping both sets' rows for the report."""
    a, b = stock_won.best.latency_ms, later.best.latency_ms
    winner = stock_won if a is not None and b is not None and a < b else later
    return dataclasses.replace(winner, results=later.results + stock_won.results)


def _replay(func, arch: CUDA, hit: Record, opts: TuneOptions) -> Tuned | None:
    """A stored winner: as stored (its config, time and kernel) or, with ``recheck_database`` on
    a GPU, first built, probed, timed and verified like any candidate (None when it no longer
    verifies: the caller tunes afresh)."""
    config = hit.config
    # the function the config schedules: a tensor-core config, the rewritten one (as when tuned;
    # matched only then: a model's 70 matches took 0.4 s of its replay, two CPU cores)
    match = match_tensor_core(func, arch) if config.kind == "matmul_tc" else None
    target_func = match.func if match is not None and match.eligible else func
    if not (opts.recheck_database and measures(opts)):
        timing = Timing(hit.latency_ms) if hit.latency_ms is not None else None
        best = CompileResult(config, 0, timing=timing, origin="database", _func=target_func)
        return Tuned(config, "database", config.kind, (best,), best, kernel=hit.load_kernel())
    try:
        results, best = apply_and_build(target_func, [config], arch, options=opts)
    except TuningError as e:
        warnings.warn(f"fastdlight: the stored config {config!r} failed again ({str(e).splitlines()[0]}); "
                      "tuning afresh", stacklevel=3)
        return None
    rows = tuple(r.replace(origin="database") for r in results)
    best = next(r for r in rows if r.index == best.index)
    return Tuned(best.config, "database", config.kind, rows, best)
