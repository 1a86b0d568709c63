"""Quick probe of the GPU machine: TVM runtime APIs fastdlight relies on (run once per fresh machine)."""
import os, time, shutil, sys, tempfile
import numpy as np
import tvm

if not tvm.cuda(0).exist:
    sys.exit("error: probe_device needs a CUDA GPU")
from tvm.s_tir import dlight as dl
from fastdlight import ops
from fastdlight.compiler.compile import build

print("gcc:", shutil.which("gcc"), "nvcc:", shutil.which("nvcc"), "cpus:", os.cpu_count())
dev = tvm.cuda(0)
print("exist", dev.exist, dev.device_name, dev.compute_version, dev.multi_processor_count,
      dev.max_shared_memory_per_block, dev.l2_cache_size_bytes, dev.warp_size)
print("Target.from_device:", tvm.target.Target.from_device(dev))
op = ops.matmul(1024, 1024, 1024, "float32")
target = tvm.target.Target("nvidia/nvidia-h100")
mod = tvm.IRModule({"main": op.func})
with target:
    mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.Fallback())(mod)
t = time.time(); ex = build(mod, target); print("build s", time.time() - t, type(ex))
print("ex attrs", [a for a in dir(ex) if not a.startswith("_")])
a = np.random.randn(1024, 1024).astype("float32"); b = np.random.randn(1024, 1024).astype("float32")
mk = getattr(tvm.runtime, "tensor", None) or tvm.nd.array
A, B, C = mk(a, dev), mk(b, dev), mk(np.full((1024, 1024), np.nan, "float32"), dev)
rt = ex.mod if hasattr(ex, "mod") else ex
f = rt["matmul"] if "matmul" in str(rt.get_function) or True else None
f(A, B, C); dev.sync()
ref = op.reference(a, b); out = C.numpy()
print("relerr", np.linalg.norm(out - ref) / np.linalg.norm(ref))
te = rt.time_evaluator("matmul", dev, number=10, repeat=5, min_repeat_ms=50, cache_flush_bytes=256 << 20)
r = te(A, B, C); print("time_evaluator median ms", np.median(r.results) * 1e3, "TFLOPS", op.flops / np.median(r.results) / 1e12)
d = tempfile.mkdtemp(); p = os.path.join(d, "k.so")
try:
    ex.export_library(p); m2 = tvm.runtime.load_module(p); print("export/load ok", m2)
    m2["matmul"](A, B, C); dev.sync(); print("reloaded run ok")
except Exception as e:
    print("export failed:", repr(e)[:500])
import torch
print("torch", torch.__version__, torch.cuda.get_device_name())
x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(3): y = x @ x
torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True)
s.record(); [x @ x for _ in range(20)]; e.record(); torch.cuda.synchronize()
print("cublas fp16 4096 TFLOPS", 2 * 4096**3 * 20 / (s.elapsed_time(e) * 1e-3) / 1e12)
