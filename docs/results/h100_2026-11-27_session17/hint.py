"""TMA L2 cache hints (evict_first / evict_last) on A, B loads and D stores, and a no-DRAM
variant (every CTA loads tile (0, 0)), patched into the generated CUDA source: energy a GEMM at
the power limit (bench_energy's stretches) against cuBLAS. `--ncu`: one launch of each instead."""
import argparse, json, os, re, sys, time
sys.path.insert(0, "benchmarks")
import numpy as np
import tvm, tvm_ffi
import tvm.support.nvcc  # noqa: F401
import bench_energy as be
from bench_gemm_hopper import matmul_func, torch_matmuls, torch_operands
from bench_setup import torch_fp32_accumulation
from fastdlight.arch import auto_arch
from fastdlight.schedules import apply_config
from fastdlight.tune.compile import build, compile_cubin
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch

POL = {"last": "0x14F0000000000000ull", "first": "0x12F0000000000000ull", "normal": "0x1000000000000000ull"}
LOAD = "tvm_builtin_ptx_cp_async_bulk_tensor_g2s_cluster_async_bulk_tensor_2d_shared__cluster_global_mbarrier__complete_tx__bytes"
STORE = "tvm_builtin_ptx_cp_async_bulk_tensor_s2g_async_bulk_tensor_2d_global_shared__cta_tile_bulk_group"
HELPERS = r'''
__forceinline__ __device__ void fdl_load_hint(uint32_t d, const void* m, int32_t c0, int32_t c1, uint32_t b, uint64_t p) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" :: "r"(d), "l"(m), "r"(c0), "r"(c1), "r"(b), "l"(p) : "memory");
}
__forceinline__ __device__ void fdl_store_hint(const void* m, int32_t c0, int32_t c1, uint32_t s, uint64_t p) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group.L2::cache_hint [%0, {%1, %2}], [%3], %4;" :: "l"(m), "r"(c0), "r"(c1), "r"(s), "l"(p) : "memory");
}
'''
PATCH = [None]
SERP = [False]
from fastdlight.schedules import matmul_wgmma as mw
from tvm import tirx
_coords = mw.Plan.coords


def serp_coords(self, tile):
    """odd groups of group_m rows walk their columns right to left"""
    b, m, n = _coords(self, tile)
    if not SERP[0] or self.group_m <= 1:
        return b, m, n
    per_batch = self.cluster_grid_m * self.cluster_grid_n
    t = tile % per_batch
    g = t // (self.group_m * self.cluster_grid_n)
    return b, m, tirx.if_then_else(g % 2 == 1, self.cluster_grid_n - 1 - n, n)


mw.Plan.coords = serp_coords


def patch(code, a=None, b=None, d=None, same=False, krev=False):
    lines = code.split("\n")
    out, added, ks = [], False, None
    for ln in lines:
        m = re.search(r"for \(int k_k = 0; k_k < (\d+);", ln)
        if m:
            ks = int(m.group(1))
        if not added and ln.startswith("__forceinline__") and LOAD + "(" in ln:
            out.append(HELPERS)
            added = True
        call = ln.strip().startswith(LOAD + "(")
        if call and same:
            ln = ln.replace("k_coord_ptr[1]", "0").replace("k_coord_ptr[2]", "0")
        if call and krev:
            assert "(k_k * 64)" in ln and ks, ln
            ln = ln.replace("(k_k * 64)", f"(((k_it & 1) ? ({ks - 1} - k_k) : k_k) * 64)")
        if call:
            hint = a if "&(A_map)" in ln else b if "&(B_map)" in ln else None
            if hint:
                ln = ln.replace(LOAD + "(", "fdl_load_hint(").rstrip()
                assert ln.endswith(");"), ln
                ln = ln[:-2] + f", {POL[hint]});"
        if d and ln.strip().startswith(STORE + "("):
            ln = ln.replace(STORE + "(", "fdl_store_hint(").rstrip()[:-2] + f", {POL[d]});"
        out.append(ln)
    assert added
    return "\n".join(out)


def callback(code, *_):
    target = tvm.target.Target.current()
    if PATCH[0] is not None:
        code = patch(code, **PATCH[0])
    return bytearray(compile_cubin(code, target).binary)


tvm_ffi.register_global_func("tvm_callback_cuda_compile", callback, override=True)

G16 = be.wgmma(128, 256, 64)
G8 = be.wgmma(128, 256, 64, group=8)
G32 = be.wgmma(128, 256, 64, group=32)
CASES2 = {
    "4096": ((4096, 4096, 4096, "float16", "NN"), [
        ("g16", G16, None), ("g16 krev", G16, dict(krev=True)), ("g16 krev B first", G16, dict(krev=True, b="first")),
        ("g16 krev serp", G16, dict(krev=True, serp=True)), ("g16 serp", G16, dict(serp=True)),
        ("g8 krev", G8, dict(krev=True)), ("g32 krev", G32, dict(krev=True))]),
    "8192": ((8192, 8192, 8192, "float16", "NN"), [
        ("g16", G16, None), ("g16 krev", G16, dict(krev=True)), ("g16 krev B first", G16, dict(krev=True, b="first")),
        ("g16 krev serp", G16, dict(krev=True, serp=True)), ("g32 krev", G32, dict(krev=True)),
        ("g8 krev", G8, dict(krev=True))]),
}
CASES = {
    "4096": ((4096, 4096, 4096, "float16", "NN"), [
        ("g16", G16, None), ("g16 A last", G16, dict(a="last")), ("g16 B last", G16, dict(b="last")),
        ("g16 A last B first", G16, dict(a="last", b="first")), ("g16 A first B last", G16, dict(a="first", b="last")),
        ("g16 D first", G16, dict(d="first")), ("g16 same tile", G16, dict(same=True)), ("g8", G8, None)]),
    "8192": ((8192, 8192, 8192, "float16", "NN"), [
        ("g16", G16, None), ("g16 A last", G16, dict(a="last")), ("g16 B last", G16, dict(b="last")),
        ("g16 A last B first", G16, dict(a="last", b="first")), ("g16 same tile", G16, dict(same=True))]),
}


def kernels(arch, func, variants):
    out = []
    for i, (name, cfg, p) in enumerate(variants):
        p = dict(p or {})
        SERP[0] = p.pop("serp", False)
        PATCH[0] = p or None
        with arch.target:
            kf = apply_config(func, cfg).with_attr("global_symbol", f"fdl_v{i}")
        mod = build(tvm.IRModule({"main": kf}), arch.target)
        out.append((name, mod[function_name(mod, kf)]))
    PATCH[0] = None
    SERP[0] = False
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--set2", action="store_true")
    ap.add_argument("--only", nargs="*", default=list(CASES))
    args = ap.parse_args()
    torch_fp32_accumulation()
    import torch
    arch = auto_arch()
    out = os.environ.get("OUT", ".")
    rows = []
    for key in args.only:
        shape, variants = (CASES2 if args.set2 else CASES)[key]
        m, n, k, dtype, layout = shape
        func = matmul_func(m, n, k, dtype, layout)
        wl = Workload(func, tvm.cuda(0), seed=0)
        ks = kernels(arch, func, variants)
        if args.ncu:
            ta, tb = torch_operands(wl.args, layout)
            for name, launch in ks:
                launch(*wl.args)
            torch.matmul(ta, tb)
            torch.cuda.synchronize()
            print(key, [name for name, _ in ks], flush=True)
            continue
        ref = None
        for name, launch in ks:
            o = wl.run_outputs(launch)[0]
            if ref is None:
                ref = o
            same = "same tile" in name
            print(key, name, "bit-identical" if np.array_equal(o, ref) else ("(no-DRAM variant)" if same else "DIFFERS"), flush=True)
        arg_sets = wl.timing_arg_sets(arch.l2_bytes)
        sides = {name: (lambda ms, l=launch: time_launches(l, arg_sets, wl.dev, ms).median_ms) for name, launch in ks}
        sides["cuBLAS"] = lambda ms, f=torch_matmuls(arg_sets, layout): time_torch(f, ms).median_ms
        nv = be.Nvml(); clock = be.ClockSampler(nv)
        names = list(sides)
        runs = {s: [] for s in names}
        for order in (names, names[::-1]):
            for s in order:
                runs[s].append(be.stretch(sides[s], args.seconds, nv, clock))
        clock.stop()
        cub = {kk: float(np.mean([r[kk] for r in runs["cuBLAS"]])) for kk in runs["cuBLAS"][0]}
        for s in names:
            avg = {kk: float(np.mean([r[kk] for r in runs[s]])) for kk in runs[s][0]}
            rows.append({"case": key, "side": s, **avg, "turn_ms": [r["ms"] for r in runs[s]],
                         "time_vs_cublas": cub["ms"] / avg["ms"], "energy_vs_cublas": avg["mj_per_gemm"] / cub["mj_per_gemm"]})
            r = rows[-1]
            print(f"{key} {s:22s} {r['ms']:.4f} ms {r['mhz']:.0f} MHz {r['w']:.0f} W {r['mj_per_gemm']:.1f} mJ "
                  f"time {r['time_vs_cublas']:.3f} energy {r['energy_vs_cublas']:.3f} turns {['%.4f' % t for t in r['turn_ms']]}", flush=True)
    if rows:
        json.dump(rows, open(os.path.join(out, "hint.json"), "w"), indent=1)


main()
