"""Does the tuner pick the tile that runs fastest on a hot GPU?

Tunes a GEMM (top 20, as ``fastdlight.tune`` does), then times the seven fastest candidates
the way a model runs them: each alone for 2 s, then for 100 ms (inputs rotated out of L2),
beside torch's matmul timed the same way. A case ``SHAPE:OWN_HEAT_MS:ROUNDS:TRUTH`` sets the
retime's own heat per finalist (``stages.OWN_HEAT_MS``, applied to every finalist) and its
rounds; TRUTH 0 skips the 2 s timings and lists the finalists' retimed times only.

    python benchmarks/bench_pick.py up:0:3:1 up:100:3:0 down:100:3:1 llama_up:0:3:1

Writes ``$OUT/bench_pick.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402

import fastdlight  # noqa: E402
from bench_gemm_hopper import matmul_func  # noqa: E402
from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.search import stages  # noqa: E402
from fastdlight.measure.timing import function_name, time_launches, time_torch
from fastdlight.measure.workload import Workload  # noqa: E402

SHAPES = {"up": (2048, 11008, 4096), "down": (2048, 4096, 11008), "llama_up": (512, 5632, 2048),
          "o": (2048, 4096, 4096), "sq4096": (4096, 4096, 4096)}
HEAT_MS, BUDGET_MS, SHOWN = 2000.0, 100.0, 7


def hot_ms(run) -> float:
    """``run(budget_ms)`` -> median ms, after ``HEAT_MS`` of the same."""
    run(HEAT_MS)
    return run(BUDGET_MS)


def case(spec: str, arch) -> dict:
    shape, own, rounds, truth = spec.split(":")
    m, n, k = SHAPES[shape]
    stages.OWN_HEAT_MS, stages.OWN_HEAT_MIN_MS = float(own), 0.0 if float(own) > 0 else float("inf")
    stages.RETIME_ROUNDS = int(rounds)
    func = matmul_func(m, n, k, "float16", "NN")
    t0 = time.perf_counter()
    results, best = fastdlight.tune(func, arch, topk=20, progress=False)
    row = {"case": spec, "tune_s": round(time.perf_counter() - t0, 1), "best": repr(best.config), "candidates": []}
    timed = sorted((r for r in results if r.latency_ms is not None), key=lambda r: r.speed_key)
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    for r in timed[:SHOWN] if truth == "1" else [r for r in timed if r.timing.hot]:
        c = {"config": repr(r.config), "tuned_ms": round(r.latency_ms, 4), "retimed": r.timing.hot}
        if truth == "1":
            launch = r.module[function_name(r.module, func)]
            c["hot_ms"] = round(hot_ms(lambda b, f=launch: time_launches(f, arg_sets, wl.dev, b).median_ms), 4)
        row["candidates"].append(c)
        print(spec, c, flush=True)
    if truth == "1":
        import torch

        pairs = [(torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(k, n, device="cuda", dtype=torch.float16))
                 for _ in arg_sets]
        fns = [lambda a=a, b=b: torch.matmul(a, b) for a, b in pairs]
        row["torch_hot_ms"] = round(hot_ms(lambda b: time_torch(fns, b).median_ms), 4)
    print(spec, "picked", row["best"], "torch hot", row.get("torch_hot_ms"), "tune s", row["tune_s"], flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help=f"SHAPE:OWN_HEAT_MS:ROUNDS:TRUTH, SHAPE one of {sorted(SHAPES)}")
    args = parser.parse_args(argv)
    bad = [c for c in args.cases if len(c.split(":")) != 4 or c.split(":")[0] not in SHAPES]
    if bad:
        print(f"bench_pick: bad case(s) {bad}: SHAPE:OWN_HEAT_MS:ROUNDS:TRUTH, SHAPE one of {sorted(SHAPES)}")
        return 2
    if not fastdlight.has_gpu():
        print("bench_pick: needs a CUDA GPU")
        return 2
    arch, rows = auto_arch(), []
    for spec in args.cases:
        rows.append(case(spec, arch))
        with open(os.path.join(os.environ.get("OUT", "."), "bench_pick.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
