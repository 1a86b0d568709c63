"""One launch each of old/new 4096³ NN kernels (128x256, 256x128 cl2 n) and cuBLAS, for ncu."""
import sys
sys.path.insert(0, "benchmarks")
import tvm, torch
import bench_energy as bench
from bench_gemm_hopper import matmul_func, torch_operands
from bench_setup import torch_fp32_accumulation
import fastdlight.schedules.matmul_wgmma as mw
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.tune.compile import build
from fastdlight.tune.measure import Workload, function_name
torch_fp32_accumulation()
arch = auto_arch()
func = matmul_func(4096, 4096, 4096, "float16", "NN")
wl = Workload(func, tvm.cuda(0), seed=0)
TEXTS = {"old": open(".diag/old_kernel.tvmscript").read(), "new": mw.KERNEL_SOURCE.read_text()}
launches = []
for c, cn in ((bench.wgmma(128, 256, 64), "t128"), (bench.wgmma(256, 128, 128, 2, "n", 8), "t256n")):
    for tag, text in TEXTS.items():
        mw._kernel_text = (lambda t: (lambda: t))(text)
        with arch.target:
            kf = apply_config(func, c).with_attr("global_symbol", f"fdl_{cn}_{tag}")
        mod = build(tvm.IRModule({"main": kf}), arch.target)
        launches.append(mod[function_name(mod, kf)])
ta, tb = torch_operands(wl, "NN")
for _ in range(3):
    for launch in launches:
        launch(*wl.args)
    torch.matmul(ta, tb)
torch.cuda.synchronize()
