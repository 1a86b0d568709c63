"""First pass, finalists and pick of 8192^3 tunes (bf16 NN, fp16 NT), two each: is the
best-estimated tile retimed?"""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
from bench_gemm_hopper import matmul_func
from fastdlight.arch import auto_arch
from fastdlight.tune import stages
from fastdlight.tune.candidates import tune_function
from fastdlight.tune.options import TuneOptions

_orig = stages.Timer.retime_fastest
SEEN = {}


def retime(self, results):
    fin = {r.index for r in stages._finalists(results)}
    SEEN["first"] = sorted(((str(r.config), r.latency_ms, r.predicted_cost, r.index in fin) for r in results
                            if r.latency_ms is not None), key=lambda t: t[1])
    return _orig(self, results)


stages.Timer.retime_fastest = retime
arch = auto_arch()
rows = []
for dtype, layout in (("bfloat16", "NN"), ("float16", "NT")):
    func = matmul_func(8192, 8192, 8192, dtype, layout)
    for rep in range(2):
        t0 = time.perf_counter()
        tuned = tune_function(func, arch, 20, TuneOptions.of(None, check="winner"))
        print(f"== {dtype} {layout} rep {rep}: {time.perf_counter() - t0:.1f} s, best {tuned.best.config}", flush=True)
        fastest = SEEN["first"][0][1]
        for cfg, ms, cost, fin in SEEN["first"][:10]:
            print(f"   first {ms:.4f} ({ms / fastest - 1:+.1%}) est {cost * 1e3:.4f} {'FINALIST' if fin else '        '} {cfg}", flush=True)
        hot = sorted((r for r in tuned.results if r.timing is not None and r.timing.hot), key=lambda r: r.latency_ms)
        for r in hot:
            print(f"   hot {r.latency_ms:.4f} est {r.predicted_cost * 1e3:.4f} {r.config}", flush=True)
        rows.append({"case": f"{dtype} {layout}", "rep": rep, "best": str(tuned.best.config), "first": SEEN["first"],
                     "hot": [(str(r.config), r.latency_ms) for r in hot]})
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "finalist_probe.json"), "w"), indent=1)
