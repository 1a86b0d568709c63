"""BATCHED_EPILOGUE off (old) against on (new), same tiles, in one process: time, clock, power and
energy a GEMM at the power limit in turns with cuBLAS (bench_energy's stretches); `--ncu`: one
launch of each for ncu's DRAM counters; outputs checked against a float64 reference."""
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
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch

CASES = {
    "4096NN": ((4096, 4096, 4096, "float16", "NN"), ["128x256", "256x128"]),
    "4096NT": ((4096, 4096, 4096, "float16", "NT"), ["128x256"]),
    "8192NT": ((8192, 8192, 8192, "float16", "NT"), ["128x192", "128x256+2m"]),
    "down4096": ((4096, 4096, 11008, "float16", "NN"), ["128x256"]),
    "up": ((2048, 11008, 4096, "float16", "NN"), ["192x192"]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
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
        for i, tname in enumerate(tiles):
            cfg = be.tile_config(tname, func, arch)
            for j, snake in enumerate((False, True)):
                mw.BATCHED_EPILOGUE = snake
                with arch.target:
                    kf = apply_config(func, cfg).with_attr("global_symbol", f"fdl_{key}_{i}_{'new' if snake else 'old'}")
                mod = build(tvm.IRModule({"main": kf}), arch.target)
                ks.append((f"{tname} {'new' if snake else 'old'}", mod[function_name(mod, kf)]))
        mw.BATCHED_EPILOGUE = True
        ta, tb = torch_operands(wl.args, layout)
        if args.ncu:
            for _, launch in ks:
                launch(*wl.args)
            torch.matmul(ta, tb)
            torch.cuda.synchronize()
            continue
        ref = torch.matmul(ta.double() if False else ta.float(), tb.float()).cpu().numpy()
        for name, launch in ks:
            o = wl.run_outputs(launch)[0].astype(np.float32)
            err = float(np.max(np.abs(o - ref)) / (np.max(np.abs(ref)) + 1e-9))
            print(key, name, f"max rel err vs fp32 torch {err:.2e}", "OK" if err < 1e-2 else "BAD", flush=True)
        arg_sets = wl.timing_arg_sets(arch.l2_bytes)
        sides = {name: (lambda ms, l=launch: time_launches(l, arg_sets, wl.dev, ms).median_ms) for name, launch in ks}
        sides["cuBLAS"] = lambda ms, f=torch_matmuls(arg_sets, layout): time_torch(f, ms).median_ms
        nv = be.Nvml(); clock = be.ClockSampler(nv)
        names = list(sides)
        runs = {s: [] for s in names}
        for t in range(args.turns):
            for s in (names if t % 2 == 0 else names[::-1]):
                runs[s].append(be.stretch(sides[s], args.seconds, nv, clock))
        clock.stop()
        cub = {kk: float(np.mean([r[kk] for r in runs["cuBLAS"]])) for kk in runs["cuBLAS"][0]}
        for s in names:
            avg = {kk: float(np.mean([r[kk] for r in runs[s]])) for kk in runs[s][0]}
            r = {"case": key, "side": s, **avg, "turn_ms": [x["ms"] for x in runs[s]], "turn_mj": [x["mj_per_gemm"] for x in runs[s]],
                 "time_vs_cublas": cub["ms"] / avg["ms"], "energy_vs_cublas": avg["mj_per_gemm"] / cub["mj_per_gemm"]}
            rows.append(r)
            print(f"{key} {s:20s} {r['ms']:.4f} ms {r['mhz']:.0f} MHz {r['w']:.0f} W {r['mj_per_gemm']:.1f} mJ "
                  f"time {r['time_vs_cublas']:.3f} energy {r['energy_vs_cublas']:.3f} turns ms {['%.4f' % t for t in r['turn_ms']]}"
                  f" mJ {['%.1f' % t for t in r['turn_mj']]}", flush=True)
    if rows:
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "ab.json"), "w"), indent=1)


main()
