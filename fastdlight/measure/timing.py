"""Timing built kernels on the GPU, fairly.

* Timing ("rotate", the default) keeps every launch's inputs out of L2 by cycling through
  enough device copies of them (:func:`rotation_copies`: at least twice the L2 read in between),
  and queues ``number`` launches between two CUDA events so the host's launch latency is
  paid once per sample, not once per launch (:func:`time_launches`). Median over a time
  budget (100 ms by default) after a warm-up.
  Why not flush? Flushing by writing a buffer larger than L2 (TVM's ``cache_flush_bytes``,
  Triton's ``cache.zero_()``) leaves L2 full of *dirty* lines: a short kernel then pays to
  write them back while it reads, and a synchronize before each launch adds the launch
  latency. On an H100 a 16384×1024 fp16 row sum measured 22 µs that way and 14 µs rotated
  (torch's own: 31 vs 16 µs); 3 ms matmuls barely change. "flush" (TVM's
  ``time_evaluator``: 1.5 × L2 device copy, synchronize, one launch between events) is kept
  for comparison.
* The inputs and outputs a kernel is timed and checked on: :mod:`fastdlight.measure.workload`.
* :func:`time_torch` times a torch callable the same way (torch is optional).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from fastdlight.measure.cuda_events import Event, ensure_context



@dataclass(frozen=True)
class Timing:
    """Median milliseconds per launch, and every sample it was taken from. ``hot``: taken in
    the finalists' second timing, on a GPU at its sustained clock (see ``measure.heat``); such a
    timing is compared only with others like it. ``graph``: every sample was replayed from a CUDA
    graph (``measure.graph_timing``); a short kernel's queued launches time the host's launch
    loop instead, so the two are not compared either."""

    median_ms: float
    samples_ms: tuple[float, ...] = ()
    hot: bool = False
    graph: bool = False

    @classmethod
    def of(cls, samples, hot: bool = False, graph: bool = False) -> Timing:
        samples = tuple(float(s) for s in samples)
        return cls(float(np.median(samples)), samples, hot, graph)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms) if self.samples_ms else self.median_ms


# -- function signature analysis -------------------------------------------------------------
# -- timing -----------------------------------------------------------------------------------
#: each timed sample queues launches for at least this long, so the host's launch latency
#: (paid once per sample, when the GPU is idle) is a small fraction of it
MIN_SAMPLE_MS = 0.5
#: the most input copies a rotation uses, and the most bytes they may take together
MAX_COPIES, MAX_ROTATION_BYTES = 256, 4 << 30
#: timing methods: "rotate" (default) and "flush" (see the module docstring)
METHODS = ("rotate", "flush")
#: the first timing on a device in a process keeps the GPU busy this long first: an idle GPU runs
#: at low clocks and ramps up while it works, so the first candidates of a run read slower than
#: later ones and the tuner's pick among near-equal tiles went to one timed late
CLOCK_WARMUP_MS = 300.0
_CLOCKS_UP: set[int] = set()


def flush_bytes_for(l2_bytes: int) -> int:
    """A copy of this many bytes evicts the whole L2 (copy reads + writes it, > L2 each)."""
    return int(max(l2_bytes, 8 << 20) * 1.5) // 4 * 4


def rotation_copies(input_bytes: int, l2_bytes: int) -> int:
    """How many copies of the inputs to cycle through so that, when a launch starts, at least
    twice the L2 of other data was read since its own inputs were last touched."""
    if input_bytes <= 0:
        return 1
    want = 1 + math.ceil(2 * max(l2_bytes, 8 << 20) / input_bytes)
    fit = max(1, MAX_ROTATION_BYTES // input_bytes)
    return max(1, min(want, fit, MAX_COPIES))


def _repeats(per_call_s: float, budget_ms: float, hi: int = 20000) -> int:
    """Launches that fit the budget; at least 10 (5 for launches over 10 ms, whose relative
    noise is small anyway)."""
    lo = 5 if per_call_s > 0.01 else 10
    return int(min(hi, max(lo, budget_ms / 1e3 / max(per_call_s, 1e-7))))


def time_launches(launch, arg_sets: list, dev, budget_ms: float = 100.0, give_up_ms: float | None = None) -> Timing:
    """Median milliseconds per ``launch(*args)``, cycling through ``arg_sets``.

    On a CUDA device each sample is ``number`` back-to-back launches between two CUDA events
    (``number`` chosen so a sample lasts >= MIN_SAMPLE_MS), several samples are queued before
    the host waits, and samples are taken for about ``budget_ms``. Elsewhere (CPU tests) a
    host clock around synchronized launches stands in. ``give_up_ms``: a launch the probe finds
    slower than this is timed no further (the probe's time is the one sample): the caller knows
    it cannot win. A long launch (:data:`LONG_LAUNCH_MS`) that outlasts ``budget_ms`` is not
    either."""
    arg_sets = [list(a) for a in arg_sets] or [[]]
    state = {"i": 0}

    def run(k: int) -> None:
        for _ in range(k):
            launch(*arg_sets[state["i"] % len(arg_sets)])
            state["i"] += 1

    if dev.dlpack_device_type() != tvm.cuda(0).dlpack_device_type():
        return _time_on_host(run, dev, budget_ms)
    dev.sync()  # also makes the device's context current on this thread for the runtime
    ensure_context(dev.index)
    run(len(arg_sets))  # warm-up: module load, clocks, every input copy touched once
    per_launch = _queued_probe_ms(run)
    if timed_by_probe(per_launch, budget_ms, give_up_ms):
        return Timing.of([per_launch])
    if dev.index not in _CLOCKS_UP:
        _CLOCKS_UP.add(dev.index)
        deadline = time.perf_counter() + CLOCK_WARMUP_MS / 1e3
        while time.perf_counter() < deadline:
            run(max(1, math.ceil(5.0 / max(per_launch, 1e-3))))  # ~5 ms of queued launches
            dev.sync()
    number = max(1, math.ceil(MIN_SAMPLE_MS / max(per_launch, 1e-4)))
    n_samples = _repeats(per_launch * number / 1e3, budget_ms, hi=2000)
    events = [(Event(), Event()) for _ in range(min(n_samples, 50))]
    samples: list[float] = []
    while len(samples) < n_samples:
        batch = events[: n_samples - len(samples)]
        for a, b in batch:
            a.record()
            run(number)
            b.record()
        batch[-1][1].synchronize()
        samples += [a.elapsed_ms(b) / number for a, b in batch]
    return Timing.of(samples)


#: a launch this long is its own probe: the host's launch latency is under 0.1% of it, and the 4
#: more launches would cost seconds where a naive schedule runs a second a launch (stock Dlight's
#: of a 8192-token attention: most of that tune's 25 s, H200)
LONG_LAUNCH_MS = 10.0


def timed_by_probe(per_launch_ms: float, budget_ms: float, give_up_ms: float | None = None) -> bool:
    """Whether a launch the probe found ``per_launch_ms`` long is timed no further (the probe's
    time is its one sample): slower than ``give_up_ms`` (the caller knows it cannot win), or a
    long launch (:data:`LONG_LAUNCH_MS`) that outlasts the whole budget, where five samples more
    would add seconds (a naive schedule runs a second a launch) and no precision."""
    return (give_up_ms is not None and per_launch_ms > give_up_ms) or per_launch_ms >= max(LONG_LAUNCH_MS, budget_ms)


def _queued_probe_ms(run) -> float:
    """ms per launch of 4 queued launches (after one), so launch latency shows only once; a
    launch of :data:`LONG_LAUNCH_MS` or more is timed alone."""
    start, end = Event(), Event()
    per_launch = 0.0
    for k in (1, 4):
        start.record()
        run(k)
        end.record()
        end.synchronize()
        per_launch = start.elapsed_ms(end) / k
        if per_launch >= LONG_LAUNCH_MS:
            break
    return per_launch


def launch_estimate_ms(launch, arg_sets: list, dev) -> float:
    """A rough ms per ``launch`` (one warm-up launch, then a few queued ones): enough to size a
    CUDA graph (:class:`~fastdlight.measure.graph_timing.LaunchGraph`), in well under a
    millisecond for a short kernel where :func:`time_launches` takes its whole budget."""
    args = list(arg_sets[0]) if arg_sets else []

    def run(k: int) -> None:
        for _ in range(k):
            launch(*args)

    dev.sync()
    run(1)
    if dev.dlpack_device_type() != tvm.cuda(0).dlpack_device_type():
        t = time.perf_counter()
        run(1)
        dev.sync()
        return (time.perf_counter() - t) * 1e3
    ensure_context(dev.index)
    return _queued_probe_ms(run)


#: a GPU is hot when the time per launch of a ``HEAT_BATCH_MS`` batch back to back has stopped
#: rising (within ``HEAT_SETTLED``) after ``HEAT_MIN_MS``, or after ``HEAT_MAX_MS``. On an H100 a
#: GEMM's time per launch rose for about 100 ms from idle (0.157 -> 0.175 ms), then swung
#: within +-10% as the power limit held the clock; a kernel under ``HEAT_LIGHT_MS`` a launch
#: heats for one batch at least
HEAT_BATCH_MS, HEAT_SETTLED, HEAT_MIN_MS, HEAT_MAX_MS, HEAT_LIGHT_MS = 20.0, 0.005, 150.0, 500.0, 0.02


def heat(launch, arg_sets: list, dev, max_ms: float = HEAT_MAX_MS) -> float:
    """Run ``launch`` back to back until its time per launch stops rising: the GPU is then at
    the clock its power limit allows under this load, where a model runs it. Returns the
    milliseconds spent (at most about ``max_ms``)."""
    t0, last = time.perf_counter(), None
    while (elapsed := (time.perf_counter() - t0) * 1e3) < max_ms:
        now = time_launches(launch, arg_sets, dev, HEAT_BATCH_MS).median_ms
        least = HEAT_MIN_MS if now >= HEAT_LIGHT_MS else 0.0
        if last is not None and elapsed >= least and now <= last * (1 + HEAT_SETTLED):
            break
        last = now
    return (time.perf_counter() - t0) * 1e3


def _time_one_at_a_time(once, budget_ms: float) -> Timing:
    """Median of ``once()`` (milliseconds of one synchronized launch) over ``budget_ms``, after
    a warm-up; the first three calls also size the repetitions."""
    once()
    t0 = time.perf_counter()
    probe = [once() for _ in range(3)]
    per_call = (time.perf_counter() - t0) / 3
    samples = probe + [once() for _ in range(_repeats(per_call, budget_ms) - 3)]
    return Timing.of(samples)


def _time_on_host(run, dev, budget_ms: float) -> Timing:
    def once() -> float:
        t = time.perf_counter()
        run(1)
        dev.sync()
        return (time.perf_counter() - t) * 1e3

    return _time_one_at_a_time(once, budget_ms)


def time_module(mod, fname: str, arg_sets, dev, budget_ms: float = 100.0, method: str = "rotate",
                flush_bytes: int = 0, give_up_ms: float | None = None) -> Timing:
    """Median latency of ``mod[fname]`` (see the module docstring for the two methods).

    ``arg_sets``: a list of argument lists to rotate through ("rotate"; see
    :meth:`Workload.timing_arg_sets`), or one argument list. "flush" uses the first set and
    TVM's ``time_evaluator``: a ``flush_bytes`` device copy and a synchronize before each launch.
    ``give_up_ms``: see :func:`time_launches` ("rotate" only)."""
    if arg_sets and not isinstance(arg_sets[0], (list, tuple)):
        arg_sets = [arg_sets]
    if method == "rotate":
        return time_launches(mod[fname], arg_sets, dev, budget_ms, give_up_ms)
    if method != "flush":
        raise ValueError(f"timing method must be one of {METHODS}, got {method!r}")
    args = arg_sets[0]
    probe = mod.time_evaluator(fname, dev, number=1, repeat=3, cache_flush_bytes=flush_bytes)
    t0 = time.perf_counter()
    probe(*args)  # warm-up + 3 timed launches
    per_call = (time.perf_counter() - t0) / 4
    repeat = _repeats(per_call, budget_ms)
    ftimer = mod.time_evaluator(fname, dev, number=1, repeat=repeat, cache_flush_bytes=flush_bytes)
    samples = [s * 1e3 for s in ftimer(*args).results]
    return Timing.of(samples)


def time_torch(fns, budget_ms: float = 100.0, method: str = "rotate", flush_bytes: int = 0) -> Timing:
    """Time torch work exactly like :func:`time_module` times a kernel. ``fns``: one no-argument
    callable, or (for "rotate") one per input copy, e.g. closures over tensors made with
    ``torch.from_dlpack`` from :meth:`Workload.timing_arg_sets`. torch is only imported here."""
    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    if method == "rotate":
        return time_launches(lambda fn: fn(), [[fn] for fn in fns], tvm.cuda(0), budget_ms)
    if method != "flush":
        raise ValueError(f"timing method must be one of {METHODS}, got {method!r}")
    import torch

    flush = torch.empty(max(flush_bytes // 4, 1), dtype=torch.int32, device="cuda") if flush_bytes else None
    fn = fns[0]

    def once() -> float:
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    return _time_one_at_a_time(once, budget_ms)  # the warm-up also covers cuBLAS heuristics


def function_name(mod, func: tirx.PrimFunc) -> str:
    """The name to call in a built module: the PrimFunc's global_symbol, else "main"."""
    names = []
    if func.attrs is not None and "global_symbol" in func.attrs:
        names.append(str(func.attrs["global_symbol"]))
    names.append("main")
    for name in names:
        try:
            if mod.implements_function(name, query_imports=True):
                return name
        except Exception:  # noqa: BLE001 - older API: try to fetch it instead
            try:
                mod.get_function(name)
                return name
            except Exception:  # noqa: BLE001
                continue
    return names[0]
