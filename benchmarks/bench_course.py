"""The classic hand-written GPU schedules of the machine-learning-compilation course (MLC,
"GPU acceleration" chapter) against fastdlight, stock Dlight, MetaSchedule and torch.

    python benchmarks/bench_course.py [--n 1024] [--window-n 16777216] [--topk 20] [--ms-trials 64]
        [--ms-timeout 150] [--deadline SEC] [--skip-ms] [--skip-fastdlight] [--out DIR] [--dry-run]

Two workloads, each written once as a TVMScript PrimFunc (``@T.prim_func(s_tir=True)``):

* ``gemm``: C = A @ B, fp32, n×n×n (default 1024³);
* ``window``: B[i] = A[i] + A[i+1] + A[i+2], fp32, A of n + 2 elements (default n = 2^24).

Hand schedules (``tvm.s_tir.Schedule``, :data:`HAND`): GEMM naive (one thread per output,
block/thread binding only), shared-memory tiling (``cache_read`` to shared at the k-tile loop,
cooperative fetch, one output per thread accumulated in a register), register tiling
(each thread an 8×8 or 4×4 micro-tile in local accumulators: the course's "local blocking",
then with shared-memory tiles and float4 cooperative fetch, as the course does, and a 128×128
tile); window sum naive and with the course's shared-memory cache.

Against: ``fastdlight.tune(func, topk=...)`` (tuning wall time reported), stock Dlight
(``ApplyDefaultSchedule(Matmul, GEMV, Reduction, GeneralReduction, Fallback)`` under the
target), MetaSchedule (``tune_tir`` on one IRModule holding both workloads, one task each:
evolutionary search, ``cost_model="random"`` (no xgboost on the GPU machine), ``--ms-trials``
trials per task in one round, ``LocalBuilder(timeout_sec=120)``: with the default 30 s a fresh
build worker's first ``import tvm.s_tir.tensor_intrin`` fails every build; run in a child
process killed after ``--ms-timeout`` seconds, or sooner to end the run by ``--deadline``; the
best record of its database is applied with ``compile_tir``; a row says why when it has none),
and torch (``torch.matmul``, TF32 off; ``a[:-2] + a[1:-1] + a[2:]`` for the window sum).

Every kernel is checked against a float64 numpy reference (output NaN-poisoned first) and
timed the same way in the same run (``fastdlight.measure.timing``: warm-up, inputs rotated
through enough copies that none is in L2, launches queued between CUDA events, median over
``--budget-ms``); when a workload's fastest kernel is under 50 µs, all of its kernels are timed
again inside CUDA graphs (``fastdlight.measure.graph_timing``, torch through
``torch.cuda.CUDAGraph``). torch is timed first and once more at the end (its spread).

Writes ``bench_course.md``, ``bench_course.json`` and ``bench_course.log`` to ``--out``
(default ``$OUT`` when set, else ``./bench_course_out``). ``--dry-run`` (no GPU needed)
schedules and compiles every variant to a cubin (nvcc; registers, shared memory, spills),
runs fastdlight compile-only and builds one sampled MetaSchedule sketch; nothing is timed.

Measured 2026-11-25 on an NVIDIA H100 80GB HBM3 (benchmarks/results/course_h100.json), 1024³
fp32 GEMM in TFLOPS: cuBLAS 36.0 (35.5 at the end of the run); hand naive 5.1, shared-memory
tiling 8.7, register 8×8 without shared memory 5.7, register 8×8 + shared (the course's) 12.5,
4×4 + shared 24.8, 8×8 + shared 128×128 9.5; stock Dlight 17.9; MetaSchedule (64 trials) 17.0;
fastdlight 32.8 (0.91× cuBLAS, tuned in 8 s). Window sum n = 2^24 in GB/s (CUDA graphs): torch
1165 (two kernels and a temporary), hand naive 2296, shared 2173, stock Dlight 2005,
MetaSchedule 2591 (its search space held one schedule), fastdlight 2930.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(HERE), HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import tvm  # noqa: E402

from course_kernels import Bench, Kernel, build_kernel, cubin_report, fastdlight_kernel  # noqa: E402
from course_metaschedule import ms_reason, ms_result, ms_run, ms_sketch  # noqa: E402
from course_schedules import hand_variants, make_func  # noqa: E402

#: the compile-only target (sm_90a code, as fastdlight's H100 model)
DRY_TARGET = "nvidia/nvidia-h100"
#: seconds kept after MetaSchedule under ``--deadline``: build, check and time its kernels, torch again
MS_RESERVE_S = 15.0


# -- the comparison sides ----------------------------------------------------------------------
def dlight_schedule(func, target):
    """Stock Dlight, the rules the issue names, applied under ``target``."""
    from tvm.s_tir import dlight as dl

    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                      dl.gpu.Fallback())(tvm.IRModule({"main": func}))
    return mod


# -- report ------------------------------------------------------------------------------------
SIDE_NAMES = {"hand": "hand", "fastdlight": "fastdlight", "dlight": "stock Dlight", "metaschedule": "MetaSchedule",
              "torch": "torch"}


def row_of(k: Kernel, bench: Bench | None, torch_ms: float | None) -> dict:
    r = {"workload": k.workload, "side": k.side, "variant": k.variant, "notes": k.notes, "error": k.error,
         "tune_s": k.tune_s, "cubin": k.cubin, **{kk: v for kk, v in k.result.items() if kk != "schedule"}}
    ms = k.result.get("ms")
    if bench is not None and ms:
        r["perf"], r["unit"] = bench.perf(ms), bench.unit
        if torch_ms:
            r["vs_torch"] = torch_ms / ms
    return r


def markdown(rows: list[dict], header: str, descs: dict[str, str]) -> str:
    lines = [header, "",
             "| kernel | variant | time ms | TFLOPS / GB/s | × torch | timed as | check | notes |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        name = f"{descs[r['workload']]}: {SIDE_NAMES[r['side']]}"
        ms = r.get("ms")
        perf = f"{r['perf']:.1f} {r['unit']}" if r.get("perf") else "–"
        ratio = f"{r['vs_torch']:.2f}×" if r.get("vs_torch") else "–"
        if "verified" in r:
            check = ("ok" if r["verified"] else "WRONG") + f" ({r['rel_err']:.1e})"
        elif r.get("cubin") and "registers" in r["cubin"]:
            check = "built"
        else:
            check = "–"
        notes = []
        if r.get("tune_s") is not None:
            notes.append(f"tuned in {r['tune_s']:g} s")
        if r.get("notes"):
            notes.append(r["notes"])
        if r.get("cubin") and "registers" in r["cubin"]:
            c = r["cubin"]
            spill = f", {c['spill_bytes']} B spill" if c["spill_bytes"] else ""
            notes.append(f"{c['registers']} regs, {c['shared_bytes']} B smem{spill}")
        if r.get("error"):
            notes.append(f"**{r['error']}**")
        if r.get("graph_error"):
            notes.append(f"graph timing failed: {r['graph_error']}")
        time_s = f"{ms:.4f}" if ms else ("–" if not r.get("error") else "no kernel")
        cell = " ; ".join(notes).replace("|", "/")
        method = r.get("method", "–")
        lines.append(f"| {name} | {r['variant']} | {time_s} | {perf} | {ratio} | {method} | {check} | {cell} |")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--n", type=int, default=1024, help="GEMM size n (n×n×n)")
    parser.add_argument("--window-n", type=int, default=1 << 24, help="window-sum outputs")
    parser.add_argument("--workloads", default="gemm,window")
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--ms-trials", type=int, default=64)
    parser.add_argument("--ms-timeout", type=float, default=150.0, help="seconds before MetaSchedule is killed")
    parser.add_argument("--deadline", type=float, help="seconds the whole run may take: MetaSchedule is cut to fit")
    parser.add_argument("--skip-ms", action="store_true")
    parser.add_argument("--skip-fastdlight", action="store_true")
    parser.add_argument("--out", help="output directory (default: $OUT, else ./bench_course_out)")
    parser.add_argument("--dry-run", action="store_true", help="build every variant; time nothing (no GPU needed)")
    args = parser.parse_args(argv)
    args.out = args.out or os.environ.get("OUT") or "bench_course_out"
    return args


@dataclass
class Run:
    """What every phase of a run shares: its arguments, target, workloads and kernels, the log."""

    args: argparse.Namespace
    gpu: bool
    arch: object
    device: str
    stamp: str
    torch: object  # the module, or None on a dry run
    log: Callable[[str], None]
    t_start: float = field(default_factory=time.perf_counter)
    kernels: dict[str, list[Kernel]] = field(default_factory=dict)
    funcs: dict = field(default_factory=dict)
    benches: dict[str, Bench] = field(default_factory=dict)

    @property
    def target(self):
        return self.arch.target

    @property
    def workloads(self) -> list[str]:
        return list(self.kernels)

    def sizes(self) -> dict[str, int]:
        return {"gemm": self.args.n, "window": self.args.window_n}


def schedule_hand_and_dlight(run: Run) -> None:
    """Every hand schedule and stock Dlight of each workload, scheduled, built and put through nvcc."""
    for w, kernels in run.kernels.items():
        for h in hand_variants(w):
            k = Kernel(w, "hand", h.label)
            try:
                k.mod = h.schedule(run.funcs[w]).mod
            except Exception as e:  # noqa: BLE001
                k.error = f"schedule: {type(e).__name__}: {e}"
            kernels.append(k)
        k = Kernel(w, "dlight", "ApplyDefaultSchedule(Matmul, GEMV, Reduction, GeneralReduction, Fallback)")
        try:
            k.mod = dlight_schedule(run.funcs[w], run.target)
        except Exception as e:  # noqa: BLE001
            k.error = f"schedule: {type(e).__name__}: {e}"
        kernels.append(k)
    every = [k for ks in run.kernels.values() for k in ks]
    for k in every:
        build_kernel(k, run.target, run.log)
    cubin_report(every, run.target, run.log, fatal=not run.gpu)  # registers, smem, spills
    run.log(f"  hand + Dlight built in {time.perf_counter() - run.t_start:.0f} s")


def time_on_gpu(run: Run, write) -> None:
    """Check and time everything built so far, torch first; in CUDA graphs too where a
    workload's fastest kernel is under 50 µs."""
    for w, kernels in run.kernels.items():
        bench = run.benches[w] = Bench(w, run.sizes()[w], run.arch, run.args.budget_ms)
        kernels.insert(0, Kernel(w, "torch", "torch.matmul (cuBLAS, TF32 off)" if w == "gemm"
                                 else "a[:-2] + a[1:-1] + a[2:]"))
        for k in kernels:
            bench.measure(k, run.log, graphs=False)
        fastest = min((k.result["ms"] for k in kernels if "ms" in k.result), default=None)
        if fastest is not None and fastest < 0.05:
            bench.method = "CUDA graphs"
            for k in kernels:
                if "ms" in k.result:
                    bench.retime_in_graph(k)
        write(False)


def metaschedule_side(run: Run) -> None:
    """MetaSchedule, last (its child process has the GPU to itself); on a dry run one sampled
    sketch per workload, built."""
    args = run.args
    ms_kernels = {}
    for w, kernels in run.kernels.items():
        ms_kernels[w] = Kernel(w, "metaschedule", f"tune_tir: {args.ms_trials} trials, evolutionary, cost_model=random")
        kernels.append(ms_kernels[w])
    try:
        if run.gpu:
            timeout = args.ms_timeout
            if args.deadline:  # leave time to build, check and time its kernels, and torch again
                timeout = min(timeout, args.deadline - (time.perf_counter() - run.t_start) - MS_RESERVE_S)
            info = ms_run(run.workloads, args, run.target, timeout, run.log)
        for w, k in ms_kernels.items():
            if run.gpu:
                _metaschedule_kernel(run, k, ms_result(info, w, run.funcs[w], run.target))
            else:
                t0 = time.perf_counter()
                k.mod, n_sketch, tries = ms_sketch(run.funcs[w], run.target)
                k.variant = f"one sampled sketch of {n_sketch} (dry run: no search)"
                k.notes = f"sampled in {time.perf_counter() - t0:.0f} s, {tries} draw(s) to pass the postprocessors"
                build_kernel(k, run.target, run.log)
                cubin_report([k], run.target, run.log)
    except Exception as e:  # noqa: BLE001
        for k in ms_kernels.values():
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            k.error = k.error or f"{type(e).__name__}: {first}"[:400]
        run.log(traceback.format_exc())


def _metaschedule_kernel(run: Run, k: Kernel, res: dict) -> None:
    """``k`` from MetaSchedule's result for its workload: built, checked and timed, or why not."""
    k.tune_s = res["tune_s"]
    k.result.update({kk: v for kk, v in res.items() if kk != "schedule"})
    if res["schedule"] is None:
        k.error = "no valid kernel: " + ms_reason(res)
        return
    own = res.get("ms_best_ms")
    k.mod = res["schedule"]
    k.notes = ms_reason(res) + (f"; its runner's best {own:.4f} ms" if own else "")
    build_kernel(k, run.target, run.log)
    cubin_report([k], run.target, run.log, fatal=False)
    run.benches[k.workload].measure(k, run.log)


def writer(run: Run, descs: dict[str, str]):
    """``write(final)``: the JSON and markdown of what the run has so far (``final``: also logged)."""
    torch, args = run.torch, run.args
    report = {"device": run.device, "date": run.stamp, "tvm": tvm.__version__,
              "torch": torch.__version__ if torch else None, "args": vars(args), "target": str(run.target), "rows": []}
    header = (f"**{run.device}**, {run.stamp}, TVM {tvm.__version__}" + (f", torch {torch.__version__}" if torch else "")
              + (". Every kernel checked against float64 numpy and timed the same way: inputs rotated out of "
                 f"L2, launches queued between CUDA events, median over {args.budget_ms:g} ms; a workload whose "
                 "fastest kernel is under 50 µs is timed in CUDA graphs on every side. "
                 "× torch = torch's time / this time."
                 if run.gpu else ". Dry run: every variant scheduled and compiled to a cubin; nothing timed."))

    def write(final: bool) -> None:
        rows = []
        for w, kernels in run.kernels.items():
            torch_ms = next((k.result.get("ms") for k in kernels if k.side == "torch"), None)  # the first
            rows += [row_of(k, run.benches.get(w), torch_ms) for k in kernels]
        report["rows"], report["total_s"] = rows, round(time.perf_counter() - run.t_start, 1)
        table = markdown(rows, header, descs)
        with open(os.path.join(args.out, "bench_course.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(args.out, "bench_course.md"), "w") as f:
            f.write(table + "\n")
        if final:
            run.log("\n" + table)

    return write


def start(args) -> Run | None:
    """The run's log, target and device line; None (said in the log) where it cannot run."""
    os.makedirs(args.out, exist_ok=True)
    log_file = open(os.path.join(args.out, "bench_course.log"), "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    from fastdlight.arch import CUDA, auto_arch, has_gpu

    gpu = has_gpu() and not args.dry_run
    if not gpu and not args.dry_run:
        log("bench_course: no GPU found; use --dry-run for the compile-only check")
        return None
    arch = auto_arch() if gpu else CUDA(DRY_TARGET)
    torch = None
    if gpu:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in true fp32, as every other side
        torch.backends.cudnn.allow_tf32 = False
    device = (f"{tvm.cuda(0).device_name} ({arch.arch}, {arch.sm_count} SMs)" if gpu
              else f"compile-only for {DRY_TARGET} ({arch.arch})")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    log(f"== bench_course {stamp}: device {device}; TVM {tvm.__version__}"
        + (f", torch {torch.__version__}" if torch else "") + f"; {os.cpu_count()} CPUs; args {vars(args)}")
    return Run(args, gpu, arch, device, stamp, torch, log)


def main(argv=None) -> int:
    args = parse_args(argv)
    run = start(args)
    if run is None:
        return 2
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    run.kernels = {w: [] for w in workloads}
    run.funcs = {w: make_func(w, run.sizes()[w]) for w in workloads}
    write = writer(run, {"gemm": f"GEMM fp32 {args.n}³", "window": f"window sum fp32 n={args.window_n}"})
    schedule_hand_and_dlight(run)
    if not args.skip_fastdlight:
        for w in workloads:
            run.kernels[w].append(fastdlight_kernel(w, run.funcs[w], run.arch if run.gpu else DRY_TARGET, args.topk,
                                                    run.log))
    if run.gpu:
        time_on_gpu(run, write)
    else:
        write(False)
    if not args.skip_ms:
        metaschedule_side(run)
        write(False)
    if run.gpu:  # torch once more: its spread over the run
        for w in workloads:
            tk = Kernel(w, "torch", "torch again (run-to-run spread)")
            run.kernels[w].append(tk)
            run.benches[w].measure(tk, run.log)
    write(True)
    run.log(f"total {time.perf_counter() - run.t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
