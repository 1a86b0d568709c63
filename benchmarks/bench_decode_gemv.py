"""Decode GEMVs (Y[M, N] = X[M, K] · W[N, K]ᵀ, M = 1..16, fp16 in, fp32 accumulation): the GEMV
template against the CUDA-core matmul template, and torch, on the GPU.

    python benchmarks/bench_decode_gemv.py [--topk 10] [--shapes 4096x4096,11008x4096]

For every shape the policy's top-k of each template are built and timed on the same inputs
(``apply_and_build``: inputs rotated out of L2, queued launches, verified); the winner of each
template, and torch's ``F.linear`` (fp32 accumulation), are then timed again inside CUDA graphs
(these kernels take microseconds: the host's launch cost must not decide). Prints a markdown
table; the tuner keeps whichever template wins (see the closing note of the coverage issue).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402

from fastdlight import ops  # noqa: E402
from fastdlight.arch import auto_arch, has_gpu  # noqa: E402
from fastdlight.policies.default import DefaultPolicy  # noqa: E402
from fastdlight.measure.graph_timing import time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import function_name
from fastdlight.measure.workload import Workload  # noqa: E402
from fastdlight.search.runner import TuningError, apply_and_build  # noqa: E402

MS = (1, 2, 4, 8, 16)
TEMPLATES = ("gemv", "matmul")


def best_of(op, arch, family: str, wl, args):
    configs = DefaultPolicy(op.func, arch, family=family).emit_config(args.topk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, best = apply_and_build(op.func, configs, arch, ref=op.reference, workload=wl, budget_ms=args.budget_ms,
                                  progress=False)
    launch = best.module[function_name(best.module, best._func)]
    graph = time_graph(launch, wl.timing_arg_sets(arch.l2_bytes), wl.dev, args.budget_ms, best.latency_ms)
    return best, graph.median_ms


def torch_ms(wl, arch, args) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    fns = []
    for a in wl.timing_arg_sets(arch.l2_bytes):
        x, w = torch.from_dlpack(a[0]), torch.from_dlpack(a[1])
        fns.append(lambda x=x, w=w: torch.nn.functional.linear(x, w))
    return time_torch_graph(fns, args.budget_ms, 0.01).median_ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topk", type=int, default=10)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument("--shapes", default="4096x4096,11008x4096", help="NxK, comma-separated")
    args = parser.parse_args(argv)
    if not has_gpu():
        print("bench_decode_gemv: no GPU found", file=sys.stderr)
        return 2
    arch = auto_arch()
    print(f"device: {tvm.cuda(0).device_name}; fp16 in, fp32 accumulation; winners timed in CUDA graphs")
    rows = ["| N×K | M | GEMV template µs | matmul template µs | torch µs | faster template | GEMV config |",
            "|---|---|---|---|---|---|---|"]
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in MS:
            op = ops.gemv(n, k, m=m, dtype="float16", out_dtype="float32")
            wl = Workload(op.func, tvm.cuda(0), seed=0)
            times, configs = {}, {}
            for family in TEMPLATES:
                try:
                    best, times[family] = best_of(op, arch, family, wl, args)
                    configs[family] = repr(best.config)
                except (TuningError, ValueError) as e:
                    times[family], configs[family] = None, f"failed: {str(e).splitlines()[0][:60]}"
            t = torch_ms(wl, arch, args)
            done = {f: v for f, v in times.items() if v is not None}
            winner = min(done, key=done.get) if done else "-"

            def us(v):
                return "-" if v is None else f"{v * 1e3:.2f}"

            rows.append(f"| {n}×{k} | {m} | {us(times['gemv'])} | {us(times['matmul'])} | {us(t)} | {winner} "
                        f"| {configs['gemv']} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
