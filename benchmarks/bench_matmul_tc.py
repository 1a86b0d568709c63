"""mma.sync tensor-core matmul benchmark: best of the TensorCorePolicy's mma.sync top-k vs cuBLAS
(torch), same run (the Hopper wgmma template has ``bench_gemm_hopper.py``).

    python benchmarks/bench_matmul_tc.py [--topk 20] [--budget-ms 100] [--only NAME ...]

For every case the policy's top-k configs are built in parallel worker processes (one per CPU),
each timed with CUDA events, inputs rotated out of L2 (median over ``--budget-ms``; the fastest few are
timed twice), the fastest correct one wins (checked against a float32 GPU reference), and
``torch.matmul`` / ``torch._int_mm`` is timed the same way. fp16 cases accumulate in fp32 and
store fp16 (a fused cast epilogue), like cuBLAS. A case the policy finds ineligible for tensor
cores runs on the CUDA-core DefaultPolicy instead, and the table says so.

Writes ``$OUT/bench_matmul_tc.json`` and ``$OUT/bench_matmul_tc.md`` (current directory without
``$OUT``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402
from tvm import te  # noqa: E402

from bench_setup import open_log, torch_fp32_accumulation  # noqa: E402
from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.policies.default import DefaultPolicy  # noqa: E402
from fastdlight.policies.tensorcore import TensorCorePolicy, tensorcore_tags  # noqa: E402
from fastdlight.schedules.matmul_tensorcore import apply_tensorcore  # noqa: E402
from fastdlight.search.runner import TuningError, apply_and_build  # noqa: E402
from fastdlight.measure.graph_timing import GRAPH_BELOW_MS, time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import function_name, rotation_copies, time_torch
from fastdlight.measure.workload import Workload  # noqa: E402

# name, M, N, K, input dtype, layout
CASES = [
    ("fp16 4096³ NN", 4096, 4096, 4096, "float16", "NN"),
    ("fp16 4096³ NT", 4096, 4096, 4096, "float16", "NT"),
    ("fp16 8192³ NN", 8192, 8192, 8192, "float16", "NN"),
    ("fp16 16384³ NN", 16384, 16384, 16384, "float16", "NN"),
    ("fp16 512×64×512", 512, 64, 512, "float16", "NN"),
    ("fp16 512×32×512", 512, 32, 512, "float16", "NN"),
    ("fp16 512×16×512", 512, 16, 512, "float16", "NN"),
    ("int8 4096³ NT", 4096, 4096, 4096, "int8", "NT"),
]


def matmul_func(m, n, k, dtype, layout):
    """fp16: C = A·B accumulated in fp32, stored fp16 (cast epilogue). int8: int32 output."""
    acc = "int32" if dtype == "int8" else "float32"
    A = te.placeholder((k, m) if layout[0] == "T" else (m, k), dtype, name="A")
    B = te.placeholder((n, k) if layout[1] == "T" else (k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")

    def a_at(i, kk):
        return A[kk, i] if layout[0] == "T" else A[i, kk]

    def b_at(j, kk):
        return B[j, kk] if layout[1] == "T" else B[kk, j]

    C = te.compute((m, n), lambda i, j: te.sum(a_at(i, r).astype(acc) * b_at(j, r).astype(acc), axis=r), name="C")
    if dtype == "int8":
        return te.create_prim_func([A, B, C]).with_attr("global_symbol", "matmul")
    D = te.compute((m, n), lambda i, j: C[i, j].astype(dtype), name="D")
    return te.create_prim_func([A, B, D]).with_attr("global_symbol", "matmul")


def torch_operands(a, b, layout):
    """(a, b) as torch CUDA tensors, b viewed so that ``a' @ b'`` is the product (no copies)."""
    import torch

    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    return (ta.t() if layout[0] == "T" else ta), (tb.t() if layout[1] == "T" else tb)


def gpu_reference(layout, out_dtype):
    """Reference on the GPU in float64 (exact for the small integers of int8 inputs)."""

    def ref(a, b):
        import torch

        ta, tb = torch_operands(a, b, layout)
        out = ta.double() @ tb.double()
        return out.to(torch.int32 if out_dtype == "int32" else torch.float64).cpu().numpy()

    return ref


def cublas_fn(a, b, layout, dtype):
    import torch

    ta, tb = torch_operands(a, b, layout)
    if dtype == "int8":
        try:
            torch._int_mm(ta, tb)
            return lambda: torch._int_mm(ta, tb)
        except RuntimeError:
            tbc = tb.contiguous()
            return lambda: torch._int_mm(ta, tbc)
    return lambda: torch.matmul(ta, tb)


def run_case(name, m, n, k, dtype, layout, arch, topk, budget_ms, log):
    func = matmul_func(m, n, k, dtype, layout)
    flops = 2.0 * m * n * k
    tags, reason = tensorcore_tags(func, arch)
    if tags is not None:
        configs, template, used = TensorCorePolicy(func, arch, tags, instructions=("mma.sync",)).emit_config(topk), apply_tensorcore, "tensor cores"
    else:
        configs, template, used = DefaultPolicy(func, arch).emit_config(topk), None, f"CUDA cores ({reason})"
    t0 = time.perf_counter()
    results, best = apply_and_build(
        func, configs, arch, check="winner", ref=gpu_reference(layout, "int32" if dtype == "int8" else dtype),
        budget_ms=budget_ms, template=template, progress=False,
    )  # fmt: skip
    tune_s = time.perf_counter() - t0
    failed = [r for r in results if r.error]
    for r in results:
        log(f"    {r.config}  {r.latency_ms if r.latency_ms is not None else '-'} ms  regs={r.registers}"
            f"  verified={r.verified}  {r.error or ''}")  # fmt: skip
    # cuBLAS on the same inputs, timed the same way (inputs rotated through copies)
    rng = np.random.default_rng(0)
    a_shape = (k, m) if layout[0] == "T" else (m, k)
    b_shape = (n, k) if layout[1] == "T" else (k, n)
    if dtype == "int8":
        a, b = rng.integers(-4, 5, a_shape).astype("int8"), rng.integers(-4, 5, b_shape).astype("int8")
    else:
        a, b = (rng.random(a_shape, np.float32) * 2 - 1).astype(dtype), (rng.random(b_shape, np.float32) * 2 - 1).astype(dtype)
    # the same rotation of input copies apply_and_build timed our kernels with
    fns = [cublas_fn(a, b, layout, dtype) for _ in range(rotation_copies(a.nbytes + b.nbytes, arch.l2_bytes))]
    cublas = time_torch(fns, budget_ms).median_ms
    ours, method = best.latency_ms, "queued launches"
    if min(ours, cublas) < GRAPH_BELOW_MS:  # short kernels: both sides inside CUDA graphs
        wl = Workload(best._func, tvm.cuda(0), seed=0)
        launch = best.module[function_name(best.module, best._func)]
        ours = time_graph(launch, wl.timing_arg_sets(arch.l2_bytes), wl.dev, budget_ms, ours).median_ms
        cublas, method = time_torch_graph(fns, budget_ms, cublas).median_ms, "CUDA graphs"
    return {
        "case": name, "M": m, "N": n, "K": k, "dtype": dtype, "layout": layout, "used": used,
        "best_config": repr(best.config), "best_index": best.index, "best_check": best.check_message,
        "ms": ours, "tflops": flops / ours / 1e9, "cublas_ms": cublas, "cublas_tflops": flops / cublas / 1e9,
        "ratio": cublas / ours, "method": method, "candidates": len(configs), "failed": len(failed), "tune_s": round(tune_s, 1),
        "failures": [f"{r.config}: {r.error}" for r in failed][:5],
    }  # fmt: skip


def markdown(rows, device) -> str:
    lines = [
        f"Device: {device}. Best of the policy's top-k (CUDA events, inputs rotated out of L2, median; kernels "
        f"under {GRAPH_BELOW_MS * 1e3:g} us on either side re-timed in CUDA graphs on both); cuBLAS = torch with fp32 "
        "accumulation (reduced-precision reductions off), same run.",
        "",
        "| case | path | best config | timed with | ms | TFLOPS (TOPS int8) | cuBLAS ms | cuBLAS TFLOPS | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r.get('used', '?')} | FAILED: {r['error'][:80]} | | | | | | |")
            continue
        lines.append(
            f"| {r['case']} | {r['used']} | {r['best_config']} | {r['method']} | {r['ms']:.4f} | {r['tflops']:.1f} | "
            f"{r['cublas_ms']:.4f} | {r['cublas_tflops']:.1f} | {r['ratio']:.2f}× |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--only", nargs="*", help="substrings of case names to run")
    args = parser.parse_args(argv)
    out_dir, log = open_log("bench_matmul_tc")
    torch_fp32_accumulation()
    arch = auto_arch()
    device = f"{tvm.cuda(0).device_name} ({arch.arch}, {arch.sm_count} SMs)"
    log(f"device: {device}")
    rows = []
    for case in CASES:
        name = case[0]
        if args.only and not any(s in name for s in args.only):
            continue
        log(f"== {name}")
        try:
            row = run_case(*case, arch, args.topk, args.budget_ms, log)
        except (TuningError, Exception) as e:  # noqa: BLE001 - report and go on with the next case
            row = {"case": name, "error": f"{type(e).__name__}: {e}"}
            log(traceback.format_exc())
        rows.append(row)
        log(json.dumps(row))
        with open(os.path.join(out_dir, "bench_matmul_tc.json"), "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)
    table = markdown(rows, device)
    log(table)
    with open(os.path.join(out_dir, "bench_matmul_tc.md"), "w") as f:
        f.write(table + "\n")
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
