"""Weight-only 4-bit prefill on Hopper: the dequantizing wgmma template (``matmul_wgmma_dequant``)
checked and timed on one GPU (sm_90a).

    python benchmarks/check_w4a16_wgmma.py [--only NAME ...] [--topk 8] [--list]

For each case (``ops.matmul_int4``, group 128, fp16): the template's configs alone are built,
timed and verified against the float64 reference of the dequantized weights
(``apply_and_build``, one row each: ms, TFLOPS, verdict); then ``fastdlight.tune`` with every
policy's configs (the template's beside the mma.sync tiles). The best of each is timed against
torch fp16 matmul (cuBLAS) of the same dequantized weights, both in CUDA graphs, inputs rotated
out of L2, alternating rounds of 100 ms (``bench_gemm_hopper.paired_rounds``, medians). Writes
``$OUT/check_w4a16_wgmma.json`` and ``.md``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_setup import case_arguments, each_case, gpu_arch, write_case_results

NAME = "check_w4a16_wgmma"
GROUP = 128
CASES = {
    "2048x11008x4096": (2048, 11008, 4096),
    "2048x4096x11008": (2048, 4096, 11008),
    "1000x4096x4096": (1000, 4096, 4096),
}
ROUNDS, ROUND_MS = 6, 100.0


def dequantized_matmul(op, m: int, n: int, k: int):
    """``make() -> call``: torch fp16 ``x @ w.T`` over the op's dequantized weights (random packed
    words and scales, as the tuner's inputs are), each call over copies of its own."""
    import numpy as np
    import torch

    from fastdlight.ops import dequantize_weights

    rng = np.random.default_rng(0)
    q = rng.integers(0, 2**32, size=(n, k // 8), dtype=np.uint64).astype(np.uint32)
    s = (rng.standard_normal((n, k // GROUP)) * 0.02).astype(np.float16)
    w = torch.from_numpy(dequantize_weights(q, s, None, GROUP, "float16", 4).astype(np.float16)).cuda()

    def make():
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        wc = w.clone()
        return lambda: torch.matmul(x, wc.t())

    return make


def timed_pair(best, make_torch, m, n, k, arch):
    from bench_gemm_hopper import paired_rounds
    from bench_quant import graph_timer, torch_timer

    theirs = torch_timer(make_torch, 2 * (m + n) * k, arch, best.latency_ms)
    ours_rounds, their_rounds = paired_rounds(graph_timer(best, arch), theirs, ROUNDS, ROUND_MS, heat_ms=ROUND_MS)
    return sorted(ours_rounds)[len(ours_rounds) // 2], sorted(their_rounds)[len(their_rounds) // 2]


def run_case(name: str, arch, topk: int, log) -> dict:
    import fastdlight
    from fastdlight import ops
    from fastdlight.analysis.weight_only import match_weight_only
    from fastdlight.policies.wgmma_dequant import dequant_wgmma_configs
    from fastdlight.search.runner import apply_and_build

    m, n, k = CASES[name]
    flops = 2.0 * m * n * k
    op = ops.matmul_int4(m, n, k, GROUP)
    configs = dequant_wgmma_configs(match_weight_only(op.func), arch, topk)
    if not configs:
        raise RuntimeError(f"no matmul_wgmma_dequant config for {name} on {arch.arch} (sm_90a needed)")
    t0 = time.perf_counter()
    results, best_new = apply_and_build(op.func, configs, arch, ref=op.reference)
    per_config = []
    for r in sorted(results, key=lambda r: r.index):
        ms = r.latency_ms
        row = {"config": repr(r.config), "ms": ms, "tflops": flops / ms / 1e9 if ms else None,
               "verified": r.verified, "check": r.check_message,
               "failure": (r.failure.message.splitlines()[0] if r.failure else None),
               "registers": r.registers, "spill_bytes": r.spill_bytes}
        per_config.append(row)
        log(f"  {row['config']}: {ms and round(ms, 4)} ms "
            f"({row['tflops'] and round(row['tflops'])} TFLOPS) verified={r.verified} {row['failure'] or ''}")
    new_s = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    _, best_all = fastdlight.tune(op.func, arch, topk=topk, ref=op.reference, progress=False)
    all_s = round(time.perf_counter() - t0, 1)
    make_torch = dequantized_matmul(op, m, n, k)
    new_ms, torch_ms = timed_pair(best_new, make_torch, m, n, k, arch)
    if best_all.config == best_new.config:
        all_ms = new_ms
    else:
        all_ms, torch_ms2 = timed_pair(best_all, make_torch, m, n, k, arch)
        torch_ms = min(torch_ms, torch_ms2)
    out = {"case": name, "new_best": repr(best_new.config), "new_verified": best_new.verified, "new_ms": round(new_ms, 4),
           "new_tflops": round(flops / new_ms / 1e9), "all_best": repr(best_all.config),
           "all_verified": best_all.verified, "all_ms": round(all_ms, 4), "all_tflops": round(flops / all_ms / 1e9),
           "torch_fp16_ms": round(torch_ms, 4), "torch_tflops": round(flops / torch_ms / 1e9),
           "new_vs_cublas": round(torch_ms / new_ms, 3), "all_vs_cublas": round(torch_ms / all_ms, 3),
           "tune_new_s": new_s, "tune_all_s": all_s, "configs": per_config}
    return out


def markdown(rows: list[dict], device: str) -> str:
    lines = [(f"check_w4a16_wgmma, {device}, {time.strftime('%Y-%m-%d')}: W4A16 (group 128) prefill, CUDA graphs, "
              "inputs rotated out of L2, medians of alternating rounds; ratio > 1: faster than cuBLAS fp16"), "",
             "| case | new-template best | ms | TFLOPS | vs cuBLAS | all-configs best | ms | vs cuBLAS | cuBLAS fp16 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['new_best']} | {r['new_ms']:.4f} | {r['new_tflops']} | {r['new_vs_cublas']:.2f}x "
              f"| {r['all_best']} | {r['all_ms']:.4f} | {r['all_vs_cublas']:.2f}x | {r['torch_fp16_ms']:.4f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parsed = case_arguments(NAME, __doc__.splitlines()[0], CASES, argv, topk=8)
    if isinstance(parsed, int):
        return parsed
    args, names = parsed
    arch = gpu_arch()

    def one(name: str) -> dict:
        print(f"[{name}]", flush=True)
        r = run_case(name, arch, args.topk, lambda msg: print(msg, flush=True))
        print(f"[{name}] new {r['new_ms']} ms ({r['new_vs_cublas']:.2f}x cuBLAS, verified={r['new_verified']}), "
              f"all {r['all_ms']} ms ({r['all_vs_cublas']:.2f}x, {r['all_best']}), cuBLAS {r['torch_fp16_ms']} ms",
              flush=True)
        return r

    rows, errors = each_case(names, one)
    write_case_results(NAME, arch, rows, errors, markdown)
    return 0 if rows and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
