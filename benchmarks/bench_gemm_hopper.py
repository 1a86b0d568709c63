"""Hopper GEMM benchmark: what the tuner picks (TMA + wgmma, mma.sync and stock Dlight
candidates measured together) against cuBLAS (torch), same run.

    python benchmarks/bench_gemm_hopper.py [--topk 20] [--only NAME ...] [--check-odd]

Each case is ``D = cast(A @ B)`` with fp32 accumulation (fp16 or bf16 in and out), tuned
through ``fastdlight.tune``'s candidate path (``candidate_sets``: wgmma and mma.sync configs in
one measured set, stock Dlight beside them; ``tune_function``, the tuner's own path and defaults: the fastest candidate that
verifies against a float64 GPU reference wins), then the winner and ``torch.matmul`` timed the
same way on the same inputs, turn by turn (:func:`paired_rounds`: after :data:`SETTLE_TURNS`
untimed turns, :data:`SUSTAINED_ROUNDS` rounds of :data:`SUSTAINED_MS`, each after an untimed
run of the same side, the side timed first flipping every round; medians; inputs rotated out of
L2; kernels under the graph threshold in CUDA graphs on both sides, :data:`ROUNDS` rounds);
again in CUDA graphs; and at one clock (:func:`interleaved`).
The row gives the winner, the best of each family, the tuning wall time and the ratio to
cuBLAS. ``--check-odd`` first runs small odd shapes of every layout and dtype (correctness of
each wgmma candidate, no timing against cuBLAS).

Writes ``$OUT/bench_gemm_hopper.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
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
from fastdlight.search.candidates import tune_function  # noqa: E402
from fastdlight.search.options import TuneOptions  # noqa: E402
from fastdlight.measure.graph_timing import GRAPH_BELOW_MS, time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import function_name, time_launches, time_torch
from fastdlight.measure.workload import Workload  # noqa: E402

# name, M, N, K, dtype, layout (N: A is M×K / B is K×N; T: transposed), batch
CASES = [
    ("fp16 4096³ NT", 4096, 4096, 4096, "float16", "NT", 1),
    ("fp16 4096³ NN", 4096, 4096, 4096, "float16", "NN", 1),
    ("bf16 4096³ NT", 4096, 4096, 4096, "bfloat16", "NT", 1),
    ("llama qkv 2048×12288×4096", 2048, 12288, 4096, "float16", "NN", 1),
    ("llama o 2048×4096×4096", 2048, 4096, 4096, "float16", "NN", 1),
    ("llama up 2048×11008×4096", 2048, 11008, 4096, "float16", "NN", 1),
    ("llama down 2048×4096×11008", 2048, 4096, 11008, "float16", "NN", 1),
    ("llama up 4096×11008×4096", 4096, 11008, 4096, "float16", "NN", 1),
    ("llama down 4096×4096×11008", 4096, 4096, 11008, "float16", "NN", 1),
    ("odd 3000×5120×1000", 3000, 5120, 1000, "float16", "NT", 1),
    ("odd 4000³", 4000, 4000, 4000, "float16", "NT", 1),
    ("aligned 3072×5120×1024", 3072, 5120, 1024, "float16", "NT", 1),  # the odd shape, tile-aligned
    # the odd shape with one side aligned: M (tiles) or K (row stride 2000 bytes, not 128-aligned)
    ("odd M 3000×5120×1024", 3000, 5120, 1024, "float16", "NT", 1),
    ("odd K 3072×5120×1000", 3072, 5120, 1000, "float16", "NT", 1),
    ("odd NN 3000×5120×1000", 3000, 5120, 1000, "float16", "NN", 1),
    ("batched 64×512×512×128", 512, 512, 128, "float16", "NN", 64),
    # decode: X[M, K] · W[N, K]ᵀ with M = 1 and 16 (the weights, 32-88 MB, rotated out of L2)
    ("decode 1×4096×4096", 1, 4096, 4096, "float16", "NT", 1),
    ("decode 16×4096×4096", 16, 4096, 4096, "float16", "NT", 1),
    ("decode 1×11008×4096", 1, 11008, 4096, "float16", "NT", 1),
    ("decode 16×11008×4096", 16, 11008, 4096, "float16", "NT", 1),
    ("decode 1×4096×11008", 1, 4096, 11008, "float16", "NT", 1),
    ("decode 16×4096×11008", 16, 4096, 11008, "float16", "NT", 1),
    ("fp16 8192³ NT", 8192, 8192, 8192, "float16", "NT", 1),
    ("bf16 8192³ NN", 8192, 8192, 8192, "bfloat16", "NN", 1),
]

#: timing rounds of the winner and cuBLAS in CUDA graphs (:func:`paired_rounds`), the side timed
#: first flipping every round: a GPU's clock drifts as it heats (in five fixed-order rounds on an
#: H100 the last two ran 10-25% slower on both sides)
ROUNDS = 10
#: rounds at each side's own clock (queued launches, kernels of 50 µs and more): each timing of
#: SUSTAINED_MS after SUSTAINED_HEAT_MS of the same side untimed. A hot H100's clock swings by
#: 10-15% over about a second (``bench_sustained --transient``): 100 ms timings landed on its
#: peaks and troughs by their place in the run (in every large case the second round's ratio
#: to cuBLAS fell to 0.78-0.89, or the first's 2-10% after the settling turns; H100 80GB HBM3,
#: 2026-11-26); a 700 ms run of one side averages most of a swing
SUSTAINED_ROUNDS = 4
SUSTAINED_MS = 700.0
SUSTAINED_HEAT_MS = 300.0
#: untimed turns of 100 ms of each side, alternately, before the first round: the rounds follow
#: the tuning, on a cool GPU whose clock dips hardest about 0.6-1 s into a sustained load
SETTLE_TURNS = 8

ODD = [(m, n, k, dt, lay, b) for (m, n, k) in [(200, 136, 72), (1000, 520, 264)]
       for dt in ("float16", "bfloat16") for lay in ("NT", "NN", "TN", "TT") for b in (1,)] + [
    (136, 256, 200, "float16", "NN", 3), (264, 200, 128, "bfloat16", "NT", 2)]


def matmul_func(m, n, k, dtype, layout, batch=1):
    pre = (batch,) if batch > 1 else ()
    A = te.placeholder(pre + ((k, m) if layout[0] == "T" else (m, k)), dtype, name="A")
    B = te.placeholder(pre + ((n, k) if layout[1] == "T" else (k, n)), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")

    def at(X, b, row, kk, trans):
        idx = (kk, row) if trans else (row, kk)
        return X[b + idx]

    C = te.compute(pre + (m, n), lambda *ax: te.sum(
        at(A, ax[:-2], ax[-2], r, layout[0] == "T").astype("float32")
        * at(B, ax[:-2], ax[-1], r, layout[1] == "N").astype("float32"), axis=r), name="C")
    D = te.compute(pre + (m, n), lambda *ax: C[ax].astype(dtype), name="D")
    return te.create_prim_func([A, B, D]).with_attr("global_symbol", "gemm")


def torch_operands(args, layout):
    """torch views of a GEMM's first two arguments (device tensors), as ``layout`` stores them."""
    import torch

    a, b = (torch.from_dlpack(x) for x in args[:2])
    return (a.transpose(-1, -2) if layout[0] == "T" else a), (b.transpose(-1, -2) if layout[1] == "T" else b)


def torch_matmuls(arg_sets, layout):
    """One ``torch.matmul`` call a set of a kernel's rotated inputs: cuBLAS reads the same values."""
    import torch

    return [lambda a=a, b=b: torch.matmul(a, b) for a, b in (torch_operands(args, layout) for args in arg_sets)]


def tune(func, arch, topk, check="all"):
    """The tuner's own path (``tune_function``: policies in order, stock Dlight measured beside,
    the winner checked against the function's own float64 twin)."""
    t0 = time.perf_counter()
    tuned = tune_function(func, arch, topk, TuneOptions(check=check, progress=False))
    return list(tuned.results), tuned.best, time.perf_counter() - t0


def family_best(results, kind):
    rows = [r for r in results if r.config.kind == kind and r.latency_ms is not None and r.verified is not False]
    return min(rows, key=lambda r: r.latency_ms, default=None)


def run_case(name, m, n, k, dtype, layout, batch, arch, topk, budget_ms, log):
    func = matmul_func(m, n, k, dtype, layout, batch)
    results, best, tune_s = tune(func, arch, topk, check="winner")
    for r in results:
        log(f"    {r.config}  {r.latency_ms if r.latency_ms is not None else '-'} ms regs={r.registers} "
            f"verified={r.verified} {r.error or ''}")
    wl = Workload(best._func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    fns = torch_matmuls(arg_sets, layout)
    launch = best.module[function_name(best.module, best._func)]
    short = min(best.latency_ms, time_torch(fns, budget_ms).median_ms) < GRAPH_BELOW_MS
    method = "CUDA graphs" if short else "queued launches"
    # in CUDA graphs: what a model (replayed as a graph) sees, without the host's cost per call
    # (ours encodes three TMA descriptors on the host at every call)
    graphed = (lambda ms: time_graph(launch, arg_sets, wl.dev, ms, best.latency_ms).median_ms,
               lambda ms: time_torch_graph(fns, ms, best.latency_ms).median_ms)
    queued = (lambda ms: time_launches(launch, arg_sets, wl.dev, ms).median_ms,
              lambda ms: time_torch(fns, ms).median_ms)
    # queued launches of a short kernel would time the host's launch cost: graphs only there
    if short:
        ours_rounds, cublas_rounds = paired_rounds(*graphed, timed_ms=budget_ms)
        graph_rounds, cublas_graph_rounds = ours_rounds, cublas_rounds
        same_clock = None
    else:
        ours_rounds, cublas_rounds = paired_rounds(*queued, SUSTAINED_ROUNDS, SUSTAINED_MS, SUSTAINED_HEAT_MS,
                                                   settle=SETTLE_TURNS)
        same_clock = interleaved(cycle(launch, arg_sets), cycle(lambda fn: fn(), [[f] for f in fns]), INTERLEAVED_MS)
        graph_rounds, cublas_graph_rounds = paired_rounds(*graphed, timed_ms=budget_ms, heat_ms=budget_ms)
    ours, cublas = float(np.median(ours_rounds)), float(np.median(cublas_rounds))
    graph_ms, cublas_graph_ms = float(np.median(graph_rounds)), float(np.median(cublas_graph_rounds))
    flops = 2.0 * batch * m * n * k
    fam = {kind: family_best(results, kind) for kind in ("matmul_wgmma", "matmul_tc", "dlight", "gemv")}
    bad = [r for r in results if r.config.kind == "matmul_wgmma" and (r.error or r.verified is False)]
    return {
        "case": name, "M": m, "N": n, "K": k, "batch": batch, "dtype": dtype, "layout": layout,
        "best_config": repr(best.config), "ms": ours, "tflops": flops / ours / 1e9, "cublas_ms": cublas,
        "cublas_tflops": flops / cublas / 1e9, "ratio": cublas / ours, "method": method, "tune_s": round(tune_s, 1),
        "family_ms": {k_: (r.latency_ms if r else None) for k_, r in fam.items()},
        "ms_rounds": ours_rounds, "cublas_ms_rounds": cublas_rounds,
        "round_ratios": [c / o for o, c in zip(ours_rounds, cublas_rounds)],
        "graph_ms": graph_ms, "cublas_graph_ms": cublas_graph_ms, "graph_ratio": cublas_graph_ms / graph_ms,
        "graph_ms_rounds": graph_rounds, "cublas_graph_ms_rounds": cublas_graph_rounds,
        "graph_round_ratios": [c / o for o, c in zip(graph_rounds, cublas_graph_rounds)],
        **({} if same_clock is None else {
            "same_clock_ms": float(np.median(same_clock[0])), "cublas_same_clock_ms": float(np.median(same_clock[1])),
            "same_clock_ratios": [c / o for o, c in zip(*same_clock)]}),
        "wgmma_failed": [f"{r.config}: {r.error or r.check_message}" for r in bad][:4],
        "candidates": len(results),
    }  # fmt: skip


#: milliseconds of samples per side in :func:`interleaved`
INTERLEAVED_MS = 400.0


def cycle(launch, arg_sets):
    """One launch per call, cycling through the rotated argument sets."""
    state = {"i": 0}

    def once():
        launch(*arg_sets[state["i"] % len(arg_sets)])
        state["i"] += 1

    return once


def interleaved(ours, theirs, budget_ms: float, batch: int = 25) -> tuple[list[float], list[float]]:
    """Milliseconds per launch of each side, from samples taken alternately in one queue: a
    sample of ours (back-to-back launches between two CUDA events), then one of theirs, the
    pair's order flipping every time, ``batch`` pairs queued before the host waits. Both sides
    run at one clock, set by their power draw together: a second view beside
    :func:`paired_rounds`, whose sides each run at their own (an H100's drifts by 10-25% over
    seconds). ``ours``/``theirs``: one launch per call."""
    from fastdlight.measure.cuda_events import Event
    from fastdlight.measure.timing import MIN_SAMPLE_MS

    def per_launch(f, k=8):
        f()
        start, end = Event(), Event()
        start.record()
        for _ in range(k):
            f()
        end.record()
        end.synchronize()
        return start.elapsed_ms(end) / k

    est = max(per_launch(ours), per_launch(theirs), 1e-3)
    number = max(1, math.ceil(MIN_SAMPLE_MS / est))
    pairs = max(20, math.ceil(budget_ms / (number * est)))
    events = [(Event(), Event()) for _ in range(2 * batch)]
    a, b = [], []
    for first in range(0, pairs, batch):
        taken = []
        for i in range(first, min(pairs, first + batch)):
            for side in ((ours, theirs) if i % 2 == 0 else (theirs, ours)):
                start, end = events[len(taken)]
                start.record()
                for _ in range(number):
                    side()
                end.record()
                taken.append((side is ours, start, end))
        taken[-1][2].synchronize()
        for mine, start, end in taken:
            (a if mine else b).append(start.elapsed_ms(end) / number)
    return a, b


def paired_rounds(ours, theirs, rounds: int = ROUNDS, timed_ms: float = 100.0, heat_ms: float = 0.0,
                  settle: int = 0, settle_ms: float = 100.0) -> tuple[list[float], list[float]]:
    """``rounds`` timings of each side (``ours(ms)`` and ``theirs(ms)`` run that long and return
    the median ms a launch), alternately, the side timed first flipping every round. ``heat_ms``:
    each timing follows an untimed run of the same side, so that a side runs at the clock its
    own power draw leaves (as the tuner's finalists do, ``stages.OWN_HEAT_MS``), not the one the
    other side left. ``settle``: that many untimed turns of ``settle_ms`` of each side,
    alternately, first (:data:`SETTLE_TURNS`)."""
    for _ in range(settle):
        ours(settle_ms)
        theirs(settle_ms)
    a, b = [], []
    for i in range(rounds):
        for side, out in ((ours, a), (theirs, b)) if i % 2 == 0 else ((theirs, b), (ours, a)):
            if heat_ms:
                side(heat_ms)
            out.append(side(timed_ms))
    return a, b


def check_odd(arch, log) -> list[dict]:
    rows = []
    for m, n, k, dtype, layout, batch in ODD:
        func = matmul_func(m, n, k, dtype, layout, batch)
        name = f"{dtype} {layout} b{batch} {m}×{n}×{k}"
        try:
            results, best, _ = tune(func, arch, 6)
            wg = [r for r in results if r.config.kind == "matmul_wgmma"]
            ok = [r for r in wg if r.verified]
            rows.append({"case": name, "wgmma": len(wg), "verified": len(ok), "winner": repr(best.config),
                         "failures": [f"{r.config}: {r.error or r.check_message}" for r in wg if not r.verified][:3]})
        except Exception as e:  # noqa: BLE001
            rows.append({"case": name, "error": f"{type(e).__name__}: {e}"[:500]})
        log(json.dumps(rows[-1]))
    return rows


def _spread(ratios) -> str:
    if not ratios:
        return ""
    lo, hi = np.percentile(ratios, [10, 90])
    return f"({lo:.2f}–{hi:.2f})"


def _same_clock(r) -> str:
    if "same_clock_ms" not in r:
        return "–"
    return f"{r['cublas_same_clock_ms'] / r['same_clock_ms']:.2f}× {_spread(r['same_clock_ratios'])}"


def markdown(rows, device) -> str:
    lines = [
        f"Device: {device}. fastdlight's tuner (wgmma + mma.sync + stock Dlight candidates, the fastest "
        "verified one wins) vs cuBLAS (torch.matmul, fp32 accumulation): winner and cuBLAS timed turn by "
        f"turn in {SUSTAINED_ROUNDS} rounds of {SUSTAINED_MS:.0f} ms a side, each after {SUSTAINED_HEAT_MS:.0f} ms "
        f"of the same side untimed (its own clock), the side timed first flipping every round, after "
        f"{SETTLE_TURNS} untimed turns of 100 ms of each side (kernels under 50 µs: in CUDA graphs, {ROUNDS} rounds "
        f"of 100 ms without the untimed parts); in CUDA graphs: {ROUNDS} rounds of 100 ms, each after 100 ms "
        "untimed; at one clock: "
        f"samples of about 0.5 ms taken in turns, {INTERLEAVED_MS:.0f} ms a side. CUDA events, inputs rotated out "
        "of L2. Medians, and in brackets the 10th and 90th percentile of the ratio of one turn's pair.",
        "",
        "| case | winner | ms | TFLOPS | cuBLAS ms | cuBLAS TFLOPS | ratio | in CUDA graphs: ms / cuBLAS ms / ratio "
        "| at one clock: ratio | best wgmma / mma.sync / stock / GEMV ms (tuning) | tune s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | FAILED: {r['error'][:100]} | | | | | | | | | |")
            continue
        fam = " / ".join(f"{v:.4f}" if v else "–" for v in r["family_ms"].values())
        lines.append(f"| {r['case']} | {r['best_config']} | {r['ms']:.4f} | {r['tflops']:.0f} | {r['cublas_ms']:.4f} | "
                     f"{r['cublas_tflops']:.0f} | {r['ratio']:.2f}× {_spread(r.get('round_ratios'))} | "
                     f"{r['graph_ms']:.4f} / {r['cublas_graph_ms']:.4f} / {r['graph_ratio']:.2f}× "
                     f"{_spread(r.get('graph_round_ratios'))} | {_same_clock(r)} | {fam} | {r['tune_s']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--only", nargs="*", help="substrings of case names to run")
    parser.add_argument("--check-odd", action="store_true")
    parser.add_argument("--no-cases", action="store_true")
    args = parser.parse_args(argv)
    out_dir, log = open_log("bench_gemm_hopper")
    torch_fp32_accumulation()
    arch = auto_arch()
    device = f"{tvm.cuda(0).device_name} ({arch.arch}, {arch.sm_count} SMs)"
    log(f"device: {device}")
    report = {"device": device, "odd": check_odd(arch, log) if args.check_odd else [], "rows": []}
    for case in [] if args.no_cases else CASES:
        if args.only and not any(s in case[0] for s in args.only):
            continue
        log(f"== {case[0]}")
        try:
            row = run_case(*case, arch, args.topk, args.budget_ms, log)
        except Exception as e:  # noqa: BLE001 - report and go on with the next case
            row = {"case": case[0], "error": f"{type(e).__name__}: {e}"}
            log(traceback.format_exc())
        report["rows"].append(row)
        log(json.dumps(row))
        with open(os.path.join(out_dir, "bench_gemm_hopper.json"), "w") as f:
            json.dump(report, f, indent=1)
    table = markdown(report["rows"], device)
    log(table)
    with open(os.path.join(out_dir, "bench_gemm_hopper.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(out_dir, "bench_gemm_hopper.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
