"""Where a wgmma kernel's cycles go: the generated CUDA source patched so that consumer thread
128 of every CTA records clock64 at each tile's start, its first full stage, the end of its main
loop, and globaltimer at kernel entry and exit, for two consecutive launches (printf at exit)."""
import argparse, re, sys
sys.path.insert(0, "benchmarks")
import numpy as np
import tvm, tvm_ffi
import tvm.support.nvcc  # noqa: F401
from bench_gemm_hopper import matmul_func
import bench_energy as be
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.schedules import matmul_wgmma as mw
from fastdlight.tune.compile import build, compile_cubin
from fastdlight.tune.measure import Workload, function_name, time_launches

LAUNCH = 100  # the first traced launch (of each kernel: its own counter)
ON = [False]


def patch(code):
    loops = [m for m in re.finditer(r"for \(int (k_i(?:_\d+)?) = 0; \1 < (\d+); \+\+\1\) \{", code)]
    assert len(loops) == 1, len(loops)
    ti, ntiles = loops[0].group(1), int(loops[0].group(2))
    kloops = list(re.finditer(r"for \(int (k_k\w*) = 0; \1 < (\d+); \+\+\1\) \{", code))
    kv = kloops[1].group(1)  # the consumer's main loop
    n = 1 + 5 * ntiles
    out, state = [], 0
    lines = code.split("\n")
    for i, ln in enumerate(lines):
        if state == 0 and ln.startswith('extern "C" __global__') and ln.rstrip().endswith(";"):
            out.append("__device__ unsigned int fdl_launch = 0;")
            out.append(ln); state = 1; continue
        out.append(ln)
        s = ln.strip()
        if state == 1 and s.startswith("int k_tid = "):
            out.append(f"  unsigned long long fdl_t[{n}]; bool fdl_me = false; int fdl_l = 0; unsigned long long fdl_g0 = 0;")
            out.append(f"  if (threadIdx.x == 128) {{ unsigned c = atomicAdd(&fdl_launch, 1u); fdl_l = c / gridDim.x; fdl_me = (fdl_l == {LAUNCH} || fdl_l == {LAUNCH + 1}); }}")
            out.append('  if (fdl_me) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(fdl_g0)); fdl_t[0] = clock64(); }')
            state = 2
        elif state == 2 and s == loops[0].group(0):
            out.append(f"      if (fdl_me) fdl_t[1 + {ti} * 5] = clock64();"); state = 3
        elif state == 3 and s.startswith("tvm_builtin_cuda_mbarrier_wait(") and f"({kv} & " in s:
            out.append(f"          if (fdl_me && {kv} == 0) {{ fdl_t[2 + {ti} * 5] = clock64(); fdl_t[4 + {ti} * 5] = k_coord_ptr[1]; fdl_t[5 + {ti} * 5] = k_coord_ptr[2]; }}"); state = 4
        elif state == 4 and s == "tvm_builtin_ptx_wgmma_wait_group_wait_group_sync_aligned_0();":
            out.append(f"        if (fdl_me) fdl_t[3 + {ti} * 5] = clock64();"); state = 5
        elif state == 5 and s == "tvm_builtin_ptx_cp_async_bulk_wait_group_async_bulk_wait_group_0();":
            state = 6
        elif state == 6 and s == "}":
            out.append('    if (fdl_me) { unsigned long long g1, e = clock64(); unsigned sm; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1)); '
                       'asm volatile("mov.u32 %0, %%smid;" : "=r"(sm)); '
                       'printf("FDL %d %d %u %llu %llu %llu %llu\\n", fdl_l, (int)blockIdx.x, sm, fdl_g0, g1, e, fdl_t[0]); '
                       f'for (int q = 0; q < {ntiles}; ++q) printf("FDT %d %d %d %llu %llu %llu %lld %lld\\n", fdl_l, (int)blockIdx.x, q, '
                       'fdl_t[1 + q * 5], fdl_t[2 + q * 5], fdl_t[3 + q * 5], (long long)fdl_t[4 + q * 5], (long long)fdl_t[5 + q * 5]); }')
            state = 7
    assert state == 7, state
    return "\n".join(out)


NOWAIT = [False]


def callback(code, *_):
    target = tvm.target.Target.current()
    if ON[0]:
        code = patch(code)
    if NOWAIT[0]:
        code = code.replace("tvm_builtin_ptx_cp_async_bulk_wait_group_async_bulk_wait_group_read_1();", "")
    return bytearray(compile_cubin(code, target).binary)


tvm_ffi.register_global_func("tvm_callback_cuda_compile", callback, override=True)
W = be.wgmma
S, N, D = dict(snake=True), dict(snake=False), dict(snake=True, direct=True)
def C(bm, bn, wm, stages, group=16):
    from fastdlight.policies.config import Config
    return Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(64,), pipeline_stages=stages, use_async_copy=True, rasterization=group)


CASES = {
    "order": ((4096, 4096, 4096, "float16", "NN"), [("128x256 g16", W(128, 256, 64), S), ("256x128 g16 old", W(256, 128, 128), dict(snake=True, k_outer=False)),
                                                 ("256x128 g16 new", W(256, 128, 128), dict(snake=True, k_outer=True))]),
    "nowait": ((4096, 4096, 4096, "float16", "NN"), [("128x256 g16", W(128, 256, 64), S), ("128x256 g16 nowait", W(128, 256, 64), dict(snake=True, nowait=True)),
                                                  ("128x256 g16 nowait again", W(128, 256, 64), dict(snake=True, nowait=True))]),
    "stage": ((4096, 4096, 4096, "float16", "NN"), [("128x256 s4 b2", C(128, 256, 64, 4), S), ("128x256 s3 b4", C(128, 256, 64, 3), dict(snake=True, staging=4))]),
    "direct": ((4096, 4096, 4096, "float16", "NN"), [("128x256 g16 tma", W(128, 256, 64), S), ("128x256 g16 direct", W(128, 256, 64), D),
                                                  ("256x128 g16 direct", W(256, 128, 128), D)]),
    "4096NN": ((4096, 4096, 4096, "float16", "NN"), [
        ("128x256 g16 snake", W(128, 256, 64), S), ("128x256 g16 plain", W(128, 256, 64), N),
        ("128x256 g8 snake", W(128, 256, 64, group=8), S), ("128x256 g32 snake", W(128, 256, 64, group=32), S),
        ("128x256 cl2 g8 snake", W(128, 256, 64, 2, group=8), S), ("256x128 g16 snake", W(256, 128, 128), S)]),
    "4096NT": ((4096, 4096, 4096, "float16", "NT"), [("128x256 g16 snake", W(128, 256, 64), S)]),
    "down4096": ((4096, 4096, 11008, "float16", "NN"), [
        ("128x256 g16 snake", W(128, 256, 64), S), ("128x256 g16 plain", W(128, 256, 64), N)]),
    "8192NN": ((8192, 8192, 8192, "float16", "NN"), [("128x256 g16 snake", W(128, 256, 64), S)]),
}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(CASES))
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()
    arch = auto_arch()
    for key in args.only:
        shape, tiles = CASES[key]
        m, n, k, dtype, layout = shape
        func = matmul_func(m, n, k, dtype, layout)
        for i, (tname, cfg, knobs) in enumerate(tiles):
            mw.SNAKE_ORDER = knobs["snake"]
            from fastdlight.policies import wgmma as pw
            pw.MAX_STAGING = knobs.get("staging", 2)
            NOWAIT[0] = knobs.get("nowait", False)
            mw.K_OUTER = knobs.get("k_outer", True)
            ON[0] = True
            with arch.target:
                kf = apply_config(func, cfg).with_attr("global_symbol", f"fdl_{key}_{i}")
            if args.dump:
                from fastdlight.tune.compile import cuda_source
                open(args.dump, "w").write(patch(cuda_source(build(tvm.IRModule({"main": kf}), arch.target))))
                sys.exit(0)
            mod = build(tvm.IRModule({"main": kf}), arch.target)
            ON[0] = False
            NOWAIT[0] = False
            mw.SNAKE_ORDER = True
            launch = mod[function_name(mod, kf)]
            wl = Workload(func, tvm.cuda(0), seed=0)
            arg_sets = wl.timing_arg_sets(arch.l2_bytes)
            print(f"CASE {key}|{tname}|{m}|{n}|{k}|{cfg.block[0]}|{cfg.block[1]}", flush=True)
            ms = time_launches(launch, arg_sets, wl.dev, 200.0).median_ms  # includes the traced launches
            wl.dev.sync()
            print(f"MS {ms:.4f}", flush=True)
