"""One launch at a time of 4096³ NN in 128x256, 128x256 with a 2-CTA cluster along M, 256x128
with one along N, and cuBLAS's, for ncu: does the multicast lower our L2 traffic?"""
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
func = matmul_func(4096, 4096, 4096, "float16", "NN")
wl = Workload(func, tvm.cuda(0), seed=0)
launches = []
for tag, c in (("plain", bench.wgmma(128, 256, 64)), ("cl_m", bench.wgmma(128, 256, 64, 2, "m", 8)),
               ("cl_n", bench.wgmma(256, 128, 128, 2, "n", 8))):
    with arch.target:
        kf = apply_config(func, c).with_attr("global_symbol", f"fdl_{tag}")
    mod = build(tvm.IRModule({"main": kf}), arch.target)
    launches.append(mod[function_name(mod, kf)])
ta, tb = torch_operands(wl.args, "NN")
for _ in range(2):
    for launch in launches:
        launch(*wl.args)
    torch.matmul(ta, tb)
torch.cuda.synchronize()
print("done")
