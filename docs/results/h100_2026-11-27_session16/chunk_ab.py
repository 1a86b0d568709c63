"""At the power limit (bench_energy's stretches): the same wgmma tile with its MN-major B loaded
in one 3-D box a stage (chunked) and in one 2-D box a 64-column chunk (per_chunk), and cuBLAS."""
import json, sys
sys.path.insert(0, "benchmarks")
import numpy as np, tvm, torch
import bench_energy as be
from bench_gemm_hopper import matmul_func, torch_operands
from bench_setup import torch_fp32_accumulation
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.schedules import wgmma_tma
from fastdlight.tune.compile import build
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch
torch_fp32_accumulation()
arch = auto_arch()
nvml = be.Nvml(); clock = be.ClockSampler(nvml)
chunked_plain = wgmma_tma._plain
def per_chunk(k_major, rows, bk, dims, eb, split):
    return wgmma_tma.Operand(k_major, rows, bk, dims, eb, split)
CASES = [("4096³ NN", (4096, 4096, 4096, "float16", "NN"), be.wgmma(128, 256, 64)),
         ("LLaMA up 2048×11008×4096", (2048, 11008, 4096, "float16", "NN"), be.wgmma(192, 192, 64, group=8)),
         ("LLaMA o 2048×4096×4096", (2048, 4096, 4096, "float16", "NN"), be.wgmma(256, 128, 128, group=8))]
rows = []
for name, (m, n, k, dtype, layout), config in CASES:
    func = matmul_func(m, n, k, dtype, layout)
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    fns = [lambda a=a, b=b: torch.matmul(a, b) for a, b in (torch_operands(args, layout) for args in arg_sets)]
    sides = {}
    for tag, plain in (("chunked", chunked_plain), ("per_chunk", per_chunk)):
        wgmma_tma._plain = plain
        with arch.target:
            kernel = apply_config(func, config).with_attr("global_symbol", f"kernel_{tag}")
        mod = build(tvm.IRModule({"main": kernel}), arch.target)
        launch = mod[function_name(mod, kernel)]
        wl.run_outputs(launch)
        sides[tag] = lambda ms, launch=launch: time_launches(launch, arg_sets, wl.dev, ms).median_ms
    wgmma_tma._plain = chunked_plain
    sides["cuBLAS"] = lambda ms: time_torch(fns, ms).median_ms
    names = list(sides)
    runs = {s: [] for s in names}
    for order in (names, names[::-1], names, names[::-1]):
        for s in order:
            runs[s].append(be.stretch(sides[s], 1.5, nvml, clock))
    row = {"case": name, "config": repr(config), "sides": {s: {key: float(np.mean([r[key] for r in v])) for key in v[0]} for s, v in runs.items()},
           "turns": {s: [r["ms"] for r in v] for s, v in runs.items()}}
    rows.append(row)
    base = row["sides"]["cuBLAS"]
    for s, r in row["sides"].items():
        print(f"{name:26s} {s:10s} {r['ms']:.4f} ms {r['mhz']:.0f} MHz {r['w']:.0f} W {r['mj_per_gemm']:.1f} mJ  time vs cuBLAS {base['ms'] / r['ms']:.3f}  energy {r['mj_per_gemm'] / base['mj_per_gemm']:.3f}  turns {['%.4f' % t for t in row['turns'][s]]}", flush=True)
clock.stop()
import os
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "chunk_ab.json"), "w"), indent=1)
