"""The tuner's hot retime, turn by turn: 4096^3 NT and NN tuned three times each; every
finalist turn logged (round, position, median ms, seconds since the retime began), then each
finalist timed at the power limit in turns with the others (bench_energy stretches)."""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import numpy as np
import tvm
import bench_energy as be
from bench_gemm_hopper import matmul_func
from fastdlight.arch import auto_arch
from fastdlight.tune import stages
from fastdlight.tune.candidates import tune_function
from fastdlight.tune.options import TuneOptions
from fastdlight.tune.measure import time_launches, function_name

LOG = {"turns": None}
_orig_time, _orig_retime = stages.Timer._time, stages.Timer.retime_fastest


def _time(self, module, budget_ms):
    t = _orig_time(self, module, budget_ms)
    if LOG["turns"] is not None:
        LOG["turns"].append((id(module), budget_ms, t.median_ms, time.perf_counter() - LOG["t0"]))
    return t


def retime(self, results):
    LOG["turns"], LOG["t0"] = [], time.perf_counter()
    out = _orig_retime(self, results)
    names = {id(r.module): str(r.config) for r in results if r.module is not None}
    LOG["last"] = [(names.get(m, "?"), b, ms, s) for m, b, ms, s in LOG["turns"]]
    LOG["turns"] = None
    return out


stages.Timer._time, stages.Timer.retime_fastest = _time, retime
arch = auto_arch()
rows = []
for layout in ("NT", "NN"):
    func = matmul_func(4096, 4096, 4096, "float16", layout)
    for rep in range(3):
        t0 = time.perf_counter()
        tuned = tune_function(func, arch, 20, TuneOptions.of(None, check="winner"))
        print(f"== {layout} rep {rep}: {time.perf_counter() - t0:.1f} s, best {tuned.best.config}", flush=True)
        for name, b, ms, s in LOG["last"]:
            tag = "heat" if b >= 90 else "timed"
            if tag == "timed":
                print(f"   {s:6.3f}s {ms:.4f} ms  {name}", flush=True)
        hot = sorted((r for r in tuned.results if r.timing is not None and r.timing.hot), key=lambda r: r.latency_ms)
        for r in hot:
            print(f"   hot {r.latency_ms:.4f} {r.config}", flush=True)
        rows.append({"layout": layout, "rep": rep, "best": str(tuned.best.config), "turns": LOG["last"],
                     "hot": [(str(r.config), r.latency_ms) for r in hot]})
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "retime_probe.json"), "w"), indent=1)
