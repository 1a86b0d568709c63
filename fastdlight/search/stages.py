"""The build, probe and measure phases of a tuning run (see :mod:`.runner` for the whole).

Builds run in worker processes and arrive in completion order; each is probed (in the pool's
post-processing thread, so probes overlap the timing of earlier candidates) and then timed in
this process while the other candidates still build.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from fastdlight.arch import CUDA
from fastdlight.compiler import build_task
from fastdlight.measure import clock
from fastdlight.measure.gpu_turns import GPU_TURNS
from fastdlight.measure.graph_timing import GRAPH_BELOW_MS, MIN_GRAPH_MS, LaunchGraph
from fastdlight.compiler.artifacts import BuildArtifact, BuildRequest
from fastdlight.search.results import CompileResult, Failure
from fastdlight.measure.timing import (HEAT_LIGHT_MS, Timing, flush_bytes_for, function_name, heat,
                                       launch_estimate_ms, time_module, timed_by_probe)
from fastdlight.measure.workload import Workload
from fastdlight.search.options import TuneOptions
from fastdlight.compiler.pool import probe_pool, shared_pool
from fastdlight.compiler.workers import Outcome, Task, one_line

#: how many of the fastest candidates are timed a second time (filters optimistic outliers)...
RETIME_TOP = 3
#: ...of those whose first timing (median or best sample) is within this fraction of the
#: fastest's: the hot retime reorders candidates by up to 13% (a 128x192 tile that won an H100's
#: first pass ran 12% behind hot; 8192³'s best-estimated tile came 5-13% behind first), and a
#: CNN's tune spent a quarter of its GPU turn on hot turns (H200, efficientnet_b0: 19.7 of 79 s)
RETIME_WITHIN = 0.25
#: besides them, the best-estimated few of the candidates whose first timing is within
#: ``ESTIMATE_FINALIST_FRACTION`` of the fastest: the first pass times each candidate at the clock
#: the GPU has just then, which varies by 15% between candidates; on an H100 a 192 x 192 tile of
#: LLaMA's up projection, 1% behind first there (at 1732 MHz against 1980), ran 7% ahead hot. In
#: 8192³ tunes the best-estimated 128x256 came up to 13% behind the fastest in the first pass
#: (H100 80GB HBM3, 2026-11-27): left out, 128x192 (bf16 NN, 0.99x cuBLAS at its own clock; 128x256 1.02x) or
#: 256x192 (fp16 NT) won
RETIME_BY_ESTIMATE, ESTIMATE_FINALIST_FRACTION = 2, 0.15
#: the second timing takes turns: each finalist is timed for its :func:`hot_budget_ms` / ``RETIME_ROUNDS`` per
#: round, so all of them see the GPU in the same state, the sustained one (see ``measure.heat``)
RETIME_ROUNDS = 3
#: a finalist whose first timing is at least ``OWN_HEAT_MIN_MS`` a launch runs ``OWN_HEAT_MS``
#: untimed before each of its turns, so that it is timed at the clock its own power draw
#: leaves, not the one the previous finalist left. On an H100, LLaMA's up projection
#: (2048x11008x4096): after 2 s of each alone, 192x192 ran 0.286 ms and 64x256 0.307, but in
#: plain turns 64x256 timed ahead (0.294 against 0.297); with this heat, 0.276 against 0.311.
#: Shorter kernels draw less power and would only lengthen the tuning
OWN_HEAT_MS, OWN_HEAT_MIN_MS = 100.0, 0.1
#: a finalist's hot turns last at least ``HOT_LAUNCHES`` of its launches, at least ``HOT_MIN_MS``
#: and at most ``budget_ms`` in all: a 5 us kernel has a steady median long before 100 ms, and at
#: 100 ms per finalist the hot turns of a 60-function CNN took about half a minute. Each round
#: still replays its graph ``MIN_REPLAYS`` times, a millisecond each
HOT_LAUNCHES, HOT_MIN_MS = 3000, 15.0
#: a first-pass graph holds launches for at least this long (a hot turn's, ``MIN_GRAPH_MS``): the
#: first pass only picks the finalists, and a graph replay's fixed host cost, spread over fewer
#: launches, weighs on every candidate alike. Capturing is the larger part of a short kernel's
#: first pass (a Python launch each, then the graph's instantiation)
SCREEN_GRAPH_MS = 0.25
#: seconds a single probe run may take (load + one launch) before it counts as hung
PROBE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Built:
    """One build's outcome: an artifact, or the failure (with its stage) that stopped it."""

    key: int | str
    artifact: BuildArtifact | None
    failure: Failure | None
    seconds: float


def _failure_of(out: Outcome) -> Failure:
    error = out.error or "unknown error"
    head = error.split(":", 1)[0]
    if head in ("schedule", "lower", "nvcc", "export"):
        return Failure(head, error, out.log)
    stage = "timeout" if error.startswith("timeout") else "crash"
    return Failure(stage, error, out.log)


def built_of(out: Outcome) -> Built:
    clock.add("build", out.seconds)
    phases = getattr(out.value, "phases", None) if out.ok else None
    if phases is not None:
        clock.add("build: schedule", phases.schedule_s)
        clock.add("build: lower + compile", phases.compile_s)
        clock.add("build: export", phases.export_s)
    if out.ok:
        return Built(out.key, out.value, None, out.seconds)
    return Built(out.key, None, _failure_of(out), out.seconds)


# -- build -----------------------------------------------------------------------------------
def _progress(total: int, desc: str, enabled: bool | None):
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="cand", leave=False, file=sys.stderr)


def _run_serial(tasks: list[Task]) -> Iterator[Outcome]:
    build_task.init_worker()
    for task in tasks:
        t0 = time.monotonic()
        try:
            yield Outcome(task.key, True, task.fn(*task.args), seconds=time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - recorded on the candidate
            log = "\n".join(filter(None, [getattr(e, "log", ""), traceback.format_exc()]))
            yield Outcome(task.key, False, None, one_line(e), log, time.monotonic() - t0)


def build_stream(requests: Sequence[BuildRequest], opts: TuneOptions,
                 probe: Callable[[Built], Built] | None) -> Iterator[Built]:
    """Build every request (in worker processes unless ``opts.parallel_build`` is False) and
    yield each :class:`Built` as it finishes, probed first when ``probe`` is given."""
    tasks = [Task(r.key, build_task.build_candidate, (r,)) for r in requests]

    def post(out: Outcome) -> Built:
        built = built_of(out)
        return probe(built) if probe is not None else built

    if opts.parallel_build:
        pool = opts.pool or shared_pool(opts.max_workers)
        stream = pool.imap_unordered(tasks, timeout=opts.timeout, post=post)
    else:
        stream = map(post, _run_serial(tasks))
    bar = _progress(len(tasks), "building", opts.progress)
    for built in _waited(stream):
        if bar is not None:
            bar.update(1)
        yield built if isinstance(built, Built) else built_of(built)  # a post that raised
    if bar is not None:
        bar.close()


def _waited(stream: Iterator) -> Iterator:
    """``stream``, with the time spent waiting for each item booked as "build wait"."""
    while True:
        with clock.stage("build wait"):
            item = next(stream, None)
        if item is None:
            return
        yield item


# -- probe -----------------------------------------------------------------------------------
#: launch errors that leave a CUDA context usable: the launch was refused before the kernel ran
#: (runtime and driver spellings). Any other failure, a fault or a hang, poisons the probe
#: process's context, which is then replaced (a new process: its TVM import, context and inputs)
REFUSED_LAUNCH = ("cudaErrorLaunchOutOfResources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                  "cudaErrorInvalidConfiguration", "too many resources requested for launch")


def context_survives(error: str) -> bool:
    """Whether a probe that failed with ``error`` left its process's CUDA context usable."""
    return any(name in (error or "") for name in REFUSED_LAUNCH)


class Prober:
    """Runs each built module once in the probe process (:func:`pool.probe_pool`) on the run's
    real inputs, before this process ever loads it: a kernel that faults (poisoning a CUDA
    context for good) or hangs costs only itself. Such a failure restarts the probe process; a
    launch refused before it ran (too many registers for the block) does not."""

    def __init__(self, seed: int, device: int = 0):
        self.seed, self.device = seed, device
        self.pool = probe_pool(device)
        self.pool.warm_up()  # its CUDA context is made while the candidates build
        # one probe at a time, and a failed one's restart before the next: a module must never
        # run in a context an earlier one poisoned
        self.lock = threading.Lock()

    def prepare(self, func_json: str) -> threading.Thread:
        """Have the probe process make the function's random inputs now, while its candidates
        build, instead of in its first probe, which holds the GPU turn (an 8192² fp16 pair took
        about a second). A failure is left for that probe to meet and report."""
        task = Task("inputs", build_task.prepare_probe_inputs, (func_json, self.seed))

        def send():
            with self.lock:
                list(self.pool.imap_unordered([task], timeout=PROBE_TIMEOUT))

        thread = threading.Thread(target=send, daemon=True, name="fastdlight-probe-inputs")
        thread.start()
        return thread

    def run(self, so_path: str, func_json: str) -> Failure | None:
        task = Task("probe", build_task.probe_candidate, (so_path, func_json, self.seed))
        with self.lock, clock.holding(GPU_TURNS.turn(self.device), "probe"):
            (res,) = list(self.pool.imap_unordered([task], timeout=PROBE_TIMEOUT))
            if not res.ok and not context_survives(res.error):
                self.pool.reset()
        if res.ok:
            return None
        return Failure("probe", f"probe: {res.error} (in the probe process; never run here)", res.log)

    def __call__(self, built: Built) -> Built:
        art = built.artifact
        if art is None or art.so_path is None or art.probe_func_json is None:
            return built
        failure = self.run(art.so_path, art.probe_func_json)
        return built if failure is None else Built(built.key, art, failure, built.seconds)


# -- measure ---------------------------------------------------------------------------------
def load_module(art: BuildArtifact, arch: CUDA):
    import tvm

    if art.so_path:
        return tvm.runtime.load_module(art.so_path)
    if art.mod_json:
        return build_task.rebuild_with_cubin(art.mod_json, arch.target, art.cubin)
    raise RuntimeError(art.export_error or "the worker returned no module")


class Timer:
    """Loads and times candidates one at a time, as their builds finish (so timing overlaps
    the builds still running), for ``screen_ms`` each; then times the fastest few again for
    ``budget_ms``."""

    def __init__(self, arch: CUDA, get_workload: Callable[[], Workload | None], opts: TuneOptions, device: int = 0,
                 spare: dict[int, Callable[[], Workload | None]] | None = None):
        """``get_workload``: the inputs, made on GPU ``device``. ``spare``: the same inputs made
        on other GPUs (by index): each first-pass timing goes to whichever of these GPUs is free
        first, and the finalists' hot turns all to one of them, the first free then."""
        self.arch, self.get_workload, self.opts = arch, get_workload, opts
        self.getters = {device: get_workload, **(spare or {})}
        #: the GPU whose turn this timer holds now; after the hot turns, the one that timed them
        self.device = device
        self.flush = flush_bytes_for(arch.l2_bytes)
        self._arg_sets: dict[int, list] = {}
        #: set once any candidate of the run proved short (:meth:`_wants_graph`): from then on every
        #: timing is taken from a CUDA graph, so that candidates (stock Dlight's too) and the
        #: finalists' hot turns are compared on one method, not on whichever each timing fell into
        self.graph = False
        #: set when the hot turns start: they are all timed the way the first pass decided
        self.settled = False
        #: the fastest first-pass time so far: a candidate :data:`STOCK_FINALIST_BEHIND` times
        #: slower can be no finalist (:func:`pick_finalists`), so its timing stops at the probe
        self.fastest_ms = math.inf

    def workload(self) -> Workload | None:
        """The inputs on the GPU this timer holds (or last held)."""
        return self.getters[self.device]()

    @property
    def arg_sets(self) -> list | None:
        return self._arg_sets.get(self.device)

    def _sets(self, wl: Workload) -> list:
        if self.device not in self._arg_sets:
            with clock.stage("time: input copies"):
                self._arg_sets[self.device] = (wl.timing_arg_sets(self.arch.l2_bytes) if self.opts.timing == "rotate"
                                               else [wl.args])
        return self._arg_sets[self.device]

    @contextlib.contextmanager
    def _turn(self):
        """The turn of the first free GPU among those with inputs, taken once they are made:
        their copies take the turn too, so waiting for them while holding one would never end.
        A spare GPU whose inputs failed is left out."""
        devices = [i for i, get in self.getters.items() if get() is not None] or list(self.getters)[:1]
        with GPU_TURNS.first_free(devices, "time") as device:
            self.device = device
            yield device

    def time(self, module, budget_ms: float) -> Timing:
        """The first pass's timing of ``module`` (graphs of ``SCREEN_GRAPH_MS``)."""
        give_up = self.fastest_ms * STOCK_FINALIST_BEHIND if math.isfinite(self.fastest_ms) else None
        with self._turn():
            timing = self._time(module, budget_ms, SCREEN_GRAPH_MS, give_up)
        self.fastest_ms = min(self.fastest_ms, timing.median_ms)
        return timing

    def _time(self, module, budget_ms: float, graph_ms: float = MIN_GRAPH_MS, give_up_ms: float | None = None) -> Timing:
        """(The GPU turn held, the workload made.) Queued launches, then, for a short kernel
        (:meth:`_wants_graph`), a timing replayed from a CUDA graph instead, where the host's
        launch loop cannot set the pace. In a model's tuning the other functions' threads share
        the interpreter with it: LLaMA's attention matmul was reported at 66 us hot, beside stock
        Dlight's 15 us, while alone it timed 5 us and the whole tuned model ran in 135 us (H200,
        2026-11-29). Once the run times from graphs, a few queued launches only size the graph:
        timed at the whole budget as well, they had taken half of a model's timing time."""
        wl = self.workload()
        arg_sets = self._sets(wl)
        name = function_name(module, wl.func)
        if self.graph:  # only ever with "rotate"
            try:
                with clock.stage("time: estimate"):
                    estimate = launch_estimate_ms(module[name], arg_sets, wl.dev)
                if timed_by_probe(estimate, budget_ms, give_up_ms):
                    # no finalist, or a launch that outlasts the budget: no graph. Booked as the
                    # run's timings are (a queued first timing of a graph run would stay eligible
                    # as a finalist: pick_finalists)
                    return Timing.of([estimate], graph=True)
                return self._graph_time(module[name], wl.dev, estimate, budget_ms, graph_ms)
            except Exception:  # noqa: BLE001 - a kernel a graph cannot hold gets a queued timing
                return time_module(module, name, arg_sets, wl.dev, budget_ms, self.opts.timing, self.flush, give_up_ms)
        with clock.stage("time: queued"):
            timing = time_module(module, name, arg_sets, wl.dev, budget_ms, self.opts.timing, self.flush, give_up_ms)
        if not self._wants_graph(timing):
            return timing
        try:
            return self._graph_time(module[name], wl.dev, timing.min_ms, budget_ms, graph_ms)
        except Exception:  # noqa: BLE001 - a kernel a graph cannot hold keeps its queued timing
            return timing

    def _graph_time(self, launch, dev, per_launch_ms: float, budget_ms: float, graph_ms: float) -> Timing:
        """A timing from a graph captured for it (its capture and replays booked apart)."""
        with clock.stage("time: capture"):
            graph = LaunchGraph(launch, self.arg_sets, dev, per_launch_ms, graph_ms)
        with graph, clock.stage("time: replays"):
            return graph.time(budget_ms)

    def _wants_graph(self, queued: Timing) -> bool:
        """Whether to time from a CUDA graph: always once the run has met a short kernel. Judged
        by the best queued sample, not the median: under concurrent tuning the host's launch loop
        sets the pace of most samples: GPT-2's ``fused_matmul1_cast5`` was reported at 83 us (a
        queued hot time: the median was over the threshold) and won against stock Dlight's 18 us
        (a first-pass time from a graph), in a model whose two layers ran in 120 us (H200)."""
        if self.opts.timing != "rotate":
            return False
        if not self.settled:
            self.graph = self.graph or queued.min_ms < GRAPH_BELOW_MS
        return self.graph

    def measure(self, r: CompileResult) -> CompileResult:
        """``r`` loaded and timed, or with the stage that failed (probe, load, run)."""
        if self.get_workload() is None:  # no GPU inputs: the run reports why
            return r
        try:
            with clock.stage("load"):
                module = load_module(r.artifact, self.arch)
        except Exception as e:  # noqa: BLE001
            return r.failed("load", f"load: {one_line(e)}", traceback.format_exc())
        try:
            return r.replace(module=module, timing=self.time(module, min(self.opts.screen_ms, self.opts.budget_ms)))
        except Exception as e:  # noqa: BLE001 - launch failure (too many resources, ...)
            return r.replace(module=module).failed("run", f"run: {one_line(e)}", traceback.format_exc())

    def retime_fastest(self, results: Sequence[CompileResult]) -> list[CompileResult]:
        """A second, independent timing of the fastest few (now that no build competes for
        the CPU) replaces their first one: a lucky first median cannot win on its own. The few
        are the fastest by median and the fastest by best sample: on the H100 machine a first
        timing taken while builds ran was now and then 10-30% high in most of its samples.

        It is taken on a hot GPU, the finalists in turns: the first pass times each candidate
        right after its build, on a GPU that idled meanwhile, while a model (or any benchmark)
        runs its kernels back to back at the clock the power limit allows. On an H100 that
        clock is 15-30% lower for a GEMM, and tiles slow down by different amounts: a 128x192
        tile that won the first pass ran 12% slower hot, behind a 256x128 one."""
        finalists = [r for r in results if r.index in {f.index for f in pick_finalists(results, self.graph)}]
        if not finalists:
            return list(results)
        hot = self._hot_turns(finalists)
        return [hot.get(r.index, r) for r in results]

    def _hot_turns(self, finalists: list[CompileResult]) -> dict[int, CompileResult]:
        """Each finalist with its hot timing (all rounds' samples), or failed, by index."""
        samples: dict[int, list[float]] = {r.index: [] for r in finalists}
        graphed = dict.fromkeys(samples, True)
        failed: dict[int, CompileResult] = {}
        graphs: dict[int, LaunchGraph | None] = {}
        self.settled = True
        with self._turn():
            self._heat(finalists[0])
            try:
                with clock.stage("time: hot turns"):
                    self._rounds(finalists, samples, graphed, failed, graphs)
            finally:
                for graph in graphs.values():
                    if graph is not None:
                        graph.close()
        # a graph timing only where every round was one: a round a graph could not hold is queued
        return {r.index: failed.get(r.index) or r.replace(timing=Timing.of(samples[r.index], hot=True,
                                                                            graph=graphed[r.index]))
                for r in finalists}

    def _rounds(self, finalists, samples, graphed, failed, graphs) -> None:
        """(GPU turn held) ``RETIME_ROUNDS`` hot turns of each finalist, in turn; after each
        round but the last, the finalists :func:`out_of_the_race` sit the rest out (their hot
        samples so far are their timing)."""
        out: set[int] = set()
        for round_ in range(RETIME_ROUNDS):
            if round_:
                out |= out_of_the_race(samples, failed)
            for r in (r for r in finalists if r.index not in failed and r.index not in out):
                try:
                    if r.latency_ms >= OWN_HEAT_MIN_MS and not (round_ == 0 and r is finalists[0]):  # just heated
                        self._hot_time(r, OWN_HEAT_MS, graphs)
                    budget_ms = hot_budget_ms(r.latency_ms, self.opts.budget_ms)
                    timing = self._hot_time(r, budget_ms / RETIME_ROUNDS, graphs)
                except Exception as e:  # noqa: BLE001
                    failed[r.index] = r.failed("run", f"run: {one_line(e)}", traceback.format_exc())
                    continue
                samples[r.index] += timing.samples_ms
                graphed[r.index] = graphed[r.index] and timing.graph

    def _hot_time(self, r: CompileResult, budget_ms: float, graphs: dict[int, LaunchGraph | None]) -> Timing:
        """One hot turn of ``r``. In a run that times from graphs, each finalist's graph is
        captured at its first turn (sized by its first-pass time) and replayed in the rest:
        a capture costs the host about as long as the replays it times. ``graphs[index]`` is
        None for a kernel a graph could not hold."""
        if not self.graph:
            return self._time(r.module, budget_ms)
        if r.index not in graphs:
            wl = self.workload()
            try:
                with clock.stage("time: capture"):
                    graphs[r.index] = LaunchGraph(r.module[function_name(r.module, wl.func)], self._sets(wl), wl.dev,
                                                  r.timing.min_ms)
            except Exception:  # noqa: BLE001 - timed without a kept graph (queued, as _time falls back)
                graphs[r.index] = None
        graph = graphs[r.index]
        return graph.time(budget_ms) if graph is not None else self._time(r.module, budget_ms)

    def _heat(self, r: CompileResult) -> None:
        """Run the first finalist until the GPU's clock settles under its load; not for a kernel
        under ``HEAT_LIGHT_MS``: the heat is for the clock the power limit leaves a long GEMM,
        and a CNN's micro-kernels, which draw far less, spent 6 of efficientnet_b0's 79 s in it
        (H200)."""
        if r.latency_ms < HEAT_LIGHT_MS:
            return
        wl = self.workload()
        try:
            with clock.stage("heat"):
                heat(r.module[function_name(r.module, wl.func)], self._sets(wl), wl.dev)
        except Exception:  # noqa: BLE001 - the rounds below report a launch that fails
            pass


#: after a round of hot turns, a finalist whose median so far is this fraction or more behind the
#: best one's takes no further turns: hot turns with each finalist's own heat reordered tiles by
#: up to 13% (``OWN_HEAT_MS``, ``RETIME_WITHIN``). A LLaMA layer (T2048, H200, 2026-11-30) spent
#: 23 of its 40 s tune in hot turns; raced, it tuned in 23.1 s (8.0 s) and ran 0.397 ms (0.413)
RACE_BEHIND = 0.15


def out_of_the_race(samples: dict[int, list[float]], failed) -> set[int]:
    """The finalists (by index) whose median hot sample is :data:`RACE_BEHIND` or more behind
    the best median."""
    medians = {i: statistics.median(s) for i, s in samples.items() if s and i not in failed}
    if not medians:
        return set()
    best = min(medians.values())
    return {i for i, m in medians.items() if m >= best * (1 + RACE_BEHIND)}


def hot_budget_ms(latency_ms: float, budget_ms: float) -> float:
    """The milliseconds of a finalist's hot turns (all rounds) for its first-pass latency."""
    return min(budget_ms, max(HOT_MIN_MS, HOT_LAUNCHES * latency_ms))


def pick_finalists(results: Sequence[CompileResult], graph_run: bool = False) -> list[CompileResult]:
    """The candidates :meth:`Timer.retime_fastest` times again: the fastest few by median and by
    best sample, and the best-estimated few of those near the fastest, each within its window of
    the fastest; stock Dlight's fastest. ``graph_run``: the run times from CUDA graphs, so a
    first timing of queued launches (taken before the run met a short kernel, maybe at the busy
    host's pace) is no measure of how far behind a candidate is: it stays eligible."""
    timed = [r for r in results if r.latency_ms is not None]
    if not timed:
        return []

    def within(r: CompileResult, key, fastest: float, fraction: float) -> bool:
        return (graph_run and not r.timing.graph) or key(r) <= fastest * (1 + fraction)

    median, best = (lambda r: r.latency_ms), (lambda r: r.timing.min_ms)
    fastest, fastest_best = min(map(median, timed)), min(map(best, timed))
    by_median = [r for r in sorted(timed, key=median)[:RETIME_TOP] if within(r, median, fastest, RETIME_WITHIN)]
    by_best = [r for r in sorted(timed, key=best)[:RETIME_TOP] if within(r, best, fastest_best, RETIME_WITHIN)]
    near = [r for r in timed if r.predicted_cost > 0 and within(r, median, fastest, ESTIMATE_FINALIST_FRACTION)]
    by_estimate = sorted(near, key=lambda r: r.predicted_cost)[:RETIME_BY_ESTIMATE]
    stock = [r for r in timed if r.config.is_stock]
    # stock's fastest, the baseline the winner is reported against, unless it cannot win
    fastest_stock = [r for r in ([min(stock, key=median)] if stock else [])
                     if within(r, median, fastest, STOCK_FINALIST_BEHIND - 1)]
    return list({r.index: r for r in by_median + by_best + by_estimate + fastest_stock}.values())


#: stock Dlight's fastest is a finalist unless its first timing is this many times the fastest's:
#: a finalist is the winner's baseline in the report (``stock_ms``; a hot finalist outranks any
#: first-pass time, so left out a close one could lose to a slower kernel and be reported beside
#: it with a number measured another way), but one far behind cannot win, and its hot turns cost
#: the most: the finalists' hot turns took 26 of a 4096-token attention tune's 34 s (H200), stock's
#: schedule among them however far behind
STOCK_FINALIST_BEHIND = 4.0
