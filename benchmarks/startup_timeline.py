"""Where a fresh process's first tune spends its time: a timeline of the tuning stages (worker
set-up, builds, probes, timings, reference, verification) and a stack sampler of this process's
threads, for four GEMM tunes in a row (the first pays the start-up).

    python benchmarks/startup_timeline.py      # writes $OUT/startup.json, prints a summary
    python benchmarks/startup_timeline.py --softmax   # a 4096x32000 softmax, twice

A diagnostic: it wraps internal functions of ``fastdlight.tune`` by name (a rename there shows
as a "not traced" line and a missing row, not a failure).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the imports below are part of what a fresh process pays

import collections  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gemm_hopper import matmul_func  # noqa: E402
from fastdlight import ops  # noqa: E402
from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.search import candidates, reference, runner, stages
from fastdlight.measure import clock, workload
from fastdlight.compiler import workers  # noqa: E402
from fastdlight.search.options import TuneOptions  # noqa: E402

IMPORT_S = time.perf_counter() - T0
#: (case, the function): the first pays the start-up, the third repeats it warm
GEMM_CASES = [("4096 NT", lambda: matmul_func(4096, 4096, 4096, "float16", "NT")),
              ("4096 NN", lambda: matmul_func(4096, 4096, 4096, "float16", "NN")),
              ("4096 NT again", lambda: matmul_func(4096, 4096, 4096, "float16", "NT")),
              ("1024 NT", lambda: matmul_func(1024, 1024, 1024, "float16", "NT"))]
#: ``--softmax``: a vocabulary-wide fp16 softmax (memory-bound, one float64 reference run)
SOFTMAX_CASES = [("softmax 4096x32000", lambda: ops.softmax(4096, 32000).func),
                 ("softmax 4096x32000 again", lambda: ops.softmax(4096, 32000).func)]
CASES = SOFTMAX_CASES if "--softmax" in sys.argv[1:] else GEMM_CASES
TRACED = [(candidates, "prewarm"), (candidates, "candidate_sets"), (candidates, "stock_configs"),
          (candidates, "apply_and_build"), (workers.WorkerPool, "_run_one"), (workers.WorkerPool, "_setup"),
          (stages.Prober, "run"), (stages.Timer, "_time"), (stages.Timer, "retime_fastest"), (stages, "load_module"),
          (workload.WorkloadMaker, "get"), (reference.ReferenceRun, "expected"), (reference.ReferenceRun, "_compute"),
          (runner, "verify_and_pick"),
          (runner, "plan")]
SAMPLE_S = 0.02


class Trace:
    """Events ``(case, function, thread, start s, seconds)`` of the wrapped functions, and stack
    samples of every other thread, counted per case."""

    def __init__(self):
        self.case = "import"
        self.events: list[tuple] = []
        self.samples: collections.Counter = collections.Counter()

    def wrap(self, owner, name: str) -> None:
        fn = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}"

        def traced(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.events.append((self.case, label, threading.current_thread().name, round(t - T0, 3),
                                    round(time.perf_counter() - t, 3)))

        static = isinstance(vars(owner).get(name) if isinstance(owner, type) else None, staticmethod)
        setattr(owner, name, staticmethod(traced) if static else traced)

    def sample_forever(self) -> None:
        me = threading.get_ident()
        while True:
            time.sleep(SAMPLE_S)
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack = traceback.extract_stack(frame)[-7:]
                key = " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in reversed(stack))
                self.samples[(self.case, "main" if names.get(tid) == "MainThread" else "other", key)] += 1

    def top_samples(self, n: int = 25) -> dict[str, list]:
        top = collections.defaultdict(list)
        for (case, who, key), count in self.samples.most_common():
            if len(top[f"{case}|{who}"]) < n:
                top[f"{case}|{who}"].append((count, key))
        return dict(top)


def tune_case(trace: Trace, arch, name, make_func) -> dict:
    trace.case = name
    func = make_func()
    before, t = clock.snapshot(), time.perf_counter()
    tuned = candidates.tune_function(func, arch, 20, TuneOptions(progress=False))
    return {"case": name, "start": round(t - T0, 3), "wall": round(time.perf_counter() - t, 2),
            "clock": clock.since(before), "best": repr(tuned.best.config), "ms": tuned.best.latency_ms,
            "n": len(tuned.results), "build_s": sorted(round(r.build_seconds or 0, 2) for r in tuned.results)}


def summary(trace: Trace, case: str) -> list[str]:
    lines = [f"== {case}"]
    lines += [f"   {e}" for e in trace.events if e[0] == case and e[1] != "WorkerPool._run_one"]
    runs = [e for e in trace.events if e[0] == case and e[1] == "WorkerPool._run_one"]
    lines.append(f"   builds: {len(runs)}, first done at {min((e[3] + e[4] for e in runs), default=None)} s")
    for who in ("main", "other"):
        lines.append(f"  samples, {who} thread(s)")
        lines += [f"     {count} {key[:300]}" for count, key in trace.top_samples().get(f"{case}|{who}", [])[:12]]
    return lines


def main() -> int:
    trace = Trace()
    for owner, name in TRACED:
        try:
            trace.wrap(owner, name)
        except AttributeError:
            print(f"not traced: {owner}.{name}")
    threading.Thread(target=trace.sample_forever, daemon=True).start()
    arch = auto_arch(None)
    rows = []
    for case in CASES:
        rows.append(tune_case(trace, arch, *case))
        print(json.dumps(rows[-1]), flush=True)
    report = {"import_s": IMPORT_S, "arch": str(arch), "cases": rows, "events": trace.events,
              "samples": trace.top_samples()}
    with open(os.path.join(os.environ.get("OUT", "."), "startup.json"), "w") as f:
        json.dump(report, f, indent=1)
    for case in [c[0] for c in CASES[:2]]:
        print("\n".join(summary(trace, case)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
