"""One launch at a time of 4096³ NN and NT in the same 128x256 tile (group 16), and cuBLAS's, for ncu."""
import sys
sys.path.insert(0, "benchmarks")
import tvm, torch
import bench_energy as bench
from bench_gemm_hopper import matmul_func, torch_operands
from bench_setup import torch_fp32_accumulation
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.tune.compile import build
from fastdlight.tune.measure import Workload, function_name
torch_fp32_accumulation()
arch = auto_arch()
runs = []
for lay in ("NN", "NT"):
    func = matmul_func(4096, 4096, 4096, "float16", lay)
    wl = Workload(func, tvm.cuda(0), seed=0)
    with arch.target:
        kf = apply_config(func, bench.wgmma(128, 256, 64)).with_attr("global_symbol", f"fdl_{lay}")
    mod = build(tvm.IRModule({"main": kf}), arch.target)
    ta, tb = torch_operands(wl.args, lay)
    runs.append((mod[function_name(mod, kf)], wl.args, ta, tb))
for _ in range(3):
    for launch, args, ta, tb in runs:
        launch(*args)
        torch.matmul(ta, tb)
torch.cuda.synchronize()
print("done")
