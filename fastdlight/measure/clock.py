"""Where a tuning run's time goes: seconds per stage, summed over the threads of this process.

    before = clock.snapshot()
    ApplyFastTuning(...)(mod)
    print(clock.since(before))   # {"build": 412.0, "probe": 20.1, "gpu wait": 35.2, ...}

Stages overlap (builds run in worker processes while this process times; several functions
are tuned at once), so the sums may exceed the wall time: they say which stage to shorten.

    build          worker-seconds of candidate builds, split below for the ones that built:
    build: schedule / lower + compile (NVRTC or nvcc) / export (the library the probe and the timer load)
    build wait     a tuning thread waiting for its next build to finish
    probe          the probe process running a candidate once (GPU turn held)
    time           timing candidates on the GPU (GPU turn held), split below
    time: queued / capture / replays / hot turns
                   queued launches (before a run times from graphs), capturing graphs,
                   replaying the first pass's graphs, the finalists' hot turns (their
                   graphs' captures counted in "time: capture" as well)
    time: estimate / input copies
                   the few queued launches that size a first-pass graph (the first launch
                   of a kernel loads its module onto the GPU), a function's rotated input
                   copies on a GPU (made once)
    load           loading a built library into this process
    gpu wait       waiting for the GPU turn (another function's probe or timing holds it)
    workload       making a function's random inputs on the GPU
    reference      the reference: the naive float64 module run twice (on a thread of its own,
                   from its build on), or a numpy one after the timings
    reference: GPU / verify: GPU / workload: GPU
                   the part of "reference", of the checks and of "workload" spent holding the
                   GPU turn (with "probe" and "time": the serial part of a model's tuning)
    reference wait waiting after the timings for the naive reference's thread
    verify         checking the fastest candidates' outputs
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager

_LOCK = threading.Lock()
_SPENT: Counter = Counter()


def add(stage: str, seconds: float) -> None:
    with _LOCK:
        _SPENT[stage] += seconds


@contextmanager
def stage(name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - t0)


@contextmanager
def holding(lock, name: str):
    """``with lock`` that books the wait as "gpu wait" and the time held as ``name``."""
    t0 = time.perf_counter()
    with lock:
        t1 = time.perf_counter()
        add("gpu wait", t1 - t0)
        try:
            yield
        finally:
            add(name, time.perf_counter() - t1)


def snapshot() -> dict[str, float]:
    with _LOCK:
        return dict(_SPENT)


def since(before: dict[str, float]) -> dict[str, float]:
    """Seconds per stage spent after ``before`` (a :func:`snapshot`), largest first."""
    now = snapshot()
    spent = {k: round(v - before.get(k, 0.0), 3) for k, v in now.items()}
    return dict(sorted(((k, v) for k, v in spent.items() if v > 0), key=lambda kv: -kv[1]))
