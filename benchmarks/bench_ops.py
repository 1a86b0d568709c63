"""Seed operator benchmark: fastdlight (top-1 and best of top-k) vs stock Dlight vs torch.

    python benchmarks/bench_ops.py [--ops matmul,softmax] [--topk 20] [--json OUT]

Every kernel of one operator runs on the same device inputs and is timed the same way
(``--timing rotate``: inputs cycled through copies so none is in L2, launches queued between
CUDA events; ``--timing flush``: L2 flushed and the device synchronized before each launch;
median over a time budget). When any side's kernel runs under GRAPH_BELOW_MS (50 us), every
side is timed again inside CUDA graphs (``fastdlight.measure.graph_timing``): there the host's
launch path, not the kernel, would decide the queued numbers.

Sides: fastdlight's candidates through the shared candidate path; stock Dlight
(``default_schedule``) both at ``sm_90a`` (the ``nvidia/nvidia-h100`` tag, where its Matmul rule
uses no tensor cores) and at ``sm_90`` (where it does); torch (cuBLAS / cuDNN / its own kernels)
with TF32 off and fp16/bf16 reduced-precision reductions off, so every fp16 GEMM accumulates in
fp32 on both sides (ours: fp16 inputs, fp32 accumulator and output). fastdlight's winner is
verified against a float64 reference (torch on the GPU when available, else numpy). Prints a
markdown table and writes JSON (``--json``, default ``$OUT/bench_ops.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from fastdlight import ops  # noqa: E402
from fastdlight.arch import auto_arch, has_gpu  # noqa: E402
from fastdlight.schedules import default_schedule  # noqa: E402
from fastdlight.policies.select import candidate_sets  # noqa: E402
from fastdlight.compiler.compile import build  # noqa: E402
from fastdlight.measure.graph_timing import GRAPH_BELOW_MS, time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import flush_bytes_for, function_name, time_module, time_torch
from fastdlight.measure.workload import Workload  # noqa: E402
from fastdlight.search.options import TuneOptions  # noqa: E402
from fastdlight.search.runner import TuningError, apply_and_build  # noqa: E402

#: stock Dlight's two targets: the H100 tag (sm_90a: no tensor cores in its Matmul rule) and sm_90
DLIGHT_TARGETS = {"dlight_sm90a": {"tag": "nvidia/nvidia-h100"}, "dlight_sm90": {"tag": "nvidia/nvidia-h100",
                                                                                 "arch": "sm_90"}}

E16 = 16384
#: (key, description, builder) — the seed table
SEED = [
    ("copy", "copy fp16 16384x16384", lambda: ops.elementwise((E16, E16), "float16", "copy")),
    ("add", "add fp16 16384x16384", lambda: ops.elementwise((E16, E16), "float16", "add")),
    ("sum", "sum fp16 16384x1024 (last axis)", lambda: ops.reduce((E16, 1024), "float16", "sum")),
    ("max", "max fp16 16384x1024 (last axis)", lambda: ops.reduce((E16, 1024), "float16", "max")),
    ("softmax", "softmax fp16 4096x4096", lambda: ops.softmax(4096, 4096, "float16")),
    ("softmax_vocab", "softmax fp16 4096x32000 (a LLaMA vocabulary)", lambda: ops.softmax(4096, 32000, "float16")),
    ("matmul_nn_f16_1k", "matmul NN fp16 1024^3 (fp32 acc)", lambda: ops.matmul(1024, 1024, 1024, "float16", "float32", "NN")),
    ("matmul_nt_f16_1k", "matmul NT fp16 1024^3 (fp32 acc)", lambda: ops.matmul(1024, 1024, 1024, "float16", "float32", "NT")),
    ("matmul_nn_f32_1k", "matmul NN fp32 1024^3", lambda: ops.matmul(1024, 1024, 1024, "float32", layout="NN")),
    ("matmul_nt_f32_1k", "matmul NT fp32 1024^3", lambda: ops.matmul(1024, 1024, 1024, "float32", layout="NT")),
    ("matmul_nn_f32_4k", "matmul NN fp32 4096^3", lambda: ops.matmul(4096, 4096, 4096, "float32", layout="NN")),
    ("matmul_nn_f16_8k", "matmul NN fp16 8192^3 (fp32 acc)", lambda: ops.matmul(8192, 8192, 8192, "float16", "float32", "NN")),
    ("matmul_nt_f16_8k", "matmul NT fp16 8192^3 (fp32 acc)", lambda: ops.matmul(8192, 8192, 8192, "float16", "float32", "NT")),
    ("matmul_nn_f32_8k", "matmul NN fp32 8192^3", lambda: ops.matmul(8192, 8192, 8192, "float32", layout="NN")),
    ("matmul_nt_f32_8k", "matmul NT fp32 8192^3", lambda: ops.matmul(8192, 8192, 8192, "float32", layout="NT")),
    ("gemv", "gemv fp16 1x16384x16384", lambda: ops.gemv(E16, E16, m=1, dtype="float16")),
    ("conv2d", "conv2d NHWC fp16 8x56x56x64 -> 64, 3x3 pad 1",
     lambda: ops.conv2d_nhwc(8, 56, 56, 64, 64, 3, 3, 1, 1, "float16")),
]  # fmt: skip


# -- torch: the vendor-library baseline and the float64 reference -------------------------------
def _torch():
    try:
        import torch

    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    # fp32 rows: no TF32; fp16/bf16 rows: fp32 accumulation, as fastdlight's kernels do
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    return torch


def torch_tensors(torch, tensors):
    """TVM device tensors as torch tensors (zero-copy via DLPack when possible)."""
    out = []
    for t in tensors:
        try:
            out.append(torch.from_dlpack(t))
        except Exception:  # noqa: BLE001 - copy through the host instead
            out.append(torch.from_numpy(t.numpy()).cuda())
    return out


def torch_kernel(torch, key: str, op, args):
    """A no-argument callable running torch's implementation of ``op`` on ``args``."""
    a = args[0]
    if key == "copy":
        return lambda: args[1].copy_(a)
    if key == "add":
        return lambda: torch.add(a, args[1], out=args[2])
    if key in ("sum", "max"):
        fn = torch.sum if key == "sum" else torch.amax
        return lambda: fn(a, dim=1)
    if key.startswith("softmax"):
        return lambda: torch.softmax(a, dim=1)
    if key.startswith("matmul"):
        b = args[1].t() if "_nt_" in key else args[1]
        if args[2].dtype != a.dtype:  # fp16 in, fp32 out: torch writes fp16 (fp32 accumulation)
            return lambda: torch.matmul(a, b)
        return lambda: torch.matmul(a, b, out=args[2])
    if key == "gemv":
        return lambda: torch.matmul(a, args[1].t())
    if key == "conv2d":
        x = a.permute(0, 3, 1, 2)  # NHWC data seen as NCHW with channels-last strides
        w = args[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)  # RSCK -> KCRS
        return lambda: torch.nn.functional.conv2d(x, w, padding=1)
    raise KeyError(key)


def torch_reference(torch, key: str):
    """``ref(*numpy inputs) -> float64 output`` computed with torch in float64 on the GPU."""

    def dev(x):
        return torch.from_numpy(np.ascontiguousarray(x)).cuda().double()

    def ref(*inputs):
        xs = [dev(x) for x in inputs]
        if key == "copy":
            out = xs[0]
        elif key == "add":
            out = xs[0] + xs[1]
        elif key == "sum":
            out = xs[0].sum(dim=1)
        elif key == "max":
            out = xs[0].amax(dim=1)
        elif key.startswith("softmax"):
            out = torch.softmax(xs[0], dim=1)
        elif key.startswith("matmul"):
            out = xs[0] @ (xs[1].t() if "_nt_" in key else xs[1])
        elif key == "gemv":
            out = xs[0] @ xs[1].t()
        else:  # conv2d NHWC
            y = torch.nn.functional.conv2d(xs[0].permute(0, 3, 1, 2), xs[1].permute(3, 2, 0, 1), padding=1)
            out = y.permute(0, 2, 3, 1)
        return out.cpu().numpy()

    return ref


# -- one operator ------------------------------------------------------------------------------
def perf(op, ms):
    if ms is None:
        return None
    secs = ms * 1e-3
    return (op.bytes / secs / 1e9, "GB/s") if op.memory_bound else (op.flops / secs / 1e12, "TFLOPS")


def tune_ours(op, arch, wl, ref, args):
    """fastdlight's candidate sets (tensor cores first), each through apply_and_build on ``wl``."""
    errors = []
    opts = TuneOptions(ref=ref, workload=wl, budget_ms=args.budget_ms, max_workers=args.workers, progress=False,
                       timing=args.timing)
    for cand in candidate_sets(op.func, arch, args.topk):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cand.policy, apply_and_build(cand.func, cand.configs, arch, options=opts), errors
        except TuningError as e:
            errors.append(f"{cand.policy}: {str(e).splitlines()[0]}")
    return None, None, errors


def dlight_module(func, target_spec):
    target = tvm.target.Target(target_spec)
    return build(tvm.IRModule({"main": default_schedule(func, target).mod["main"]}), target)


def bench_one(key, desc, op, arch, args, torch):
    row = {"op": key, "desc": desc, "unit": "GB/s" if op.memory_bound else "TFLOPS", "timing": args.timing}
    dev = tvm.cuda(0)
    flush = flush_bytes_for(arch.l2_bytes)
    wl = Workload(op.func, dev, seed=0)
    # every kernel below is timed on the same argument sets, the same way
    arg_sets = wl.timing_arg_sets(arch.l2_bytes) if args.timing == "rotate" else [wl.args]
    ref = torch_reference(torch, key) if torch is not None else op.reference

    t0 = time.perf_counter()
    policy, outcome, errors = tune_ours(op, arch, wl, ref, args)
    row["tune_s"] = round(time.perf_counter() - t0, 2)
    launchers = {}  # side -> (launch, arg sets) for the graph re-timing
    if outcome is None:
        row["error"] = "; ".join(errors)
    else:
        results, best = outcome
        top1 = next(r for r in results if r.index == 0)
        row.update(
            policy=policy, best_ms=best.latency_ms, best_config=repr(best.config), best_index=best.index,
            verified=best.verified, check=best.check_message, top1_ms=top1.latency_ms,
            top1_verified=top1.verified, top1_error=top1.error, n_candidates=len(results),
            n_timed=sum(r.latency_ms is not None for r in results), registers=best.registers,
            failures=sorted({r.failure.stage for r in results if r.failure}),
        )  # fmt: skip
        launchers["best"] = best.module[function_name(best.module, best._func)]
        if top1.module is not None and top1.latency_ms is not None:
            launchers["top1"] = top1.module[function_name(top1.module, top1._func)]

    for side, spec in DLIGHT_TARGETS.items():  # stock Dlight on the same inputs
        try:
            mod = dlight_module(op.func, spec)
            launchers[side] = mod[function_name(mod, op.func)]
            row[f"{side}_ms"] = time_module(mod, function_name(mod, op.func), arg_sets, dev, args.budget_ms,
                                            args.timing, flush).median_ms
        except Exception as e:  # noqa: BLE001
            row[f"{side}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    torch_fns = None
    if torch is not None:
        try:
            torch_fns = [torch_kernel(torch, key, op, torch_tensors(torch, a)) for a in arg_sets]
            row["torch_ms"] = time_torch(torch_fns, args.budget_ms, args.timing, flush).median_ms
        except Exception as e:  # noqa: BLE001
            row["torch_error"] = f"{type(e).__name__}: {e}"
    retime_in_graphs(row, launchers, torch_fns, arg_sets, dev, args)
    for name in ("best", "top1", *DLIGHT_TARGETS, "torch"):
        p = perf(op, row.get(f"{name}_ms"))
        row[f"{name}_perf"] = None if p is None else round(p[0], 1)
    return row


def retime_in_graphs(row, launchers, torch_fns, arg_sets, dev, args) -> None:
    """Short kernels: every side again, inside CUDA graphs (queued numbers kept as *_queued_ms)."""
    sides = [*launchers, *(["torch"] if torch_fns else [])]
    fastest = min((row[f"{s}_ms"] for s in sides if row.get(f"{s}_ms")), default=None)
    row["method"] = "queued launches"
    if fastest is None or fastest >= GRAPH_BELOW_MS or args.timing != "rotate":
        return
    row["method"] = "CUDA graphs"
    for side in sides:
        estimate = row.get(f"{side}_ms") or fastest
        row[f"{side}_queued_ms"] = row.get(f"{side}_ms")
        try:
            if side == "torch":
                t = time_torch_graph(torch_fns, args.budget_ms, estimate)
            else:
                t = time_graph(launchers[side], arg_sets, dev, args.budget_ms, estimate)
            row[f"{side}_ms"] = t.median_ms
        except Exception as e:  # noqa: BLE001 - keep the queued number, say why
            row[f"{side}_graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def fmt_ms(row, name):
    ms, p = row.get(f"{name}_ms"), row.get(f"{name}_perf")
    if ms is None:
        return "fail" if (name != "torch" or row.get("torch_error")) else "-"
    return f"{ms:.3f} ({p:g})"


def markdown(rows) -> str:
    lines = [
        "| op | timed with | fastdlight top-1 ms (perf) | fastdlight best-of-k ms (perf) | Dlight sm_90a ms (perf) "
        "| Dlight sm_90 ms (perf) | torch ms (perf) | best/torch | best/Dlight sm_90 | tune s | timed/k | verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        def ratio(a, b):
            return f"{r[b] / r[a]:.2f}x" if r.get(a) and r.get(b) else "-"

        lines.append(
            f"| {r['desc']} [{r['unit']}] | {r.get('method', '-')} | {fmt_ms(r, 'top1')} | {fmt_ms(r, 'best')} "
            f"| {fmt_ms(r, 'dlight_sm90a')} | {fmt_ms(r, 'dlight_sm90')} | {fmt_ms(r, 'torch')} "
            f"| {ratio('best_ms', 'torch_ms')} | {ratio('best_ms', 'dlight_sm90_ms')} "
            f"| {r.get('tune_s', '-')} | {r.get('n_timed', 0)}/{r.get('n_candidates', 0)} "
            f"| {r.get('verified', r.get('error', '-'))} |"
        )
    lines.append("\nratios: >1x means fastdlight's best is faster (latency of the other / fastdlight's).")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated substrings of op keys to run (e.g. matmul,softmax)")
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--timing", choices=("rotate", "flush"), default="rotate",
                        help="rotate input copies (default) or flush L2 before each synchronized launch")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--json", help="output JSON (default: $OUT/bench_ops.json when $OUT is set)")
    parser.add_argument("--max-seconds", type=float, default=540.0, help="skip the remaining ops after this")
    parser.add_argument("--list", action="store_true", help="list the ops and exit")
    args = parser.parse_args(argv)
    seed = SEED
    if args.ops:
        keys = [k.strip() for k in args.ops.split(",") if k.strip()]
        seed = [s for s in SEED if any(k in s[0] for k in keys)]
    if args.list or not seed:
        print("\n".join(f"{k:20s} {d}" for k, d, _ in SEED))
        return 0 if args.list else 2
    if not has_gpu():
        print("bench_ops: no GPU found; this benchmark needs one (try `fastdlight tune ... --no-measure`)")
        return 2
    arch = auto_arch()
    torch = _torch()
    out_path = args.json or (os.path.join(os.environ["OUT"], "bench_ops.json") if os.environ.get("OUT") else None)
    print(f"device: {tvm.cuda(0).device_name}, arch {arch.arch}, {os.cpu_count()} CPUs, topk {args.topk}, "
          f"budget {args.budget_ms:g} ms, torch {'yes (TF32 off, fp32 accumulation)' if torch else 'no'}; "
          f"timing: {args.timing}, kernels under {GRAPH_BELOW_MS * 1e3:g} us re-timed in CUDA graphs", flush=True)
    t_start, rows = time.perf_counter(), []
    for key, desc, make in seed:
        if time.perf_counter() - t_start > args.max_seconds:
            rows.append({"op": key, "desc": desc, "unit": "-", "error": "skipped: --max-seconds reached"})
            continue
        try:
            row = bench_one(key, desc, make(), arch, args, torch)
        except Exception as e:  # noqa: BLE001 - one op's failure must not lose the others
            traceback.print_exc()
            row = {"op": key, "desc": desc, "unit": "-", "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out_path:
            with open(out_path, "w") as f:
                json.dump({"device": str(tvm.cuda(0).device_name), "arch": arch.arch, "topk": args.topk,
                           "rows": rows}, f, indent=1)
    print()
    print(markdown(rows))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
