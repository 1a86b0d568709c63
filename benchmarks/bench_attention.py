"""Attention against torch's scaled_dot_product_attention: prefill and decode at the shapes
models run, fp16, both sides in CUDA graphs.

    python benchmarks/bench_attention.py [--cases prefill_causal_4k,decode_b16] [--topk 8] [--list]

fastdlight: ``ops.attention`` tuned by the tuner's own path (``fastdlight.tune``; the winner
verified against the function's float64 twin), its kernels replayed from a CUDA graph. torch: ``F.scaled_dot_
product_attention`` (its flash or memory-efficient backend, as torch picks), K/V expanded to the
query heads where the case is GQA (``enable_gqa=True``), causal masks aligned to the bottom right
as ours (``causal_lower_right``; for TQ = TKV it is ``is_causal=True``; one query sees every key:
no mask), in a CUDA graph. Inputs
are the same random tensors (DLPack), cycled through copies so none is in L2. TFLOPS count the
(query, key) pairs the mask keeps, 4 * pairs * D per head.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_setup import one_line, refusal, write_results  # noqa: E402

NAME = "bench_attention"


@dataclass(frozen=True)
class Case:
    """``batch, heads, seq_q, seq_kv, head_dim`` with ``kv_heads`` (GQA) and ``causal``."""

    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    kv_heads: int | None = None
    causal: bool = False
    dtype: str = "float16"

    def describe(self) -> str:
        gqa = f" G{self.kv_heads}" if self.kv_heads and self.kv_heads != self.heads else ""
        bf16 = " bf16" if self.dtype == "bfloat16" else ""
        return (f"B{self.batch} H{self.heads}{gqa} TQ{self.seq_q} TKV{self.seq_kv} d{self.head_dim}"
                f"{' causal' if self.causal else ''}{bf16}")


#: the shapes torch's flash attention was measured at on an H200 (prefill: TFLOPS; decode: TB/s)
CASES = {
    "prefill_causal_4k": Case(1, 32, 4096, 4096, 128, causal=True),
    "prefill_causal_4k_bf16": Case(1, 32, 4096, 4096, 128, causal=True, dtype="bfloat16"),
    "prefill_tail_1000": Case(1, 32, 1000, 1000, 128, causal=True),
    "prefill_tail_4097": Case(1, 32, 4097, 4097, 128, causal=True),
    "prefill_causal_b4_2k": Case(4, 32, 2048, 2048, 128, causal=True),
    "prefill_causal_gpt2": Case(8, 12, 1024, 1024, 64, causal=True),
    "prefill_8k": Case(1, 32, 8192, 8192, 128),
    "prefill_gqa_2k": Case(1, 32, 2048, 2048, 128, kv_heads=8, causal=True),
    # head dims other than 64 and 128: Phi-3-mini's 96, Phi-2's 80, Gemma-7B's 256, SD's 40
    "prefill_phi3_d96": Case(1, 32, 2048, 2048, 96, causal=True),
    "prefill_phi2_d80": Case(4, 32, 1024, 1024, 80, causal=True),
    "prefill_gemma_d256": Case(1, 16, 2048, 2048, 256, causal=True),
    # Stable Diffusion 1.5's first UNet block: 64x64 latents, 8 heads of 40, batch 2 (guidance)
    "prefill_sd15_d40": Case(2, 8, 4096, 4096, 40),
    "decode_b1": Case(1, 32, 1, 4096, 128, causal=True),
    "decode_b16": Case(16, 32, 1, 4096, 128, causal=True),
    "decode_b64_2k": Case(64, 32, 1, 2048, 128, causal=True),
    # MQA: 32 query heads on one K/V head
    "decode_mqa_b8_8k": Case(8, 32, 1, 8192, 128, kv_heads=1, causal=True),
}


@dataclass
class Row:
    case: str
    shape: str
    ours_ms: float | None = None
    torch_ms: float | None = None
    ours_tflops: float | None = None
    torch_tflops: float | None = None
    ours_tbs: float | None = None  # bytes of Q, K, V and the output per second (decode's bound)
    torch_tbs: float | None = None
    config: str = ""
    verified: bool | None = None
    tune_s: float | None = None
    #: where the tune's seconds went (``fastdlight.measure.clock`` stages)
    tune_stage_s: dict = field(default_factory=dict)
    error: str = ""


def list_cases() -> str:
    lines = ["| case | shape |", "|---|---|"]
    lines += [f"| {name} | {case.describe()} |" for name, case in CASES.items()]
    return "\n".join(lines)


def torch_calls(case: Case, arg_sets) -> list:
    """torch's ``scaled_dot_product_attention`` of ``case``, a callable per input copy of
    ``arg_sets`` (our workload's tensors, shared through DLPack)."""
    import torch

    def sdpa(q, k, v):
        mask = None
        # one query aligned to the bottom right sees every key: no mask (a mask tensor would
        # take torch off its flash kernel for nothing)
        if case.causal and case.seq_q != case.seq_kv and case.seq_q > 1:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(case.seq_q, case.seq_kv)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=case.causal and case.seq_q == case.seq_kv > 1,
            enable_gqa=bool(case.kv_heads and case.kv_heads != case.heads))

    fns = []
    for args_ in arg_sets:
        q, k, v = (torch.from_dlpack(a) for a in args_[:3])
        fns.append(lambda q=q, k=k, v=v: sdpa(q, k, v))
    return fns


def run_case(name: str, case: Case, args) -> Row:
    import torch

    import fastdlight
    from fastdlight import ops
    from fastdlight.arch import auto_arch
    from fastdlight.measure import clock
    from fastdlight.measure.graph_timing import time_graph, time_torch_graph
    from fastdlight.measure.timing import function_name
    from fastdlight.measure.workload import Workload

    row = Row(name, case.describe())
    op = ops.attention(case.batch, case.heads, case.seq_q, case.seq_kv, case.head_dim,
                       kv_heads=case.kv_heads, causal=case.causal, dtype=case.dtype)
    arch = auto_arch()
    t0, before = time.perf_counter(), clock.snapshot()
    # verified against the function's float64 twin on the GPU: numpy's would hold B*H*TQ*TKV
    # float64 scores on the host (17 GB at 32 heads of 8192)
    _, best = fastdlight.tune(op.func, arch, topk=args.topk, progress=False)
    row.tune_s, row.config, row.verified = round(time.perf_counter() - t0, 1), str(best.config), best.verified
    row.tune_stage_s = {k: round(v, 2) for k, v in clock.since(before).items()}
    wl = Workload(op.func, seed=1)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    fn = best.module[function_name(best.module, op.func)]
    row.ours_ms = time_graph(fn, arg_sets, wl.dev, args.budget_ms, per_launch_ms=best.latency_ms).median_ms

    fns = torch_calls(case, arg_sets)
    with torch.no_grad():
        row.torch_ms = time_torch_graph(fns, args.budget_ms, row.ours_ms).median_ms
    for side in ("ours", "torch"):
        ms = getattr(row, f"{side}_ms")
        setattr(row, f"{side}_tflops", round(op.flops / (ms * 1e-3) / 1e12, 1))
        setattr(row, f"{side}_tbs", round(op.bytes / (ms * 1e-3) / 1e12, 2))
    return row


def markdown(rows: list[Row]) -> str:
    lines = ["| case | shape | fastdlight ms | torch ms | vs torch | TFLOPS (ours / torch) | TB/s (ours / torch) "
             "| verified | tune s | config | error |", "|" + "---|" * 11]
    for r in rows:
        ratio = f"{r.torch_ms / r.ours_ms:.2f}x" if r.ours_ms and r.torch_ms else "-"
        lines.append(f"| {r.case} | {r.shape} | {_f(r.ours_ms, '.4f')} | {_f(r.torch_ms, '.4f')} | {ratio} "
                     f"| {_f(r.ours_tflops, '.1f')} / {_f(r.torch_tflops, '.1f')} "
                     f"| {_f(r.ours_tbs, '.2f')} / {_f(r.torch_tbs, '.2f')} | {r.verified} | {_f(r.tune_s, '.1f')} "
                     f"| {r.config} | {r.error} |")
    return "\n".join(lines) + "\n"


def _f(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--budget-ms", type=float, default=200.0)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        print(list_cases())
        return 0
    names = [n for n in args.cases.split(",") if n]
    error = refusal(NAME, names, CASES, "case")
    if error:
        print(error, file=sys.stderr)
        return 2

    rows = []
    for name in names:
        try:
            rows.append(run_case(name, CASES[name], args))
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            rows.append(Row(name, CASES[name].describe(), error=one_line(e)))
        print(json.dumps(asdict(rows[-1])), flush=True)
    import tvm

    from fastdlight.arch import CUDA

    device = CUDA.from_device(tvm.cuda(0)).device_name
    data = {"benchmark": NAME, "device": device, "date": time.strftime("%Y-%m-%d"), "rows": [asdict(r) for r in rows]}
    write_results(NAME, data, f"{NAME}, {device}, {data['date']}\n\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
