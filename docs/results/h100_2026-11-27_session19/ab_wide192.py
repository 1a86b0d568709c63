"""The tuner's two finalists on the LLaMA shapes, 256x128 (two 64-row slices a consumer) and
128x256, with the tuner's rasterization groups, against cuBLAS: power-limit turns, graphs, hot
timings; outputs checked."""
import argparse, json, os, sys
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".diag/r19")
import numpy as np
import tvm
import bench_energy as be
from bench_gemm_hopper import matmul_func, torch_matmuls, torch_operands
from bench_setup import torch_fp32_accumulation
from fastdlight.arch import auto_arch
from fastdlight.policies.wgmma import WgmmaPolicy
from fastdlight.policies.config import Config
from fastdlight.schedules import apply_config
from fastdlight.tune.compile import build
from fastdlight.tune.graph_timing import time_graph, time_torch_graph
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch


def cfg(bm, bn, wm, stages, group=16):
    return Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(64,), pipeline_stages=stages,
                  use_async_copy=True, rasterization=group)


SHAPES = [tuple(int(x) for x in t.split(",")) for t in os.environ.get("AB_SHAPES", "128,256,64,1 256,192,128,1 256,192,128,2").split()]
EST = {"4096NN": 0.21, "4096NT": 0.21, "down4096": 0.55, "o2048": 0.11, "8192NN": 1.65, "up2048": 0.29,
       "qkv2048": 0.31, "down2048": 0.27, "up4096": 0.58, "8192NT": 1.65, "odd3000": 0.062, "oddK": 0.062, "8192bfNN": 1.6}
CASES = {"4096NN": (4096, 4096, 4096, "float16", "NN"), "o2048": (2048, 4096, 4096, "float16", "NN"), "4096NT": (4096, 4096, 4096, "float16", "NT"),
         "down4096": (4096, 4096, 11008, "float16", "NN"), "8192NN": (8192, 8192, 8192, "float16", "NN"),
         "up2048": (2048, 11008, 4096, "float16", "NN"), "qkv2048": (2048, 12288, 4096, "float16", "NN"),
         "down2048": (2048, 4096, 11008, "float16", "NN"), "up4096": (4096, 11008, 4096, "float16", "NN"), "8192NT": (8192, 8192, 8192, "float16", "NT"), "odd3000": (3000, 5120, 1000, "float16", "NT"), "oddK": (3072, 5120, 1000, "float16", "NT"), "8192bfNN": (8192, 8192, 8192, "bfloat16", "NN")}


def kernels(arch, func, key):
    """The policy's own configs of both shapes (its stages and groups)."""
    out = []
    for c in WgmmaPolicy(func, arch).emit_config(40):
        if (c.block[0], c.block[1], c.warp[0], c.cluster) not in SHAPES:
            continue
        name = f"{c.block[0]}x{c.block[1]} c{c.cluster} s{c.pipeline_stages} g{c.rasterization}"
        with arch.target:
            kf = apply_config(func, c).with_attr("global_symbol", f"fdl_{key}_{name.replace(' ', '_')}")
        mod = build(tvm.IRModule({"main": kf}), arch.target)
        out.append((name, mod[function_name(mod, kf)]))
    return out


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
        m, n, k, dtype, layout = CASES[key]
        func = matmul_func(m, n, k, dtype, layout)
        wl = Workload(func, tvm.cuda(0), seed=0)
        ks = kernels(arch, func, key)
        ta, tb = torch_operands(wl.args, layout)
        ref = torch.matmul(ta.float(), tb.float()).cpu().numpy()
        for name, launch in ks:
            o = wl.run_outputs(launch)[0].astype(np.float32)
            err = float(np.max(np.abs(o - ref)) / (np.max(np.abs(ref)) + 1e-9))
            print(key, name, f"max rel err vs fp32 torch {err:.2e}", "OK" if err < 1e-2 else "BAD", flush=True) if err >= 1e-2 else None
        arg_sets = wl.timing_arg_sets(arch.l2_bytes)
        tm = torch_matmuls(arg_sets, layout)
        sides = {name: (lambda ms, l=launch: time_launches(l, arg_sets, wl.dev, ms).median_ms) for name, launch in ks}
        sides["cuBLAS"] = lambda ms, f=tm: time_torch(f, ms).median_ms
        graphs = {name: (lambda l=launch: time_graph(l, arg_sets, wl.dev, 100.0, EST[key]).median_ms) for name, launch in ks}
        graphs["cuBLAS"] = lambda f=tm: time_torch_graph(f, 100.0, EST[key]).median_ms
        nv = be.Nvml(); clock = be.ClockSampler(nv)
        names = list(sides)
        runs, hot, gr = ({s: [] for s in names} for _ in range(3))
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
            print(f"{key} {s:16s} {r['ms']:.4f} ms {r['mhz']:.0f} MHz {r['w']:.0f} W {r['mj_per_gemm']:.1f} mJ "
                  f"kcyc {r['kcycles_per_gemm']:.1f} time {r['time_vs_cublas']:.3f} energy {r['energy_vs_cublas']:.3f} "
                  f"graph {r['graph_vs_cublas']:.3f} hot {r['hot_vs_cublas']:.3f} turns ms {['%.4f' % t for t in r['turn_ms']]}", flush=True)
    if rows:
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "ab_wide192.json"), "w"), indent=1)


main()
