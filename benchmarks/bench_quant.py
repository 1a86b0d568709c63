"""Low-precision matmuls against torch on one GPU: FP8 GEMMs (the wgmma template, e4m3 inputs,
sums kept in the tensor cores' accumulator, per-tensor scales in the epilogue) against
``torch._scaled_mm`` with the same accumulation (``use_fast_accum=True``), and weight-only
4-bit matmuls (``ops.matmul_int4``, group 128) against our own fp16 kernel of the same layer
(decode) and against cuBLAS fp16 (prefill).

    python benchmarks/bench_quant.py [--only NAME ...] [--topk 20] [--list]

Each case is tuned through ``fastdlight.tune`` (verified against its float64 reference), then
the winner and the baseline are timed the same way, in CUDA graphs, inputs rotated out of L2,
turn by turn (``bench_gemm_hopper.paired_rounds``: medians of alternating rounds). A row: ms of
each side, their ratio (> 1: ours faster), TFLOPS or, for decode, GB/s of the bytes each side
must read (the packed weights and scales for 4-bit). Writes ``$OUT/bench_quant.json`` and
``.md``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_setup import case_arguments, each_case, gpu_arch, write_case_results  # noqa: E402

NAME = "bench_quant"
LLAMA = {"qkv": (12288, 4096), "o": (4096, 4096), "up": (11008, 4096), "down": (4096, 11008)}


@dataclass(frozen=True)
class Case:
    """``kind``: "fp8" (ours: ``matmul_scaled``; baseline ``torch._scaled_mm``), "w4_decode"
    (ours: ``matmul_int4`` or, ``bits`` 8, ``matmul_int8``; baseline: our tuned 16-bit GEMV of
    the layer), "w4_prefill" (baseline: cuBLAS fp16). N×K is the weight, M the rows of
    activations."""

    kind: str
    m: int
    n: int
    k: int
    bits: int = 4  # the decode and prefill cases' weights
    dtype: str = "float16"  # their activations (and the baseline GEMV's)


CASES = {
    "fp8 4096³": Case("fp8", 4096, 4096, 4096),
    "fp8 8192³": Case("fp8", 8192, 8192, 8192),
    **{f"fp8 llama {p} 2048×{n}×{k}": Case("fp8", 2048, n, k) for p, (n, k) in LLAMA.items()},
    "w4a16 decode 1×11008×4096": Case("w4_decode", 1, 11008, 4096),
    "w4a16 decode 1×4096×11008": Case("w4_decode", 1, 4096, 11008),
    "w4a16 bf16 decode 1×11008×4096": Case("w4_decode", 1, 11008, 4096, dtype="bfloat16"),
    "w8a16 decode 1×11008×4096": Case("w4_decode", 1, 11008, 4096, bits=8),
    "w8a16 decode 1×4096×11008": Case("w4_decode", 1, 4096, 11008, bits=8),
    "w4a16 prefill 2048×11008×4096": Case("w4_prefill", 2048, 11008, 4096),
}
GROUP = 128
ROUNDS, ROUND_MS = 6, 100.0


@dataclass
class Row:
    case: str
    ours_ms: float
    baseline: str
    baseline_ms: float
    ratio: float
    ours_rate: str
    baseline_rate: str
    winner: str
    tune_s: float


def tuned(op, arch, topk: int):
    import fastdlight

    t0 = time.perf_counter()
    _, best = fastdlight.tune(op.func, arch, topk=topk, ref=op.reference, progress=False)
    return best, round(time.perf_counter() - t0, 1)


def graph_timer(best, arch):
    """``ms -> median ms`` of ``best`` replayed from a CUDA graph, inputs rotated out of L2."""
    import tvm

    from fastdlight.measure.graph_timing import time_graph
    from fastdlight.measure.timing import function_name
    from fastdlight.measure.workload import Workload

    wl = Workload(best._func, tvm.cuda(0), seed=0)
    sets = wl.timing_arg_sets(arch.l2_bytes)
    launch = best.module[function_name(best.module, best._func)]
    return lambda ms: time_graph(launch, sets, wl.dev, ms, best.latency_ms).median_ms


def torch_timer(make_call, input_bytes: int, arch, per_launch_ms: float):
    """``ms -> median ms`` of torch calls from ``make_call()`` (each over inputs of its own,
    rotated out of L2 as ours are), replayed from a CUDA graph."""
    from fastdlight.measure.graph_timing import time_torch_graph
    from fastdlight.measure.timing import rotation_copies

    calls = [make_call() for _ in range(rotation_copies(input_bytes, arch.l2_bytes))]
    return lambda ms: time_torch_graph(calls, ms, per_launch_ms).median_ms


def scaled_mm(m: int, n: int, k: int):
    import torch

    def make():
        a = torch.randn(m, k, device="cuda").clamp(-1, 1).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").clamp(-1, 1).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        # fast accumulation, as ours: the running sums stay in the tensor cores' accumulator
        # (about 14 bits; measure.check_kinds.FP8_MMA_ACC) instead of being promoted to fp32
        # registers every few k-steps
        return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float16,
                                        use_fast_accum=True)

    return make


def fp16_matmul(m: int, n: int, k: int):
    import torch

    def make():
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        return lambda: torch.matmul(a, w.t())

    return make


def run_case(name: str, case: Case, arch, topk: int) -> Row:
    from bench_gemm_hopper import paired_rounds

    from fastdlight import ops

    m, n, k = case.m, case.n, case.k
    flops = 2.0 * m * n * k
    if case.kind == "fp8":
        op = ops.matmul_scaled(m, n, k, "float8_e4m3fn", "float16", "tensor")
        best, tune_s = tuned(op, arch, topk)
        theirs, label = torch_timer(scaled_mm(m, n, k), (m + n) * k, arch, best.latency_ms), "torch._scaled_mm"
    elif case.kind == "w4_decode":
        op = (ops.matmul_int8 if case.bits == 8 else ops.matmul_int4)(m, n, k, GROUP, dtype=case.dtype)
        best, tune_s = tuned(op, arch, topk)
        fp16 = ops.gemv(n, k, m=m, dtype=case.dtype)
        fp16_best, _ = tuned(fp16, arch, topk)
        label = f"fastdlight {'bf16' if case.dtype == 'bfloat16' else 'fp16'} GEMV"
        theirs = graph_timer(fp16_best, arch)
    else:
        op = ops.matmul_int4(m, n, k, GROUP)
        best, tune_s = tuned(op, arch, topk)
        theirs, label = torch_timer(fp16_matmul(m, n, k), 2 * (m + n) * k, arch, best.latency_ms), "cuBLAS fp16"
    ours_rounds, their_rounds = paired_rounds(graph_timer(best, arch), theirs, ROUNDS, ROUND_MS, heat_ms=ROUND_MS)
    ours_ms, their_ms = sorted(ours_rounds)[len(ours_rounds) // 2], sorted(their_rounds)[len(their_rounds) // 2]
    if case.kind == "w4_decode":
        ours_rate = f"{op.bytes / ours_ms / 1e6:.0f} GB/s"
        their_rate = f"{fp16.bytes / their_ms / 1e6:.0f} GB/s"
    else:
        ours_rate, their_rate = f"{flops / ours_ms / 1e9:.0f} TFLOPS", f"{flops / their_ms / 1e9:.0f} TFLOPS"
    return Row(name, round(ours_ms, 4), label, round(their_ms, 4), round(their_ms / ours_ms, 3), ours_rate,
               their_rate, repr(best.config), tune_s)


def markdown(rows: list[Row], device: str) -> str:
    lines = [f"bench_quant, {device}, {time.strftime('%Y-%m-%d')}: CUDA graphs on both sides, inputs rotated out "
             "of L2, medians of alternating rounds", "",
             "| case | fastdlight ms | baseline | baseline ms | ratio | ours | baseline | tune s | winner |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.case} | {r.ours_ms:.4f} | {r.baseline} | {r.baseline_ms:.4f} | {r.ratio:.2f}x | {r.ours_rate} "
              f"| {r.baseline_rate} | {r.tune_s} | {r.winner} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parsed = case_arguments(NAME, __doc__.splitlines()[0], CASES, argv, topk=20)
    if isinstance(parsed, int):
        return parsed
    args, names = parsed
    arch = gpu_arch()

    def one(name: str) -> Row:
        row = run_case(name, CASES[name], arch, args.topk)
        print(f"[{name}] {row.ratio:.2f}x ({row.ours_ms} ms vs {row.baseline_ms})", flush=True)
        return row

    rows, errors = each_case(names, one)
    write_case_results(NAME, arch, rows, errors, markdown)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
