"""Compile every candidate of several ops through NVRTC with the full and the light traits; the
machine code must be the same."""
import struct, sys, time
from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.tune import nvrtc, compile as comp
from fastdlight.tune.candidates import *  # noqa
import fastdlight

def text_sections(cubin):
    d = cubin
    shoff = struct.unpack_from('<Q', d, 0x28)[0]; shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    hdrs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i*shentsize) for i in range(shnum)]
    stro = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        n = d[stro+h[0]:d.index(b'\0', stro+h[0])].decode()
        if n.startswith('.text'): out[n] = d[h[4]:h[4]+h[5]]
    return out

sources = []
real = nvrtc.compile_source
def capture(source, arch):
    sources.append((source, arch))
    return real(source, arch)
nvrtc.compile_source = capture
import tvm
from fastdlight.tune.candidates import candidate_sets, stock_configs
from fastdlight.tune.build_task import apply_template, as_module, init_worker
from fastdlight.tune.compile import build, cuda_source
from fastdlight.schedules import intrinsics
arch = CUDA("nvidia/nvidia-h100")
cases = [ops.matmul(4096, 4096, 4096, "float16", layout="NT", acc_dtype="float32"),
         ops.matmul(1000, 3000, 5120, "bfloat16", layout="NN", acc_dtype="float32"),
         ops.matmul(2048, 2048, 2048, "int8"), ops.matmul(512, 512, 512, "float32"),
         ops.matmul_gated(2048, 11008, 4096), ops.conv2d_nhwc_ohwi(16, 56, 56, 64, 64),
         ops.gemv(4096, 4096), ops.softmax(4096, 4096), ops.elementwise((4096, 4096)),
         ops.reduce((4096, 4096)), ops.transpose((2048, 4096), (1, 0))]
import tvm.s_tir.tensor_intrin.cuda  # noqa
srcs = []
for op in cases:
    func = op.func
    n = 0
    for cset in candidate_sets(func, arch, 6, stock_configs(func, arch)):
        for c in cset.configs[:6]:
            try:
                with arch.target:
                    mod = as_module(apply_template(cset.func, c))
                src = cuda_source(build(mod, arch.target))
            except Exception as e:
                print("skip", c, type(e).__name__, str(e)[:80]); continue
            srcs.append((str(c)[:60], src)); n += 1
    print(op.func.attrs["global_symbol"] if op.func.attrs and "global_symbol" in op.func.attrs else "", n, flush=True)
full_prepare = lambda s: nvrtc.PREFIX.replace(nvrtc.LIGHT_TRAITS, nvrtc.FULL_TRAITS + "\n") + nvrtc._DEVICE_DEFINITIONS + "\n".join(
    l for l in s.splitlines() if l.strip() != "#include <cuda.h>")
light_prepare = nvrtc.prepare
bad = 0; tf = tl = 0
for name, src in srcs:
    arch_s = "sm_90a"
    res = []
    for prep in (full_prepare, light_prepare):
        nvrtc.prepare = prep; t = time.time()
        try:
            res.append(text_sections(real(src, arch_s)[0]))
        except nvrtc.NvrtcError as e:
            res.append("rejected")
        if prep is full_prepare: tf += time.time() - t
        else: tl += time.time() - t
    a, b = res
    if a == "rejected": print("both rejected" if b == a else "ONLY FULL REJECTED", name)
    same = a == b
    bad += not same
    print("SAME" if same else "DIFF", name)
print(f"{len(srcs)} sources, {bad} differ; full {tf:.1f} s, light {tl:.1f} s")
