"""Descriptor low word stepped in 32 bits (desc), plus a warp-uniform warpgroup id (descwg),
against the old per-k-step encode (old): outputs, SASS, energy and time at the power limit."""
import os, sys
sys.path.insert(0, "benchmarks")
import numpy as np, tvm, torch
import bench_energy as bench
from bench_gemm_hopper import matmul_func, torch_operands
from bench_setup import torch_fp32_accumulation
import fastdlight.schedules.matmul_wgmma as mw
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.tune.compile import build, compile_cubin, cuda_source
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch

OUT = os.environ["OUT"]
SECONDS = float(os.environ.get("SECONDS", "3"))
torch_fp32_accumulation()
arch = auto_arch()
nvml = bench.Nvml()
clock = bench.ClockSampler(nvml)
TEXTS = {"old": open(".diag/old_kernel.tvmscript").read(), "new": mw.KERNEL_SOURCE.read_text()}
TAGS = os.environ.get("TAGS", "old,new").split(",")
w = bench.wgmma
CASES = [((4096, 4096, 4096), [w(128, 256, 64), w(256, 128, 128, 2, "n", 8), w(128, 256, 64, 2, "m", 8), w(128, 256, 64, 2, "m", 16)]),
         ((2048, 11008, 4096), [w(192, 192, 64, group=8)]),
         ((8192, 8192, 8192), [w(128, 256, 64, 2)])]
ONLY = os.environ.get("ONLY")
for (m, n, k), configs in CASES:
    if ONLY and str(m) + "x" + str(n) not in ONLY.split(","):
        continue
    func = matmul_func(m, n, k, "float16", "NN")
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    fns = []
    for i in range(len(arg_sets)):
        a, b = torch_operands(Workload(func, tvm.cuda(0), seed=i), "NN")
        fns.append(lambda a=a, b=b: torch.matmul(a, b))
    sides = {}
    for c in configs:
        outs = {}
        for tag in TAGS:
            mw._kernel_text = (lambda t: (lambda: t))(TEXTS[tag])
            with arch.target:
                kf = apply_config(func, c).with_attr("global_symbol", "kernel")
            mod = build(tvm.IRModule({"main": kf}), arch.target)
            name = f"{m}x{n}_{c.block[0]}x{c.block[1]}_cl{c.cluster}{c.cluster_axis}_g{c.rasterization}_{tag}"
            cub = compile_cubin(cuda_source(mod), arch.target)
            open(f"{OUT}/{name}.cubin", "wb").write(cub.binary)
            print(name, "regs", cub.registers, "spill", cub.spill_bytes, flush=True)
            launch = mod[function_name(mod, kf)]
            outs[tag] = wl.run_outputs(launch)[0]
            sides[name] = lambda ms, launch=launch: time_launches(launch, arg_sets, wl.dev, ms).median_ms
        ref = outs[TAGS[0]]
        print(f"{m}x{n}x{k} {c.block} cl{c.cluster}: identical to {TAGS[0]}:",
              {t: bool(np.array_equal(ref, o)) for t, o in outs.items()}, flush=True)
    sides["cuBLAS"] = lambda ms: time_torch(fns, ms).median_ms
    names = list(sides)
    runs = {s: [] for s in names}
    for order in [names, names[::-1]] * int(os.environ.get("ROUNDS", "1")):
        for s in order:
            runs[s].append(bench.stretch(sides[s], SECONDS, nvml, clock))
    base = {key: np.mean([r[key] for r in runs["cuBLAS"]]) for key in runs["cuBLAS"][0]}
    for s in names:
        r = {key: float(np.mean([x[key] for x in runs[s]])) for key in runs[s][0]}
        print(f"{s}: {r['ms']:.4f} ms {r['mhz']:.0f} MHz {r['w']:.0f} W {r['mj_per_gemm']:.2f} mJ "
              f"time {base['ms'] / r['ms']:.3f} energy {r['mj_per_gemm'] / base['mj_per_gemm']:.3f} "
              f"cycles {r['kcycles_per_gemm'] / base['kcycles_per_gemm']:.3f}", flush=True)
clock.stop()
