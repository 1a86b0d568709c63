"""GB/s of the memory-bound templates vs torch and stock Dlight on the live GPU.

    python benchmarks/bench_memory_bound.py [--out DIR] [--topk 6] [--only add,softmax]

For each target op it schedules DefaultPolicy's top-k configs (if the policy exists) plus a few
hand-written ones, builds them, checks each result against torch (relative norm), and times
every kernel with CUDA events, the L2 flushed (a 256 MB memset) before each run; median of the
repetitions. Bytes are the op's minimal traffic (``Op.bytes``). Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import tvm

try:
    import torch
except ImportError:  # --dry works without torch (CPU machine)
    torch = None

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "schedules"))

from fastdlight import ops  # noqa: E402
from fastdlight.config import Config  # noqa: E402
from fastdlight.schedules import default_schedule, dispatch_config  # noqa: E402
from fastdlight.compiler.compile import build  # noqa: E402
from mb_cases import gemv_acc32  # noqa: E402

REPS = 20
FLUSH = None


def ew(block, thread):
    return Config("elementwise", block=block, thread=thread)


def red(kind, block, thread, rstep, rthread):
    return Config(kind, block=block, thread=thread, rstep=rstep, reduce_thread=rthread)


def gemv_hand():
    return [red("gemv", (8,), (2,), (512,), (32,)), red("gemv", (4,), (1,), (256,), (32,)),
            red("gemv", (16,), (4,), (256,), (32,)), red("gemv", (2,), (1,), (1024,), (64,))]  # fmt: skip


# name -> (op builder, torch implementation, hand configs, target GB/s)
BENCH = {
    "add": (lambda: ops.elementwise((16384, 16384), op="add"), lambda a, b: torch.add(a, b),
            [ew((1, 2048), (1, 8)), ew((1, 4096), (1, 16)), ew((2, 1024), (1, 8)), ew((1, 1024), (1, 8))], 2500),
    "row_sum": (lambda: ops.reduce((16384, 1024)), lambda a: a.sum(1),
                [red("reduction", (4,), (1,), (1024,), (128,)), red("reduction", (8,), (1,), (256,), (32,)),
                 red("reduction", (8,), (1,), (1024,), (32,)), red("reduction", (16,), (2,), (512,), (32,))], 2300),
    "softmax": (lambda: ops.softmax(4096, 4096), lambda a: torch.softmax(a, -1),
                [red("general_reduction", (1,), (1,), (4096,), (512,)),
                 red("general_reduction", (1,), (1,), (2048,), (256,)),
                 red("general_reduction", (2,), (1,), (1024,), (128,))], 2000),
    "gemv": (lambda: ops.gemv(16384, 16384), lambda x, w: torch.nn.functional.linear(x, w), gemv_hand(), 2400),
    "gemv_acc32": (lambda: gemv_acc32(16384, 16384), lambda x, w: torch.nn.functional.linear(x, w),
                   gemv_hand(), 2400),
    "copy": (lambda: ops.elementwise((16384, 16384), op="copy"), lambda a: a.clone(),
             [ew((1, 2048), (1, 8)), ew((1, 4096), (1, 16))], 2969),
    "row_sum_64k": (lambda: ops.reduce((65536, 1024)), lambda a: a.sum(1),
                    [red("reduction", (8,), (1,), (256,), (32,)), red("reduction", (8,), (1,), (1024,), (32,)),
                     red("reduction", (16,), (2,), (512,), (32,))], 2300),
    "col_sum": (lambda: ops.reduce((16384, 1024), axis=0), lambda a: a.sum(0),
                [red("reduction", (64,), (8,), (64,), (32,)), red("reduction", (128,), (8,), (32,), (16,))], 0),
}  # fmt: skip


def timed(fn) -> float:
    """Median milliseconds of ``fn()`` over REPS runs, each after flushing L2."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    fn()  # warm-up (module load, clocks)
    for s, e in zip(starts, ends):
        FLUSH.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in zip(starts, ends)]))


def torch_inputs(func):
    out = []
    for p in func.params:
        dtype = getattr(torch, str(p.dtype))
        out.append(torch.rand(tuple(int(d) for d in p.shape), device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype))
    return out[:-1], torch.full(tuple(int(d) for d in func.params[-1].shape), float("nan"), device="cuda",
                                dtype=getattr(torch, str(func.params[-1].dtype)))  # fmt: skip


def rel_err(out, ref) -> float:
    out, ref = out.double().reshape(ref.shape), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def run_tvm(built, name, args):
    fn = built.mod[name]
    targs = [tvm.runtime.from_dlpack(a) for a in args]
    return lambda: fn(*targs)


def bench_op(name, topk, target, arch):
    make, torch_fn, hand, goal = BENCH[name]
    op = make()
    inputs, out = torch_inputs(op.func)
    ref = torch_fn(*inputs)
    torch.cuda.synchronize()
    rows = [{"kernel": "torch", "ms": timed(lambda: torch_fn(*inputs)), "err": 0.0}]
    configs = []
    if arch is not None:
        try:
            from fastdlight.policies.default import DefaultPolicy

            configs += [("policy#%d" % i, c) for i, c in enumerate(DefaultPolicy(op.func, arch).emit_config(topk))]
        except Exception as e:  # noqa: BLE001
            print(f"  [{name}] policy failed: {e}")
    configs += [("hand", c) for c in hand]
    sym = str(op.func.attrs["global_symbol"])
    candidates = [("dlight", None)] + configs
    for label, cfg in candidates:
        t0 = time.time()
        try:
            if cfg is None:
                sch = default_schedule(op.func, target)
                template = "dlight"
            else:
                res = dispatch_config(op.func, cfg)
                sch, template = res.schedule, res.template
            built = build(sch.mod, target)
            call = run_tvm(built, sym, [*inputs, out])
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            ms = timed(call)
            rows.append({"kernel": label, "template": template, "config": repr(cfg) if cfg else "", "ms": ms,
                         "err": err, "build_s": round(time.time() - t0, 2)})  # fmt: skip
        except Exception as e:  # noqa: BLE001
            rows.append({"kernel": label, "config": repr(cfg), "error": f"{type(e).__name__}: {str(e)[-300:]}"})
    for r in rows:
        if "ms" in r:
            r["GBps"] = op.bytes / (r["ms"] * 1e-3) / 1e9
    ours = [r for r in rows if "GBps" in r and r["kernel"] not in ("torch", "dlight") and r["err"] < 2e-2]
    best = max(ours, key=lambda r: r["GBps"], default=None)
    return {"op": name, "bytes": op.bytes, "target_GBps": goal, "rows": rows, "best": best}


def dry_run(args) -> None:
    from fastdlight.arch import CUDA

    target = tvm.target.Target("nvidia/nvidia-h100")
    for name, (make, _, hand, _) in BENCH.items():
        if args.only and name not in args.only.split(","):
            continue
        op = make()
        cfgs = hand
        try:
            from fastdlight.policies.default import DefaultPolicy

            cfgs = DefaultPolicy(op.func, CUDA(target)).emit_config(args.topk) + hand
        except ImportError:
            pass
        for cfg in cfgs:
            res = dispatch_config(op.func, cfg)
            build(res.schedule.mod, target)
            print(f"{name:11s} {res.template:18s} {cfg}")
        build(default_schedule(op.func, target).mod, target)


def check_cases(args) -> None:
    """tests/schedules/test_memory_bound_gpu.py without pytest: every case's configs (policy top-3
    + hand) built, run with a NaN-poisoned output and compared with the float64 reference."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from gpu_util import run_and_check
    from mb_cases import CASES

    from fastdlight.arch import CUDA
    from fastdlight.policies.default import DefaultPolicy

    dev = tvm.cuda(0)
    target = tvm.target.Target.from_device(dev)
    failed = 0
    for case in CASES:
        op = case.make()
        configs = list(dict.fromkeys(DefaultPolicy(op.func, CUDA.from_device(dev)).emit_config(3) + case.configs))
        for cfg in configs:
            try:
                res = dispatch_config(op.func, cfg)
                err = run_and_check(build(res.schedule.mod, target), op)
                print(f"PASS {case.id:24s} {res.template:18s} err={err:.1e} {cfg}")
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAIL {case.id:24s} {cfg}: {type(e).__name__}: {str(e)[-400:]}")
    print(f"check: {failed} failed")


def main():
    global FLUSH
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--dry", action="store_true", help="only schedule + build every candidate (no GPU)")
    ap.add_argument("--check", action="store_true", help="run the GPU correctness cases without pytest")
    args = ap.parse_args()
    if args.dry:
        return dry_run(args)
    if args.check:
        return check_cases(args)
    FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    dev = tvm.cuda(0)
    target = tvm.target.Target.from_device(dev)
    try:
        from fastdlight.arch import CUDA

        arch = CUDA.from_device(dev)
    except Exception:  # noqa: BLE001
        arch = None
    print(f"device: {torch.cuda.get_device_name()}  target: {target}")
    names = [n for n in BENCH if not args.only or n in args.only.split(",")]
    results = []
    for name in names:
        try:
            res = bench_op(name, args.topk, target, arch)
        except Exception:  # noqa: BLE001
            print(f"[{name}] FAILED\n{traceback.format_exc()}")
            continue
        results.append(res)
        print(f"\n== {name}: {res['bytes'] / 1e6:.0f} MB, target {res['target_GBps']} GB/s")
        for r in res["rows"]:
            if "error" in r:
                print(f"  {r['kernel']:10s} ERROR {r['config']}: {r['error'][:200]}")
            else:
                print(f"  {r['kernel']:10s} {r['ms'] * 1e3:9.1f} us {r['GBps']:7.0f} GB/s  err={r['err']:.1e}  "
                      f"{r.get('template', '')} {r.get('config', '')}")  # fmt: skip
        sys.stdout.flush()
    print("\n== summary (best of ours vs torch / dlight / target)")
    for res in results:
        get = {r["kernel"]: r.get("GBps", 0) for r in res["rows"]}
        best = res["best"]
        print(f"  {res['op']:11s} ours {best['GBps'] if best else 0:6.0f}  torch {get.get('torch', 0):6.0f}  "
              f"dlight {get.get('dlight', 0):6.0f}  target {res['target_GBps']}  {best['config'] if best else ''}")  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_memory_bound.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
