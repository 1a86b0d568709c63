"""fp32 CUDA-core matmul: fastdlight's "matmul" template vs cuBLAS (torch, TF32 off).

For each size (default 4096³ and 1024³) a sweep of hand configs and template variants, plus
DefaultPolicy's top configs when the policy module exists, is built in parallel worker
processes, checked against a float64 product, and timed the same way as cuBLAS and as
apply_and_build times candidates (inputs rotated through copies so none is in L2, launches
queued between CUDA events, median over >= 100 ms).

    python benchmarks/bench_matmul_fp32.py [--sizes 4096 1024] [--log out.txt] [--dry-run]

``--dry-run`` only schedules and compiles (no GPU needed).

Measured 2026-11-22 on an NVIDIA H200 (no H100 was free), cuBLAS timed in the same run, with
the earlier method (L2 flushed by a 256 MB memset, one synchronized launch per sample):
  4096³: cuBLAS 51.2 TFLOPS (50.5 on a second timing); best 47.3 TFLOPS = 0.92x with
         block 128x128 or 64x128, thread 8x8, rstep 16, 2 stages staged through registers
         (no cp.async); cp.async 2-stage 45.1; no double buffering 39.6; DefaultPolicy top-4
         (32x64 / 4x4) 28-30.
  1024³: cuBLAS 33.6 TFLOPS; best 34.4 TFLOPS = 1.02x with block 64x64, thread 8x4, rstep 16,
         2 stages cp.async (128x64 / 8x4 async2: 0.98x); DefaultPolicy top-4 25-27.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGET = "nvidia/nvidia-h100"  # sm_90a code runs on H100 and H200
MIN_TIME_S = 0.1


def mm(block, thread, rstep, stages=1, async_copy=False, raster=0, c_vec=0):
    vec = {"A": 4, "B": 4, **({"C": c_vec} if c_vec else {})}
    return dict(
        kind="matmul", block=block, thread=thread, rstep=rstep, vectorize=vec,
        pipeline_stages=stages, use_async_copy=async_copy, rasterization=raster,
    )  # fmt: skip


#: (label, config dict, template options) per size class
BIG = [
    ("128x128/8x8 r8", mm((128, 128), (8, 8), (8,)), {}),
    ("128x128/8x8 r8 staged", mm((128, 128), (8, 8), (8,), 2), {}),
    ("128x128/8x8 r8 staged no-pad", mm((128, 128), (8, 8), (8,), 2), {"pad_shared": False}),
    ("128x128/8x8 r16 staged", mm((128, 128), (8, 8), (16,), 2), {}),
    ("128x128/8x8 r16 staged no-pad", mm((128, 128), (8, 8), (16,), 2), {"pad_shared": False}),
    ("128x128/8x8 r16 staged raster8", mm((128, 128), (8, 8), (16,), 2, raster=8), {}),
    ("128x128/8x8 r16 staged raster16", mm((128, 128), (8, 8), (16,), 2, raster=16), {}),
    ("128x128/8x8 r16 staged no-pad raster8", mm((128, 128), (8, 8), (16,), 2, raster=8), {"pad_shared": False}),
    ("128x128/8x8 r32 staged", mm((128, 128), (8, 8), (32,), 2), {}),
    ("128x128/8x8 r32 staged no-pad", mm((128, 128), (8, 8), (32,), 2), {"pad_shared": False}),
    ("128x128/8x8 r16 async2", mm((128, 128), (8, 8), (16,), 2, True), {}),
    ("128x128/8x8 r16 async2 raster8", mm((128, 128), (8, 8), (16,), 2, True, raster=8), {}),
    ("128x128/8x8 r16 async3", mm((128, 128), (8, 8), (16,), 3, True), {}),
    ("128x128/8x8 r8 staged no-chunks", mm((128, 128), (8, 8), (8,), 2), {"strided_chunks": False}),
    ("128x64/8x8 r16 staged", mm((128, 64), (8, 8), (16,), 2), {}),
    ("128x64/8x8 r16 staged raster8", mm((128, 64), (8, 8), (16,), 2, raster=8), {}),
    ("64x128/8x8 r16 staged", mm((64, 128), (8, 8), (16,), 2), {}),
    ("64x64/4x8 r16 staged", mm((64, 64), (4, 8), (16,), 2), {}),
]
SMALL = [
    ("128x64/8x8 r16 staged", mm((128, 64), (8, 8), (16,), 2), {}),
    ("64x128/4x8 r16 staged", mm((64, 128), (4, 8), (16,), 2), {}),
    ("128x64/8x4 r16 async2", mm((128, 64), (8, 4), (16,), 2, True), {}),
    ("64x64/4x4 r16 staged", mm((64, 64), (4, 4), (16,), 2), {}),
    ("64x64/4x4 r16 staged no-pad", mm((64, 64), (4, 4), (16,), 2), {"pad_shared": False}),
    ("64x64/4x8 r8 staged", mm((64, 64), (4, 8), (8,), 2), {}),
    ("64x64/4x8 r16 staged", mm((64, 64), (4, 8), (16,), 2), {}),
    ("64x64/4x8 r32 staged", mm((64, 64), (4, 8), (32,), 2), {}),
    ("64x64/4x8 r8 async2", mm((64, 64), (4, 8), (8,), 2, True), {}),
    ("64x64/4x8 r16 async2", mm((64, 64), (4, 8), (16,), 2, True), {}),
    ("64x64/4x8 r16 async2 no-pad", mm((64, 64), (4, 8), (16,), 2, True), {"pad_shared": False}),
    ("64x64/4x8 r32 async2", mm((64, 64), (4, 8), (32,), 2, True), {}),
    ("64x64/4x8 r16 async3", mm((64, 64), (4, 8), (16,), 3, True), {}),
    ("64x64/8x4 r16 async2", mm((64, 64), (8, 4), (16,), 2, True), {}),
    ("32x128/4x8 r16 async2", mm((32, 128), (4, 8), (16,), 2, True), {}),
    ("64x64/4x4 r32 async2", mm((64, 64), (4, 4), (32,), 2, True), {}),
    ("64x64/8x4 r16 staged", mm((64, 64), (8, 4), (16,), 2), {}),
    ("64x64/8x4 r8 async2", mm((64, 64), (8, 4), (8,), 2, True), {}),
    ("64x64/8x8 r16 staged", mm((64, 64), (8, 8), (16,), 2), {}),
    ("64x64/8x8 r16 async2", mm((64, 64), (8, 8), (16,), 2, True), {}),
    ("128x32/8x4 r16 async2", mm((128, 32), (8, 4), (16,), 2, True), {}),
    ("32x128/4x8 r16 staged", mm((32, 128), (4, 8), (16,), 2), {}),
    ("128x64/8x8 r16 async2", mm((128, 64), (8, 8), (16,), 2, True), {}),
    ("64x128/8x8 r16 staged", mm((64, 128), (8, 8), (16,), 2), {}),
    ("128x128/8x8 r16 staged", mm((128, 128), (8, 8), (16,), 2), {}),
    # the policy also vectorizes the C store (vec C:4): the same tiles with it
    ("64x64/8x4 r16 async2 C4", mm((64, 64), (8, 4), (16,), 2, True, c_vec=4), {}),
    ("64x64/4x8 r16 async2 C4", mm((64, 64), (4, 8), (16,), 2, True, c_vec=4), {}),
    ("32x128/8x4 r16 async2", mm((32, 128), (8, 4), (16,), 2, True), {}),
    ("32x128/8x4 r16 async2 C4", mm((32, 128), (8, 4), (16,), 2, True, c_vec=4), {}),
    ("128x64/8x4 r16 async2 C4", mm((128, 64), (8, 4), (16,), 2, True, c_vec=4), {}),
]


def policy_configs(n: int, topk: int) -> list:
    try:
        from fastdlight import ops
        from fastdlight.arch import CUDA
        from fastdlight.policies.default import DefaultPolicy
    except ImportError:
        return []
    try:
        configs = DefaultPolicy(ops.matmul(n, n, n, "float32").func, CUDA(TARGET)).emit_config(topk)
    except Exception as e:  # noqa: BLE001 - the policy is optional here
        print(f"DefaultPolicy failed: {e!r}")
        return []
    return [(f"policy#{i} {c!r}", c.to_dict(), {}) for i, c in enumerate(configs)]


def build_one(job):
    """Worker: schedule + build one config, export it; returns (label, path | None, error)."""
    n, label, cfg, opts, out_dir = job
    try:
        from fastdlight import ops
        from fastdlight.config import Config
        from fastdlight.schedules.matmul import MatmulTemplate
        from fastdlight.compiler.compile import build

        op = ops.matmul(n, n, n, "float32")
        sch = MatmulTemplate(**opts).apply_config(op.func, Config.from_dict(dict(cfg)))
        if sch is None:
            return label, None, "template returned None"
        ex = build(sch.mod, TARGET)
        path = os.path.join(out_dir, f"k{abs(hash((n, label))) % 10**12}.so")
        ex.export_library(path)
        return label, path, None
    except Exception as e:  # noqa: BLE001 - report, keep the sweep going
        return label, None, f"{type(e).__name__}: {str(e)[-300:]}"


def time_cuda(launch, arg_sets) -> float:
    """Median seconds per launch, timed like apply_and_build times candidates
    (:func:`fastdlight.measure.timing.time_launches`: inputs rotated through copies so none is
    in L2, launches queued between CUDA events, >= 100 ms)."""
    import tvm

    from fastdlight.measure.timing import time_launches

    return time_launches(launch, arg_sets, tvm.cuda(0), MIN_TIME_S * 1e3).median_ms * 1e-3


def bench_size(n, entries, pool, log, dry_run):
    out_dir = tempfile.mkdtemp(prefix=f"bench_mm{n}_")
    t0 = time.time()
    built = list(pool.map(build_one, [(n, lab, cfg, opts, out_dir) for lab, cfg, opts in entries]))
    log(f"\n== fp32 matmul {n}^3: built {sum(p is not None for _, p, _ in built)}/{len(built)} in {time.time() - t0:.0f} s")
    if dry_run:
        for label, path, err in built:
            log(f"  {label:48s} {'ok' if path else 'FAILED ' + err}")
        return
    import numpy as np
    import torch
    import tvm

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = tvm.cuda(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand(n, n, device="cuda", generator=gen) * 2 - 1
    b = torch.rand(n, n, device="cuda", generator=gen) * 2 - 1
    ref = (a.double() @ b.double()).cpu().numpy()
    flops = 2.0 * n**3

    from fastdlight.arch import CUDA
    from fastdlight.measure.timing import rotation_copies

    copies = rotation_copies(2 * a.numel() * 4, CUDA.from_device(dev).l2_bytes)
    pairs = [(a, b)] + [(a.clone(), b.clone()) for _ in range(copies - 1)]
    c = torch.empty(n, n, device="cuda")
    cublas = time_cuda(lambda x, y: torch.matmul(x, y, out=c), pairs)
    cublas_tflops = flops / cublas / 1e12
    log(f"  {'cuBLAS (torch.matmul, tf32 off)':48s} {cublas * 1e3:8.3f} ms {cublas_tflops:7.2f} TFLOPS  1.000")

    tvm_pairs = [(tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y)) for x, y in pairs]
    A, B = tvm_pairs[0]
    rows = []
    for label, path, err in built:
        if path is None:
            log(f"  {label:48s} BUILD FAILED {err}")
            continue
        try:
            f = tvm.runtime.load_module(path)["matmul"]
            C = tvm.runtime.tensor(np.full((n, n), np.nan, "float32"), dev)
            f(A, B, C)
            dev.sync()
            out = C.numpy().astype(np.float64)
            rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref)) if np.all(np.isfinite(out)) else float("inf")
            sec = time_cuda(lambda x, y: f(x, y, C), tvm_pairs)
        except Exception as e:  # noqa: BLE001
            log(f"  {label:48s} RUN FAILED {type(e).__name__}: {str(e)[-200:]}")
            continue
        tflops = flops / sec / 1e12
        ok = "" if rel <= 1e-5 else f"  WRONG (rel err {rel:.2g})"
        rows.append((tflops, label))
        log(f"  {label:48s} {sec * 1e3:8.3f} ms {tflops:7.2f} TFLOPS  {tflops / cublas_tflops:5.3f}{ok}")
    again = time_cuda(lambda x, y: torch.matmul(x, y, out=c), pairs)
    log(f"  {'cuBLAS again (run-to-run spread)':48s} {again * 1e3:8.3f} ms {flops / again / 1e12:7.2f} TFLOPS")
    if rows:
        best = max(rows)
        log(f"  BEST {best[1]}: {best[0]:.2f} TFLOPS = {best[0] / cublas_tflops:.3f} x cuBLAS ({cublas_tflops:.2f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 1024])
    parser.add_argument("--policy-topk", type=int, default=4)
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 2))
    parser.add_argument("--log", default=None)
    parser.add_argument("--dry-run", action="store_true", help="schedule and compile only")
    args = parser.parse_args()
    logf = open(args.log, "w") if args.log else None

    def log(msg):
        print(msg, flush=True)
        if logf:
            logf.write(msg + "\n")
            logf.flush()

    if not args.dry_run:
        import torch

        log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        for n in args.sizes:
            entries = (BIG if n >= 2048 else SMALL) + policy_configs(n, args.policy_topk)
            try:
                bench_size(n, entries, pool, log, args.dry_run)
            except Exception:  # noqa: BLE001 - keep the other sizes
                log(traceback.format_exc())


if __name__ == "__main__":
    main()
