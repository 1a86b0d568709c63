"""Build every candidate config in parallel, time them on the GPU, check, and pick the best.

    cpresults, best = apply_and_build(func, configs, arch)

Data flow: each config is scheduled (``fastdlight.schedules.apply_config``), lowered and
compiled with nvcc in a worker process (:mod:`.workers`, :mod:`.build_task`); on a GPU
machine the worker exports a ``.so``, which a probe process runs once (a faulting or hanging
kernel dies there) and then this process loads and times (:mod:`.measure`) while other
candidates are still building; the fastest few are timed again once the builds are done, and
the fastest candidates are checked against a reference until one is right. Results are keyed
by the config's index, never by completion order. A candidate that fails anywhere (schedule,
lowering, nvcc, crash, timeout, launch, wrong result) is kept with its reason; only when no
candidate is usable does :class:`TuningError` say why, reason by reason.

Without a GPU (or ``measure=False``) every candidate is still compiled to a cubin (that is
what "it compiles" means) and the results are ranked by the policy's predicted cost.
"""

from __future__ import annotations

import collections
import math
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import tvm

from ..arch import CUDA, auto_arch, has_gpu
from ..policies.config import Config
from . import build_task
from .measure import METHODS, Timing, Workload, flush_bytes_for, function_name, time_module
from .pool import default_workers, probe_pool, shared_pool  # noqa: F401 - re-exported
from .workers import Outcome, Task, WorkerPool, one_line

#: seconds one candidate may take to schedule + lower + nvcc before its worker is killed
DEFAULT_TIMEOUT = 120.0
NO_GPU_WARNING = ("fastdlight: no GPU was found: nothing was timed; candidates were compiled to cubin "
                  "and are ranked by the policy's predicted cost")
#: how many of the fastest candidates are timed a second time (filters optimistic outliers)
RETIME_TOP = 3
#: seconds a candidate's single probe run may take (load + one launch) before it counts as hung
PROBE_TIMEOUT = 30.0
#: held while a candidate is timed and while one is probed: the probe process never puts a
#: kernel (or a context switch) on the GPU in the middle of a timing
_GPU_TURN = threading.Lock()
CHECKS = ("winner", "all", "none")


class TuningError(RuntimeError):
    """No candidate could be used; the message lists why, reason by reason."""


@dataclass
class CompileResult:
    """One candidate: its config and what happened to it."""

    config: Config
    index: int  # position of ``config`` in the list given to apply_and_build
    module: Any = None  # loaded runtime module (GPU runs) or None
    source: str | None = None  # CUDA source
    registers: int | None = None  # per thread, from ptxas
    spill_bytes: int | None = None  # spill stores + loads, from ptxas
    shared_bytes: int | None = None  # static shared memory, from ptxas
    latency_ms: float | None = None  # median of the timed launches
    timing: Timing | None = None
    error: str | None = None  # one-line reason it is unusable (None: built and, if timed, ran)
    log: str = ""  # full log behind ``error`` (traceback, nvcc output, worker stderr)
    verified: bool | None = None  # None: not checked
    check_message: str = ""
    build_time_s: float = 0.0
    #: where the build time went (schedule_s, compile_s = lower + nvcc, export_s) and when the
    #: worker started / finished it, in seconds after the build began (start_s, end_s)
    build_phases: dict = field(default_factory=dict)
    _func: Any = field(default=None, repr=False)
    _template: Any = field(default=None, repr=False)
    _schedule: Any = field(default=None, repr=False)

    @property
    def predicted_cost(self) -> float:
        return self.config.cost

    @property
    def compiled(self) -> bool:
        """nvcc produced a cubin for the target's arch."""
        return self.source is not None and self.registers is not None

    @property
    def cubin_info(self) -> dict:
        return {"registers": self.registers, "spill_bytes": self.spill_bytes, "shared_bytes": self.shared_bytes}

    @property
    def schedule(self):
        """The ``s_tir.Schedule`` of this candidate (re-applied in this process on first use)."""
        if self._schedule is None and self._func is not None:
            self._schedule = build_task.apply_template(self._func, self.config, self._template)
        return self._schedule

    def to_dict(self) -> dict:
        return {
            "index": self.index, "config": self.config.to_dict(), "predicted_cost": self.predicted_cost,
            "latency_ms": self.latency_ms, "verified": self.verified, "check": self.check_message or None,
            "registers": self.registers, "spill_bytes": self.spill_bytes, "shared_bytes": self.shared_bytes,
            "error": self.error, "build_time_s": round(self.build_time_s, 3),
            "build_phases": {k: round(v, 3) for k, v in self.build_phases.items()},
        }  # fmt: skip


# -- building --------------------------------------------------------------------------------
def _progress(total: int, desc: str, enabled: bool | None):
    if enabled is None:
        enabled = sys.stderr.isatty()
    try:
        from tqdm import tqdm
    except ImportError:  # progress bars are a nicety
        enabled = False
    if not enabled:
        return None
    return tqdm(total=total, desc=desc, unit="cand", leave=False, file=sys.stderr)


def _run_serial(tasks: list[Task]):
    build_task.init_worker()
    for task in tasks:
        t0 = time.monotonic()
        try:
            for name in task.features:
                if name == "tensor_intrin":
                    build_task.import_tensor_intrinsics()
            value = task.fn(*task.args)
            yield Outcome(task.key, True, value, seconds=time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - recorded on the candidate
            log = "\n".join(filter(None, [getattr(e, "log", ""), traceback.format_exc()]))
            yield Outcome(task.key, False, None, one_line(e), log, time.monotonic() - t0)


def _uses_tensor_cores(configs: Sequence[Config]) -> bool:
    return any(c.kind == "matmul_tc" for c in configs)


def compile_cost_estimate(config: Config) -> int:
    """Relative nvcc time of a candidate: the unrolled body grows with the per-thread (or
    per-warp) tile, the reduction step and the pipeline depth. Measured on H200: 4096 → ~10 s,
    2048 → ~4 s, 1024 → ~1 s for fp32 matmul tiles."""
    tile = math.prod(config.warp if config.kind == "matmul_tc" else config.thread or (1,))
    return tile * math.prod(config.rstep or (1,)) * max(1, config.pipeline_stages)


def build_all(func, configs, arch: CUDA, *, want_module: bool, out_dir: str, parallel: bool = True,
              max_workers: int | None = None, timeout: float = DEFAULT_TIMEOUT, template=None, hook=None,
              with_reference: bool = False, progress: bool | None = None, pool: WorkerPool | None = None,
              on_outcome: Callable[[Outcome], None] | None = None, post: Callable[[Outcome], Outcome] | None = None):
    """Build every config (and optionally the stock-Dlight reference, key "ref"). Returns
    {key: Outcome}, keys being config indices. ``on_outcome`` is called (in this thread) with
    each outcome as it arrives, while the other candidates are still building; ``post`` runs on
    each outcome first, in the pool's threads (overlapping the caller's ``on_outcome`` work)."""
    func_json = tvm.ir.save_json(func)
    target = str(arch.target)
    features = ("tensor_intrin",) if _uses_tensor_cores(configs) else ()
    tasks = []
    for i, cfg in enumerate(configs):
        task = {"index": i, "func_json": func_json, "target": target, "config": cfg.to_dict(),
                "template": template, "want_module": want_module, "out_dir": out_dir, "hook": hook}
        tasks.append(Task(i, build_task.build_candidate, (task,), features))
    if with_reference:
        task = {"index": "ref", "func_json": func_json, "target": target, "config": None,
                "template": None, "want_module": want_module, "out_dir": out_dir, "hook": None}
        tasks.append(Task("ref", build_task.build_candidate, (task,)))
    # Longest first (by a compile-cost estimate): the slowest nvcc runs must not start last.
    tasks.sort(key=lambda t: -compile_cost_estimate(configs[t.key]) if t.key != "ref" else -math.inf)
    bar = _progress(len(configs), "building", progress)
    outcomes = {}
    if parallel:
        pool = pool or shared_pool(max_workers)
        stream = pool.imap_unordered(tasks, timeout=timeout, post=post)
    else:
        stream = _run_serial(tasks) if post is None else map(post, _run_serial(tasks))
    for out in stream:
        outcomes[out.key] = out
        if bar is not None and out.key != "ref":
            bar.update(1)
        if on_outcome is not None:
            on_outcome(out)
    if bar is not None:
        bar.close()
    return outcomes


def _result_from(outcome: Outcome, config: Config, index: int, func, template, t0_wall: float) -> CompileResult:
    r = CompileResult(config=config, index=index, _func=func, _template=template)
    r.build_time_s = outcome.seconds
    if not outcome.ok:
        r.error, r.log = outcome.error, outcome.log
        return r
    v = outcome.value
    r.source, r.registers, r.spill_bytes, r.shared_bytes = v["source"], v["registers"], v["spill_bytes"], v["shared_bytes"]
    r.log = v.get("ptxas_log", "")
    r.build_time_s = v.get("build_time_s", outcome.seconds)
    r.build_phases = {k: v[k] for k in ("schedule_s", "compile_s", "export_s") if v.get(k) is not None}
    if v.get("wall_span"):
        r.build_phases.update(start_s=v["wall_span"][0] - t0_wall, end_s=v["wall_span"][1] - t0_wall)
    return r


def _load_module(value: dict, arch: CUDA):
    if value.get("so_path"):
        return tvm.runtime.load_module(value["so_path"])
    if value.get("mod_json"):
        return build_task.rebuild_with_cubin(value["mod_json"], arch.target, value["cubin"])
    raise RuntimeError(value.get("export_error") or "the worker returned no module")


# -- ranking and reporting ------------------------------------------------------------------
def _rank_key(r: CompileResult):
    if r.latency_ms is not None:
        group = 1 if r.verified is False else 0
        return (group, r.latency_ms, r.index)
    if r.compiled and r.error is None:
        return (2, r.predicted_cost, r.index)
    if r.compiled:
        return (3, r.predicted_cost, r.index)
    return (4, 0.0, r.index)


def rank(results: Sequence[CompileResult]) -> list[CompileResult]:
    """Timed candidates by latency (wrong ones after), then untimed compiled ones by predicted
    cost, then failures."""
    return sorted(results, key=_rank_key)


def _reason(r: CompileResult) -> str | None:
    if r.verified is False:
        return "wrong result"
    if not r.error:
        return None
    head = r.error.split(":", 1)[0]
    return head if head in ("schedule", "lower", "nvcc", "export", "run", "load") else r.error


def failure_summary(results: Sequence[CompileResult], limit: int = 3) -> str:
    """'N × reason' per reason, with the first few one-line messages of each."""
    by_reason: dict[str, list[CompileResult]] = collections.defaultdict(list)
    for r in results:
        reason = _reason(r)
        if reason:
            by_reason[reason].append(r)
    lines = []
    for reason, rs in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(rs)} × {reason}")
        for r in rs[:limit]:
            msg = r.check_message if reason == "wrong result" else r.error
            lines.append(f"      #{r.index} {r.config!r}: {msg}")
    return "\n".join(lines)


def perf_text(r: CompileResult, flops: float | None = None, nbytes: float | None = None,
              memory_bound: bool | None = None) -> str:
    if r.latency_ms is None:
        return "-"
    secs = r.latency_ms * 1e-3
    if memory_bound is None:
        memory_bound = not flops
    if memory_bound and nbytes:
        return f"{nbytes / secs / 1e9:.0f} GB/s"
    if flops:
        return f"{flops / secs / 1e12:.1f} TFLOPS"
    return "-"


def format_table(results: Sequence[CompileResult], flops: float | None = None, nbytes: float | None = None,
                 memory_bound: bool | None = None, best: CompileResult | None = None) -> str:
    """The ranked table the CLI and ``verbose=True`` print."""
    perf_head = "GB/s" if (memory_bound or (memory_bound is None and not flops)) else "TFLOPS"
    rows = [("rank", "#", "config", "pred. cost", "ms", perf_head, "ok", "regs", "note")]
    for i, r in enumerate(results, 1):
        ok = {True: "yes", False: "WRONG", None: "-"}[r.verified]
        note = r.error or ("" if r.verified is not False else r.check_message)
        if r is best:
            note = "best" + (f"; {note}" if note else "")
        if r.spill_bytes:
            note = f"spills {r.spill_bytes} B" + (f"; {note}" if note else "")
        rows.append((
            str(i), str(r.index), repr(r.config), f"{r.predicted_cost:.4g}",
            "-" if r.latency_ms is None else f"{r.latency_ms:.4f}", perf_text(r, flops, nbytes, memory_bound),
            ok, "-" if r.registers is None else str(r.registers), note[:90],
        ))  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    lines.insert(1, "-" * min(200, len(lines[0])))
    return "\n".join(line.rstrip() for line in lines)


# -- measuring and checking ------------------------------------------------------------------
class _Expected:
    """Expected outputs, computed in a background thread while candidates build."""

    def __init__(self):
        self.outputs = None
        self.error: str | None = None


class _Prober:
    """Runs each built candidate once in the probe process (:func:`pool.probe_pool`) before the
    tuning process ever loads it, so a kernel that faults (poisoning a CUDA context for good) or
    hangs costs only itself. Called in the build pool's threads as each build finishes: probes
    overlap the timing of earlier candidates. A failure is attached to the outcome's value
    (``probe_error``) and the probe process restarts with a fresh context."""

    def __init__(self, func_json: str):
        self.func_json = func_json
        self.pool = probe_pool()
        self.pool.warm_up()  # its CUDA context is made while the candidates build
        # one probe at a time, and a failed one's restart before the next probe: a candidate
        # must never run in a context an earlier one poisoned
        self.lock = threading.Lock()

    def __call__(self, out: Outcome) -> Outcome:
        if not out.ok or out.key == "ref" or not out.value.get("so_path"):
            return out
        task = Task(out.key, build_task.probe_candidate, (out.value["so_path"], self.func_json))
        with self.lock, _GPU_TURN:
            (res,) = list(self.pool.imap_unordered([task], timeout=PROBE_TIMEOUT))
            if not res.ok:
                self.pool.reset()
        if not res.ok:
            out.value["probe_error"] = (f"run: {res.error} (in the probe process; never run here)", res.log)
        return out


class _Timer:
    """Loads and times candidates one at a time, as their builds finish (so timing overlaps
    the builds still running), then re-times the fastest few."""

    def __init__(self, arch: CUDA, get_workload: Callable[[], Workload | None], budget_ms: float, method: str,
                 progress: bool | None, total: int):
        self.arch, self.get_workload, self.budget_ms, self.method = arch, get_workload, budget_ms, method
        self.flush = flush_bytes_for(arch.l2_bytes)
        self.progress, self.total, self.bar = progress, total, None
        self.arg_sets = None
        self.seconds = 0.0  # time spent loading and timing

    def _time(self, r: CompileResult) -> Timing:
        wl = self.get_workload()
        if self.arg_sets is None:
            self.arg_sets = wl.timing_arg_sets(self.arch.l2_bytes) if self.method == "rotate" else [wl.args]
        name = function_name(r.module, wl.func)
        with _GPU_TURN:
            return time_module(r.module, name, self.arg_sets, wl.dev, self.budget_ms, self.method, self.flush)

    def time(self, r: CompileResult, value: dict) -> None:
        if self.get_workload() is None:  # no GPU inputs: apply_and_build reports why
            return
        t0 = time.perf_counter()
        if self.bar is None:
            self.bar = _progress(self.total, "timing", self.progress)
        if value.get("probe_error"):
            r.error, r.log = value["probe_error"]
            if self.bar is not None:
                self.bar.update(1)
            return
        try:
            r.module = _load_module(value, self.arch)
        except Exception as e:  # noqa: BLE001
            r.error, r.log = f"load: {one_line(e)}", traceback.format_exc()
        if r.module is not None:
            try:
                r.timing = self._time(r)
                r.latency_ms = r.timing.median_ms
            except Exception as e:  # noqa: BLE001 - launch failure (too many resources, ...)
                r.error, r.log = f"run: {one_line(e)}", traceback.format_exc()
        if self.bar is not None:
            self.bar.update(1)
        self.seconds += time.perf_counter() - t0

    def retime_fastest(self, results: Sequence[CompileResult]) -> None:
        """A second, independent timing of the fastest few (now that no build competes for
        the CPU) replaces their first one: a lucky first median cannot win on its own. The few
        are the fastest by median and the fastest by best sample: on the H100 machine a first
        timing taken while builds ran was now and then 10-30% high in most of its samples."""
        if self.bar is not None:
            self.bar.close()
        t0 = time.perf_counter()
        timed = [r for r in results if r.latency_ms is not None]
        by_median = sorted(timed, key=lambda r: r.latency_ms)[:RETIME_TOP]
        by_best = sorted(timed, key=lambda r: r.timing.min_ms)[:RETIME_TOP]
        finalists = {id(r): r for r in by_median + by_best}  # CompileResult is unhashable
        for r in finalists.values():
            try:
                again = self._time(r)
                r.timing = Timing(again.median_ms, r.timing.samples_ms + again.samples_ms)
                r.latency_ms = again.median_ms
            except Exception as e:  # noqa: BLE001
                r.error, r.log, r.latency_ms = f"run: {one_line(e)}", traceback.format_exc(), None
        self.seconds += time.perf_counter() - t0


def _verify(r: CompileResult, workload: Workload, expected) -> bool:
    try:
        outs = workload.run_outputs(r.module[function_name(r.module, workload.func)])
        res = workload.check(outs, expected)
        r.verified, r.check_message = res.ok, res.message
    except Exception as e:  # noqa: BLE001
        r.verified, r.check_message = False, f"check run failed: {one_line(e)}"
    return bool(r.verified)


def apply_and_build(
    func: tvm.tirx.PrimFunc,
    configs: Sequence[Config],
    arch: CUDA | str | None = None,
    parallel_build: bool = True,
    measure: bool | None = None,
    max_workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    budget_ms: float = 100.0,
    check: str = "winner",
    verbose: bool = False,
    ref: Callable | None = None,
    *,
    template: Callable | None = None,
    hook: Callable | None = None,
    progress: bool | None = None,
    pool: WorkerPool | None = None,
    workload: Workload | None = None,
    seed: int = 0,
    stats: dict | None = None,
    timing: str = "rotate",
    probe: bool = True,
) -> tuple[list[CompileResult], CompileResult]:
    """Build, time, check ``configs`` for ``func`` on ``arch``; return ``(ranked results, best)``.

    Parameters
    ----------
    parallel_build : compile in worker processes (crash/hang-proof); False: in this process.
    measure : time on the GPU. Default: True when a GPU is present, else False with a warning.
        Without measuring, results are ranked by predicted cost and ``best`` is the
        top-ranked candidate that compiled to a cubin.
    max_workers : build processes (default: one per CPU). timeout : seconds per candidate build.
    budget_ms : timing budget per candidate (median over as many launches as fit).
    check : "winner" (check the fastest, then the next, until one is right), "all", "none".
    ref : numpy reference ``ref(*inputs) -> output(s)`` (float64); default: the same function
        scheduled by stock Dlight (``fastdlight.schedules.default_schedule``), run on the GPU.
    template : ``template(func, config) -> Schedule``; default ``fastdlight.schedules.apply_config``.
        Must be picklable (a module-level function) for parallel builds.
    hook : test-only: ``hook(index, config)`` called in the worker before scheduling.
    workload : the device inputs/outputs to time and check on (default: random, from ``seed``);
        pass one to share inputs with other measurements (benchmarks).
    stats : if given, filled with phase wall times (build_s; measure_s: timing after the last build;
        timing_s: all timing, mostly overlapped with the builds; check_s, total_s) and counts.
    probe : run each candidate once in a separate process before timing it here, so a kernel
        that faults (poisoning the CUDA context) or hangs costs only itself.
    timing : "rotate" (inputs cycled through copies, launches queued) or "flush" (L2 flushed by
        a device copy before each synchronized launch); see :mod:`fastdlight.tune.measure`.
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    if timing not in METHODS:
        raise ValueError(f"timing must be one of {METHODS}, got {timing!r}")
    configs = list(configs)
    if not configs:
        raise TuningError("no candidate configs to build (the policy emitted none)")
    if func.attrs is None or "global_symbol" not in func.attrs:
        # a private PrimFunc (as in a Relax module) cannot be compiled on its own
        func = func.with_attr("global_symbol", "main")
    arch = arch if isinstance(arch, CUDA) else auto_arch(arch)
    gpu = has_gpu()
    if measure is None:
        measure = gpu
        if not gpu:
            warnings.warn(NO_GPU_WARNING, stacklevel=2)
    elif measure and not gpu:
        warnings.warn(NO_GPU_WARNING, stacklevel=2)
        measure = False

    stats = stats if stats is not None else {}
    expected = _Expected()
    box: list = []

    def make_workload():  # random inputs, made on the GPU while candidates build
        try:
            box.append(workload if workload is not None else Workload(func, tvm.cuda(0), seed))
        except Exception as e:  # noqa: BLE001 - reported below
            expected.error = f"{type(e).__name__}: {e}"

    def numpy_reference(wl):  # runs after all timing (CPU BLAS would slow nvcc and the timing down)
        try:
            expected.outputs = wl.reference_outputs(ref)
        except Exception as e:  # noqa: BLE001 - reported when checking
            expected.error = f"reference failed: {type(e).__name__}: {e}"

    def get_workload():
        if maker.is_alive():
            maker.join()
        return box[0] if box else None

    t_start, t0_wall = time.perf_counter(), time.time()
    maker = threading.Thread(target=make_workload, daemon=True)
    timer = _Timer(arch, get_workload, budget_ms, timing, progress, len(configs)) if measure else None
    prober = _Prober(tvm.ir.save_json(func)) if measure and probe else None
    by_index: dict[int, CompileResult] = {}

    def on_outcome(out: Outcome) -> None:
        if out.key == "ref":
            return
        r = by_index[out.key] = _result_from(out, configs[out.key], out.key, func, template, t0_wall)
        if timer is not None and r.compiled and r.error is None:
            timer.time(r, out.value)

    with tempfile.TemporaryDirectory(prefix="fastdlight_build_") as out_dir:
        if measure:
            maker.start()
        outcomes = build_all(
            func, configs, arch, want_module=measure, out_dir=out_dir, parallel=parallel_build,
            max_workers=max_workers, timeout=timeout, template=template, hook=hook,
            with_reference=measure and check != "none" and ref is None, progress=progress, pool=pool,
            on_outcome=on_outcome, post=prober,
        )  # fmt: skip
        results = [by_index[i] for i in range(len(configs))]
        t_built = time.perf_counter()
        if parallel_build:
            stats["workers_ready_at"] = (pool or shared_pool(max_workers)).ready_times()
        stats.update(build_s=t_built - t_start, candidates=len(configs), compiled=sum(r.compiled for r in results))

        if not measure:
            ranked = rank(results)
            best = ranked[0] if ranked and ranked[0].compiled else None
            stats["total_s"] = time.perf_counter() - t_start
            return _finish(ranked, best, verbose, t_start, "compiled")

        wl = get_workload()
        if wl is None:
            raise TuningError(f"cannot set up the GPU inputs: {expected.error}")
        timer.retime_fastest(results)
        t_measured = time.perf_counter()
        # the numpy reference only after the last timing: BLAS on every core would take the CPU
        # from the thread queueing the timed launches
        if ref is not None and check != "none":
            numpy_reference(wl)
        # measure_s: timing left after the last build; timing_s: all of it (mostly overlapped)
        stats.update(measure_s=t_measured - t_built, timing_s=timer.seconds)

        if check != "none" and ref is None:  # stock Dlight on the same inputs is the reference
            ref_out = outcomes.get("ref")
            try:
                if ref_out is None or not ref_out.ok:
                    raise RuntimeError(ref_out.error if ref_out else "no reference build")
                ref_mod = _load_module(ref_out.value, arch)
                expected.outputs = wl.run_outputs(ref_mod[function_name(ref_mod, func)])
            except Exception as e:  # noqa: BLE001
                expected.error = f"reference (stock Dlight) unavailable: {one_line(e)}"

    timed = sorted((r for r in results if r.latency_ms is not None), key=lambda r: r.latency_ms)
    best = None
    if check == "none" or expected.outputs is None:
        if check != "none":
            warnings.warn(f"fastdlight: could not check results ({expected.error}); best is unverified",
                          stacklevel=2)
        best = timed[0] if timed else None
    else:
        for r in timed if check == "all" else []:
            _verify(r, wl, expected.outputs)
        for r in timed:
            if (r.verified is None and _verify(r, wl, expected.outputs)) or r.verified:
                best = r
                break
    stats["check_s"] = time.perf_counter() - t_measured
    stats["total_s"] = time.perf_counter() - t_start
    return _finish(rank(results), best, verbose, t_start, "verified" if check != "none" else "measured", wl.bytes)


def _finish(ranked, best, verbose, t_start, what, nbytes=None):
    if best is None:
        raise TuningError(
            f"no candidate could be used ({len(ranked)} tried, none {what}):\n{failure_summary(ranked)}"
        )
    if verbose:
        print(format_table(ranked, nbytes=nbytes, best=best))
        print(f"{len(ranked)} candidates in {time.perf_counter() - t_start:.1f} s")
    return ranked, best
