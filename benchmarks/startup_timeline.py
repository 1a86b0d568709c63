"""Where a fresh process's first tune spends its time: a timeline of the tuning stages (worker
set-up, builds, probes, timings, reference, verification) and a stack sampler of this process's
threads, for four GEMM tunes in a row (the first pays the start-up).

    python benchmarks/startup_timeline.py      # writes $OUT/startup.json, prints a summary

A diagnostic: it wraps internal functions of ``fastdlight.tune`` by name (a rename there shows
as a "no ..." line and a missing row, not a failure)."""
import collections
import json
import os
import sys
import threading
import time
import traceback

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastdlight  # noqa
from fastdlight.tune import clock, candidates, workers, stages, runner, measure, reference
import tvm  # noqa
from bench_gemm_hopper import matmul_func
T_IMPORT = time.perf_counter() - T0
EVENTS = []
PHASE = ["import"]

def wrap(owner, name, label=None):
    fn = getattr(owner, name)
    label = label or f"{getattr(owner, '__name__', owner)}.{name}"
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            EVENTS.append((PHASE[0], label, threading.current_thread().name, round(t - T0, 3), round(time.perf_counter() - t, 3)))
    setattr(owner, name, w)

for owner, name in [(candidates, "prewarm"), (candidates, "candidate_sets"), (candidates, "stock_configs"),
                    (candidates, "apply_and_build"), (workers.WorkerPool, "_run_one"), (workers.WorkerPool, "_setup"),
                    (stages.Prober, "run"), (stages.Timer, "_time"), (stages.Timer, "retime_fastest"),
                    (stages, "load_module"), (measure.Workload, "get"), (reference.ReferenceRun, "expected"),
                    (runner, "verify_and_pick"), (runner, "plan")]:
    try:
        wrap(owner, name)
    except AttributeError as e:
        print("no", owner, name, e)

SAMPLES = collections.Counter()
def sampler():
    me = threading.get_ident()
    names = {}
    while True:
        time.sleep(0.02)
        for t in threading.enumerate():
            names[t.ident] = t.name
        for tid, fr in sys._current_frames().items():
            if tid == me:
                continue
            st = traceback.extract_stack(fr)
            key = " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in reversed(st[-7:]))
            nm = names.get(tid, "?")
            SAMPLES[(PHASE[0], "main" if nm == "MainThread" else "other", key)] += 1
threading.Thread(target=sampler, daemon=True).start()

from fastdlight.arch import auto_arch
from fastdlight.tune.options import TuneOptions
arch = auto_arch(None)
out = os.environ.get("OUT", "/tmp")
res = {"import_s": T_IMPORT, "arch": str(arch), "cases": []}
cases = [("4096 NT", 4096, 4096, 4096, "NT"), ("4096 NN", 4096, 4096, 4096, "NN"), ("4096 NT again", 4096, 4096, 4096, "NT"),
         ("1024 NT", 1024, 1024, 1024, "NT")]
for name, m, n, k, lay in cases:
    PHASE[0] = name
    func = matmul_func(m, n, k, "float16", lay)
    before = clock.snapshot()
    t = time.perf_counter()
    tuned = candidates.tune_function(func, arch, 20, TuneOptions(progress=False))
    wall = time.perf_counter() - t
    row = {"case": name, "start": round(t - T0, 3), "wall": round(wall, 2), "clock": clock.since(before),
           "best": repr(tuned.best.config), "ms": tuned.best.latency_ms, "n": len(tuned.results),
           "build_s": sorted(round(r.build_seconds or 0, 2) for r in tuned.results)}
    print(json.dumps(row), flush=True)
    res["cases"].append(row)
res["events"] = EVENTS
top = collections.defaultdict(list)
for (ph, who, key), c in SAMPLES.most_common():
    if len(top[(ph, who)]) < 25:
        top[(ph, who)].append((c, key))
res["samples"] = {f"{ph}|{who}": v for (ph, who), v in top.items()}
json.dump(res, open(os.path.join(out, "startup.json"), "w"), indent=1)
# short report
for ph in ["4096 NT", "4096 NN"]:
    print("==", ph)
    for e in EVENTS:
        if e[0] == ph and e[1] not in ("WorkerPool._run_one",):
            print("  ", e)
    runs = [e for e in EVENTS if e[0] == ph and e[1] == "WorkerPool._run_one"]
    print("   run_one: n", len(runs), "first end", min((e[3] + e[4] for e in runs), default=None),
          "durations", sorted(e[4] for e in runs))
    for who in ("main", "other"):
        print("  samples", who)
        for c, key in top[(ph, who)][:12]:
            print("    ", c, key[:300])
