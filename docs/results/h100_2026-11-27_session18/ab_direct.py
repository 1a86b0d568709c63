"""DIRECT_STORE off against on, same tiles, in one process: queued launches at the power
limit in turns with cuBLAS (bench_energy's stretches, energy from NVML), CUDA graphs, short hot
timings (as the tuner's); outputs checked against fp32 torch."""
import argparse, json, os, sys
sys.path.insert(0, "benchmarks")
import numpy as np
import tvm
import bench_energy as be
from bench_gemm_hopper import matmul_func, torch_matmuls, torch_operands
from bench_setup import torch_fp32_accumulation
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.schedules import matmul_wgmma as mw
from fastdlight.tune.compile import build
from fastdlight.tune.graph_timing import time_graph, time_torch_graph
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch

W = be.wgmma
EST = {"4096NN": 0.21, "4096NT": 0.21, "down4096": 0.55, "o2048": 0.11, "8192NN": 1.65}
CASES = {
    "4096NN": ((4096, 4096, 4096, "float16", "NN"), [("128x256 g16", W(128, 256, 64))]),
    "4096NT": ((4096, 4096, 4096, "float16", "NT"), [("128x256 g16", W(128, 256, 64))]),
    "down4096": ((4096, 4096, 11008, "float16", "NN"), [("128x256 g16", W(128, 256, 64))]),
    "o2048": ((2048, 4096, 4096, "float16", "NN"), [("256x128 g16", W(256, 128, 128))]),
    "8192NN": ((8192, 8192, 8192, "float16", "NN"), [("128x256 g16", W(128, 256, 64))]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--only", nargs="*", default=list(CASES))
    args = ap.parse_args()
    torch_fp32_accumulation()
    import torch
    arch = auto_arch()
    rows = []
    for key in args.only:
        shape, tiles = CASES[key]
        m, n, k, dtype, layout = shape
        func = matmul_func(m, n, k, dtype, layout)
        wl = Workload(func, tvm.cuda(0), seed=0)
        ks = []
        for i, (tname, cfg) in enumerate(tiles):
            for pdl in (False, True):
                mw.DIRECT_STORE = pdl
                with arch.target:
                    kf = apply_config(func, cfg).with_attr("global_symbol", f"fdl_{key}_{i}_{'direct' if pdl else 'tma'}")
                mod = build(tvm.IRModule({"main": kf}), arch.target)
                ks.append((f"{tname} {'direct' if pdl else 'tma'}", mod[function_name(mod, kf)]))
        mw.DIRECT_STORE = True
        ta, tb = torch_operands(wl.args, layout)
        ref = torch.matmul(ta.float(), tb.float()).cpu().numpy()
        for name, launch in ks:
            o = wl.run_outputs(launch)[0].astype(np.float32)
            err = float(np.max(np.abs(o - ref)) / (np.max(np.abs(ref)) + 1e-9))
            print(key, name, f"max rel err vs fp32 torch {err:.2e}", "OK" if err < 1e-2 else "BAD", flush=True)
        arg_sets = wl.timing_arg_sets(arch.l2_bytes)
        tm = torch_matmuls(arg_sets, layout)
        sides = {name: (lambda ms, l=launch: time_launches(l, arg_sets, wl.dev, ms).median_ms) for name, launch in ks}
        sides["cuBLAS"] = lambda ms, f=tm: time_torch(f, ms).median_ms
        graphs = {name: (lambda l=launch, key=key: time_graph(l, arg_sets, wl.dev, 100.0, EST[key]).median_ms) for name, launch in ks}
        graphs["cuBLAS"] = lambda f=tm, key=key: time_torch_graph(f, 100.0, EST[key]).median_ms
        nv = be.Nvml(); clock = be.ClockSampler(nv)
        names = list(sides)
        runs = {s: [] for s in names}
        hot = {s: [] for s in names}
        gr = {s: [] for s in names}
        for t in range(args.turns):
            for s in (names if t % 2 == 0 else names[::-1]):
                runs[s].append(be.stretch(sides[s], args.seconds, nv, clock))
                hot[s].append(sides[s](30.0))
                gr[s].append(graphs[s]())
        clock.stop()
        cub = {kk: float(np.mean([r[kk] for r in runs["cuBLAS"]])) for kk in runs["cuBLAS"][0]}
        for s in names:
            avg = {kk: float(np.mean([r[kk] for r in runs[s]])) for kk in runs[s][0]}
            r = {"case": key, "side": s, **avg, "turn_ms": [x["ms"] for x in runs[s]], "turn_mj": [x["mj_per_gemm"] for x in runs[s]],
                 "time_vs_cublas": cub["ms"] / avg["ms"], "energy_vs_cublas": avg["mj_per_gemm"] / cub["mj_per_gemm"],
                 "hot_ms": hot[s], "graph_ms": gr[s],
                 "graph_vs_cublas": float(np.median(gr["cuBLAS"]) / np.median(gr[s])),
                 "hot_vs_cublas": float(np.median(hot["cuBLAS"]) / np.median(hot[s]))}
            rows.append(r)
            print(f"{key} {s:20s} {r['ms']:.4f} ms {r['mhz']:.0f} MHz {r['w']:.0f} W {r['mj_per_gemm']:.1f} mJ "
                  f"time {r['time_vs_cublas']:.3f} energy {r['energy_vs_cublas']:.3f} graph {r['graph_vs_cublas']:.3f} "
                  f"hot {r['hot_vs_cublas']:.3f} turns ms {['%.4f' % t for t in r['turn_ms']]} graph {['%.4f' % t for t in gr[s]]}", flush=True)
    if rows:
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "ab.json"), "w"), indent=1)


main()
