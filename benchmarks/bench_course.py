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
timed the same way in the same run (``fastdlight.tune.measure``: warm-up, inputs rotated
through enough copies that none is in L2, launches queued between CUDA events, median over
``--budget-ms``); when a workload's fastest kernel is under 50 µs, all of its kernels are timed
again inside CUDA graphs (``fastdlight.tune.graph_timing``, torch through
``torch.cuda.CUDAGraph``). torch is timed first and once more at the end (its spread).

Writes ``bench_course.md``, ``bench_course.json`` and ``bench_course.log`` to ``--out``
(default ``$OUT`` when set, else ``./bench_course_out``). ``--dry-run`` (no GPU needed)
schedules and compiles every variant to a cubin (nvcc; registers, shared memory, spills),
runs fastdlight compile-only and builds one sampled MetaSchedule sketch; nothing is timed.

Measured 2026-11-25 on an NVIDIA H100 80GB HBM3 (docs/results/course_h100_2026-11-25/), 1024³
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
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import s_tir  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

#: the compile-only target (sm_90a code, as fastdlight's H100 model)
DRY_TARGET = "nvidia/nvidia-h100"
#: relative-norm tolerances of the float64 check
TOL = {"gemm": 1e-5, "window": 1e-6}
#: MetaSchedule's LocalBuilder timeout per candidate: its default (30 s) is spent by a fresh build
#: worker's first ``import tvm.s_tir.tensor_intrin`` (~20 s on 2 cores), failing every build
MS_BUILD_TIMEOUT_S = 120.0
#: MetaSchedule's per-task log in its work dir (the trials' errors are there)
MS_TASK_LOG = "*.task_[0-9]*_{}.log"


# -- the workloads, in TVMScript ---------------------------------------------------------------
def gemm_func(n: int):
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((n, n), "float32"), B: T.Buffer((n, n), "float32"), C: T.Buffer((n, n), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i, j, k in T.grid(n, n, n):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    return main.with_attr("global_symbol", "main")


def window_func(n: int):
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((n + 2,), "float32"), B: T.Buffer((n,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(n):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] + A[vi + 1] + A[vi + 2]

    return main.with_attr("global_symbol", "main")


def make_func(workload: str, n: int):
    return {"gemm": gemm_func, "window": window_func}[workload](n)


def _divides(n: int, *tiles: int) -> None:
    for t in tiles:
        if n % t:
            raise ValueError(f"size {n} is not a multiple of the tile {t}")


# -- hand schedules: GEMM ----------------------------------------------------------------------
def _gemm_extent(sch) -> int:
    return int(sch.get(sch.get_loops(sch.get_sblock("C"))[0]).extent)


def gemm_naive(func, ty: int = 16, tx: int = 16):
    """One thread per output element; a (ty, tx) thread block; k runs serially in the thread,
    accumulating into C in global memory (the bindings are the whole schedule)."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), ty, tx)
    blk = sch.get_sblock("C")
    i, j, k = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, ty])
    j0, j1 = sch.split(j, [None, tx])
    sch.reorder(i0, j0, i1, j1, k)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j1, "threadIdx.x")
    return sch


def cooperative_fetch(sch, block, read_idx: int, loop, nthread: int, vec: int = 1):
    """The course's ``cache_read_and_coop_fetch``: the ``read_idx``-th input of ``block`` is
    staged in shared memory at ``loop``, its copy loops fused and split over the block's threads
    (``vec`` elements per thread per step, vectorized)."""
    cache = sch.cache_read(block, read_idx, "shared")
    sch.compute_at(cache, loop)
    inner = sch.fuse(*sch.get_loops(cache)[-2:])
    if vec > 1:
        _, tx, v = sch.split(inner, [None, nthread, vec])
        sch.vectorize(v)
    else:
        _, tx = sch.split(inner, [None, nthread])
    sch.bind(tx, "threadIdx.x")
    return cache


def gemm_shared(func, tile: int = 32):
    """Shared-memory tiling (the CUDA programming guide's tiled matmul): a tile×tile block of
    threads, one output each (accumulated in a register), A and B tiles of tile×tile staged in
    shared memory per k-step by all threads together."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), tile)
    blk = sch.get_sblock("C")
    c_local = sch.cache_write(blk, 0, "local")
    i, j, k = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, tile])
    j0, j1 = sch.split(j, [None, tile])
    k0, k1 = sch.split(k, [None, tile])
    sch.reorder(i0, j0, i1, j1, k0, k1)
    sch.reverse_compute_at(c_local, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "threadIdx.x")
    cooperative_fetch(sch, blk, 0, k0, tile * tile)
    cooperative_fetch(sch, blk, 1, k0, tile * tile)
    sch.decompose_reduction(blk, k0)
    return sch


def gemm_register(func, micro=(8, 8), threads=(8, 8), rstep: int = 4):
    """The course's "local blocking": each thread computes a micro[0]×micro[1] tile of C in local
    accumulators, a threads[0]×threads[1] block of threads, operands read straight from global
    memory (L1/L2), the k-step of ``rstep`` unrolled."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), micro[0] * threads[0], micro[1] * threads[1], rstep)
    blk = sch.get_sblock("C")
    c_local = sch.cache_write(blk, 0, "local")
    i, j, k = sch.get_loops(blk)
    i0, i1, i2 = sch.split(i, [None, threads[0], micro[0]])
    j0, j1, j2 = sch.split(j, [None, threads[1], micro[1]])
    k0, k1 = sch.split(k, [None, rstep])
    sch.unroll(k1)
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.reverse_compute_at(c_local, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j1, "threadIdx.x")
    sch.decompose_reduction(blk, k0)
    return sch


def gemm_register_shared(func, micro=(8, 8), threads=(8, 8), rstep: int = 8, vec: int = 4):
    """The course's ``blocking_with_shared``: register micro-tiles as :func:`gemm_register`, and
    the block's A (bm×rstep) and B (rstep×bn) tiles staged in shared memory per k-step by a
    cooperative, ``vec``-wide vectorized fetch of all its threads."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), micro[0] * threads[0], micro[1] * threads[1], rstep)
    blk = sch.get_sblock("C")
    c_local = sch.cache_write(blk, 0, "local")
    i, j, k = sch.get_loops(blk)
    i0, i1, i2 = sch.split(i, [None, threads[0], micro[0]])
    j0, j1, j2 = sch.split(j, [None, threads[1], micro[1]])
    k0, k1 = sch.split(k, [None, rstep])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.reverse_compute_at(c_local, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "threadIdx.x")
    nthread = threads[0] * threads[1]
    cooperative_fetch(sch, blk, 0, k0, nthread, vec)
    cooperative_fetch(sch, blk, 1, k0, nthread, vec)
    sch.decompose_reduction(blk, k0)
    return sch


# -- hand schedules: window sum ----------------------------------------------------------------
def window_naive(func, nthread: int = 256):
    """One thread per output, ``nthread`` threads per block; each thread reads its three inputs
    from global memory (neighbours share them through L1)."""
    sch = s_tir.Schedule(func)
    blk = sch.get_sblock("B")
    (i,) = sch.get_loops(blk)
    _divides(int(sch.get(i).extent), nthread)
    i0, i1 = sch.split(i, [None, nthread])
    sch.bind(i0, "blockIdx.x")
    sch.bind(i1, "threadIdx.x")
    return sch


def window_shared(func, nthread: int = 256):
    """The course's example: the block's nthread + 2 inputs are staged in shared memory
    (``cache_read`` computed at the thread loop, so it covers the whole block, fetched by all its
    threads), then each thread sums three neighbours from shared memory."""
    sch = s_tir.Schedule(func)
    blk = sch.get_sblock("B")
    (i,) = sch.get_loops(blk)
    _divides(int(sch.get(i).extent), nthread)
    i0, i1 = sch.split(i, [None, nthread])
    sch.bind(i0, "blockIdx.x")
    sch.bind(i1, "threadIdx.x")
    cache = sch.cache_read(blk, 0, "shared")
    sch.compute_at(cache, i1)
    _, tx = sch.split(sch.get_loops(cache)[-1], [None, nthread])
    sch.bind(tx, "threadIdx.x")
    return sch


@dataclass(frozen=True)
class Hand:
    workload: str
    key: str
    label: str
    schedule: Callable  # func -> s_tir.Schedule


HAND = [
    Hand("gemm", "naive", "naive: 1 output/thread, 16×16 threads", gemm_naive),
    Hand("gemm", "shared", "shared-memory tiling: 32×32 tile, 1 output/thread", gemm_shared),
    Hand("gemm", "reg8x8", "register tiling 8×8/thread, 8×8 threads, no shared (course)", gemm_register),
    Hand("gemm", "reg8x8_shared", "register 8×8 + shared 64×64 tile, k 8 (course)", gemm_register_shared),
    Hand("gemm", "reg4x4_shared", "register 4×4 + shared 64×64 tile, 16×16 threads, k 16",
         lambda f: gemm_register_shared(f, micro=(4, 4), threads=(16, 16), rstep=16)),
    Hand("gemm", "reg8x8_shared128", "register 8×8 + shared 128×128 tile, 16×16 threads, k 8",
         lambda f: gemm_register_shared(f, micro=(8, 8), threads=(16, 16), rstep=8)),
    Hand("window", "naive", "naive: 1 output/thread, 256 threads", window_naive),
    Hand("window", "shared", "shared-memory window, 256 threads (course)", window_shared),
]  # fmt: skip


def hand_variants(workload: str) -> list[Hand]:
    return [h for h in HAND if h.workload == workload]


# -- the comparison sides ----------------------------------------------------------------------
def dlight_schedule(func, target):
    """Stock Dlight, the rules the issue names, applied under ``target``."""
    from tvm.s_tir import dlight as dl

    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                      dl.gpu.Fallback())(tvm.IRModule({"main": func}))
    return mod


def ms_sketch(func, target, draws: int = 400):
    """Dry run: what one MetaSchedule trial builds, without the search: a design-space sketch
    replayed with fresh random decisions (as its replay-trace strategy does) until one passes
    the postprocessors (GPU code verification included; at 1024³ about 1 draw in 25 does).
    Returns (IRModule, number of sketches, draws it took)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Trace

    ctx = ms.TuneContext(mod=func, target=target, space_generator="post-order-apply",
                         search_strategy="replay-trace", task_name="main", rand_state=1)
    spaces = ctx.generate_design_space()
    for draw in range(draws):
        sch = s_tir.Schedule(ctx.mod, seed=draw + 1)
        Trace(spaces[draw % len(spaces)].trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
        if all(p.apply(sch) for p in ctx.space_generator.postprocs):
            return sch.mod, len(spaces), draw + 1
    raise RuntimeError(f"no draw of the {len(spaces)} sketches passed the postprocessors in {draws} tries")


#: seconds kept after MetaSchedule under ``--deadline``: build, check and time its kernels, torch again
MS_RESERVE_S = 15.0
#: MetaSchedule's runner: fewer repetitions than its default (min_repeat_ms=100), to fit the
#: run; its timings only rank its candidates (the winner is timed again here, like every kernel)
MS_EVALUATOR = {"number": 3, "repeat": 1, "min_repeat_ms": 25}
#: put first on a MetaSchedule process's PYTHONPATH: tvm_ffi imports torch in every process when
#: it is installed (4-5 s on the H100 machine), and MetaSchedule starts a pool of build workers
#: for every batch; none of them uses torch (cf. fastdlight.tune.workers._block_torch)
_NO_TORCH_SITECUSTOMIZE = """import os, sys
sys.modules.setdefault("torch", None)
_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:  # chain to the sitecustomize this one shadows, if any
    _f = os.path.join(_p or ".", "sitecustomize.py")
    if os.path.abspath(_p or ".") != _here and os.path.isfile(_f):
        exec(compile(open(_f).read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
"""


def ms_named(workload: str, func):
    """The function as MetaSchedule tunes it: one task per workload, named by its symbol."""
    return func.with_attr("global_symbol", workload)


def ms_child(args) -> int:
    """In a child process (killed from outside at its deadline): MetaSchedule's ``tune_tir`` on
    one IRModule holding every workload, so the tasks share one child and one runner pool."""
    from tvm.s_tir import meta_schedule as ms

    workloads = args.ms_child.split(",")
    sizes = {"gemm": args.n, "window": args.window_n}
    mod = tvm.IRModule({w: ms_named(w, make_func(w, sizes[w])) for w in workloads})
    target = tvm.target.Target(json.loads(args.target_json))
    ms.tir_integration.tune_tir(
        mod, target, args.ms_dir, max_trials_global=args.ms_trials * len(workloads),
        max_trials_per_task=args.ms_trials, num_trials_per_iter=min(64, args.ms_trials),
        cost_model="random", strategy="evolutionary", task_scheduler="round-robin",
        builder=ms.builder.LocalBuilder(timeout_sec=MS_BUILD_TIMEOUT_S),
        runner=ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(**MS_EVALUATOR)), seed=0,
    )  # fmt: skip
    return 0


def ms_failures(work_dir: str, workload: str = "*") -> dict[str, int]:
    """Why MetaSchedule's trials failed, from a task's log: ``{"building: <message>": count}``."""
    counts: dict[str, int] = {}
    for path in glob.glob(os.path.join(work_dir, "logs", MS_TASK_LOG.format(workload))):
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            m = re.search(r"Trial #\d+: Error in (building|running):", line)
            if not m:
                continue
            block = []  # the message: up to the failing module's TVMScript or the next log entry
            for nxt in lines[i + 1:]:
                if nxt.startswith("# from tvm.script") or re.match(r"\d{4}-\d\d-\d\d ", nxt):
                    break
                if nxt.strip():
                    block.append(nxt.strip())
            why = block[0] if block else "?"
            if len(block) > 1:  # "An exception occurred" + the exception's last line
                why += " … " + block[-1]
            key = f"{m.group(1)}: {why[:240]}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def ms_run(workloads: list[str], args, target, timeout: float, log) -> dict:
    """MetaSchedule in a child process (with its pools, killed after ``timeout`` seconds)."""
    work_dir = tempfile.mkdtemp(prefix="bench_course_ms_")
    site = os.path.join(work_dir, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(_NO_TORCH_SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [sys.executable, os.path.abspath(__file__), "--ms-child", ",".join(workloads), "--ms-dir", work_dir,
           "--ms-trials", str(args.ms_trials), "--n", str(args.n), "--window-n", str(args.window_n),
           "--target-json", json.dumps(json.loads(str(target)))]  # fmt: skip
    info = {"work_dir": work_dir, "trials_per_task": args.ms_trials, "tasks": len(workloads),
            "timeout_s": round(timeout, 1)}
    t0 = time.perf_counter()
    stdout_path = os.path.join(work_dir, "stdout.log")
    with open(stdout_path, "w") as stdout:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            info["returncode"] = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and its builder/runner workers
            proc.wait()
            info["timed_out"] = True
            log(f"  MetaSchedule: killed after {timeout:.0f} s")
    info["tune_s"] = round(time.perf_counter() - t0, 1)
    with open(stdout_path, errors="replace") as f:  # its last lines (the task table, or a traceback)
        log("\n".join(f"    ms| {line}" for line in f.read().splitlines()[-16:]))
    for w in workloads:  # keep each task's log (the trials' errors), at most 2 MB
        for path in glob.glob(os.path.join(work_dir, "logs", MS_TASK_LOG.format(w))):
            with open(path, errors="replace") as f:
                text = f.read()
            with open(os.path.join(args.out, f"ms_{w}_task.log"), "w") as f:
                f.write(text[-(2 << 20):])
    return info


def ms_result(info: dict, workload: str, func, target) -> dict:
    """One workload's share of a MetaSchedule run: its records, its failures, and the schedule
    of its best record (``compile_tir``), or None."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    out = {"tune_s": info["tune_s"], "timed_out": info.get("timed_out", False), "returncode": info.get("returncode"),
           "trials": info["trials_per_task"], "tasks": info.get("tasks", 1),
           "failures": ms_failures(info["work_dir"], workload), "schedule": None}
    named = ms_named(workload, func)
    try:
        db = ms.database.JSONDatabase(work_dir=info["work_dir"])
        key = tvm_ffi.structural_hash(_normalize_mod(named))
        records = [r for r in db.get_all_tuning_records() if tvm_ffi.structural_hash(r.workload.mod) == key]
        valid = [r for r in records if r.run_secs and all(float(x) < 1e9 for x in r.run_secs)]
        out["records"], out["valid_records"] = len(records), len(valid)
        if valid:
            out["ms_best_ms"] = min(float(np.mean([float(x) for x in r.run_secs])) for r in valid) * 1e3
        sch = ms.tir_integration.compile_tir(db, named, target)
        if sch is not None:  # back to the symbol every other kernel here is called by
            out["schedule"] = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
    except Exception as e:  # noqa: BLE001 - an empty or broken database: say so
        out["db_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def ms_reason(info: dict) -> str:
    parts = []
    if info.get("timed_out"):
        parts.append(f"killed at its {info['tune_s']:g} s cap")
    elif info.get("returncode"):
        parts.append(f"tune_tir exited with {info['returncode']}")
    parts.append(f"{info.get('valid_records', 0)}/{info.get('records', 0)} trials measured (of {info.get('trials')})")
    finished = not info.get("timed_out") and not info.get("returncode")
    if finished and 0 < info.get("records", 0) < (info.get("trials") or 0):
        parts.append(f"its search space held only {info['records']} distinct schedule(s)")
    if info.get("tasks", 1) > 1:
        parts.append(f"tuning time shared by {info['tasks']} tasks in one tune_tir call")
    fails = sorted(info.get("failures", {}).items(), key=lambda kv: -kv[1])
    parts += [f"{n}× {why}" for why, n in fails[:3]]
    if info.get("db_error"):
        parts.append(info["db_error"])
    return "; ".join(parts)


# -- building ----------------------------------------------------------------------------------
@dataclass
class Kernel:
    workload: str
    side: str  # hand | fastdlight | dlight | metaschedule | torch
    variant: str
    mod: object = None  # IRModule to build (not for torch)
    built: object = None  # runtime Executable
    launch: Callable | None = None
    error: str | None = None
    notes: str = ""
    tune_s: float | None = None
    cubin: dict | None = None
    result: dict = field(default_factory=dict)


def build_kernel(k: Kernel, target, log) -> None:
    from fastdlight.tune.compile import build

    if k.mod is None or k.error:
        return
    try:
        t0 = time.perf_counter()
        k.built = build(k.mod, target)
        k.result["build_s"] = round(time.perf_counter() - t0, 2)
    except Exception as e:  # noqa: BLE001 - report and go on
        k.error = f"build: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
        log(f"  {k.workload} {k.side} {k.variant}: {k.error}")


def cubin_report(kernels: list[Kernel], target, log, fatal: bool = True) -> None:
    """nvcc on every built kernel's CUDA source (threads: nvcc is a subprocess): registers,
    shared memory, spills; on a CPU-only machine this is the "it compiles" check (``fatal``: a
    failure marks the kernel failed; on a GPU it is only noted, the kernel runs anyway)."""
    from fastdlight.tune.compile import compile_cubin, cuda_source

    def one(k: Kernel):
        try:
            cub = compile_cubin(cuda_source(k.built), target)
            return {"registers": cub.registers, "shared_bytes": cub.shared_bytes, "spill_bytes": cub.spill_bytes}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {str(e).strip()[-300:]}"}

    todo = [k for k in kernels if k.built is not None]
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 2))) as pool:
        for k, rep in zip(todo, pool.map(one, todo)):
            k.cubin = rep
            if "error" in rep:
                if fatal:
                    k.error = f"nvcc: {rep['error']}"
                log(f"  {k.workload} {k.side} {k.variant}: nvcc: {rep['error']}")


def fastdlight_kernel(workload: str, func, target_or_arch, topk: int, log) -> Kernel:
    import warnings

    import fastdlight
    from fastdlight.tune.measure import function_name

    k = Kernel(workload, "fastdlight", f"fastdlight.tune(topk={topk})")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results, best = fastdlight.tune(func, target_or_arch, topk=topk, progress=False)
        k.tune_s = round(time.perf_counter() - t0, 1)
        k.notes = f"{best.config!r}"
        k.result.update(tuner_ms=best.latency_ms, tuner_verified=best.verified, candidates=len(results),
                        compiled=sum(r.compiled for r in results),
                        timed=sum(r.latency_ms is not None for r in results))
        if best.registers is not None:  # the winner's ptxas numbers (the tuner compiled it with nvcc)
            k.cubin = {"registers": best.registers, "shared_bytes": best.shared_bytes, "spill_bytes": best.spill_bytes}
        if best.module is not None:
            k.built = best.module
            k.launch = best.module[function_name(best.module, best._func)]
        else:  # compile-only: the policy's first choice, nothing timed
            k.notes += f"; compile-only: {k.result['compiled']}/{len(results)} candidates compiled"
    except Exception as e:  # noqa: BLE001
        k.tune_s = round(time.perf_counter() - t0, 1)
        k.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
    log(f"  fastdlight {workload}: {k.tune_s} s, {k.notes or k.error}")
    return k


# -- timing on the GPU -------------------------------------------------------------------------
class Bench:
    """Inputs, references and the timing of one workload (GPU + torch)."""

    def __init__(self, workload: str, n: int, arch, budget_ms: float):
        import torch

        from fastdlight.tune.measure import rotation_copies

        self.workload, self.n, self.budget_ms = workload, n, budget_ms
        self.dev = tvm.cuda(0)
        rng = np.random.default_rng(0)
        if workload == "gemm":
            host = [(rng.random((n, n), dtype=np.float32) * 2 - 1) for _ in range(2)]
            self.ref = host[0].astype(np.float64) @ host[1].astype(np.float64)
            out_shape = (n, n)
            self.work, self.unit = 2.0 * n**3, "TFLOPS"
        else:
            host = [rng.random(n + 2, dtype=np.float32) * 2 - 1]
            a = host[0].astype(np.float64)
            self.ref = a[:-2] + a[1:-1] + a[2:]
            out_shape = (n,)
            self.work, self.unit = (2 * n + 2) * 4.0, "GB/s"
        in_bytes = sum(h.nbytes for h in host)
        copies = rotation_copies(in_bytes, arch.l2_bytes)
        self.torch_sets = [[torch.from_numpy(h).cuda() for h in host] for _ in range(copies)]
        self.out = torch.empty(out_shape, dtype=torch.float32, device="cuda")
        self.tvm_out = tvm.runtime.from_dlpack(self.out)
        self.arg_sets = [[tvm.runtime.from_dlpack(t) for t in s] + [self.tvm_out] for s in self.torch_sets]
        self.torch_out = torch.empty(out_shape, dtype=torch.float32, device="cuda")
        if workload == "gemm":
            self.torch_fns = [lambda a=s[0], b=s[1]: torch.matmul(a, b, out=self.torch_out) for s in self.torch_sets]
        else:
            self.torch_fns = [lambda a=s[0]: a[:-2] + a[1:-1] + a[2:] for s in self.torch_sets]
        self.method = "queued launches"

    def perf(self, ms: float) -> float:
        return self.work / (ms * 1e-3) / (1e12 if self.unit == "TFLOPS" else 1e9)

    def _error(self, out: np.ndarray) -> float:
        out = out.astype(np.float64)
        if not np.all(np.isfinite(out)):
            return float("inf")
        return float(np.linalg.norm(out - self.ref) / np.linalg.norm(self.ref))

    def check(self, k: Kernel) -> None:
        if k.side == "torch":
            out = self.torch_fns[0]()
            out = (self.torch_out if out is None else out).cpu().numpy()
        else:
            self.out.fill_(float("nan"))
            k.launch(*self.arg_sets[0])
            self.dev.sync()
            out = self.out.cpu().numpy()
        err = self._error(out)
        k.result["rel_err"] = err
        k.result["verified"] = bool(err <= TOL[self.workload])

    def time(self, k: Kernel, graphs: bool) -> float:
        from fastdlight.tune.graph_timing import time_graph, time_torch_graph
        from fastdlight.tune.measure import time_launches, time_torch

        if not graphs:
            if k.side == "torch":
                return time_torch(self.torch_fns, self.budget_ms).median_ms
            return time_launches(k.launch, self.arg_sets, self.dev, self.budget_ms).median_ms
        estimate = k.result.get("queued_ms") or 0.05
        if k.side == "torch":
            return time_torch_graph(self.torch_fns, self.budget_ms, estimate).median_ms
        return time_graph(k.launch, self.arg_sets, self.dev, self.budget_ms, estimate).median_ms

    def measure(self, k: Kernel, log, graphs: bool | None = None) -> None:
        """Check, then time (queued; in graphs too when ``graphs`` or this workload's method)."""
        try:
            if k.side != "torch" and k.launch is None and k.built is not None and not k.error:
                k.launch = k.built["main"]
        except Exception as e:  # noqa: BLE001
            k.error = f"load: {type(e).__name__}: {e}"[:400]
        if k.error or (k.side != "torch" and k.launch is None):
            return
        if graphs is None:
            graphs = self.method == "CUDA graphs"
        try:
            self.check(k)
            k.result["queued_ms"] = self.time(k, False)
            k.result["ms"], k.result["method"] = k.result["queued_ms"], "queued launches"
            if graphs:
                self.retime_in_graph(k)
        except Exception as e:  # noqa: BLE001
            k.error = f"run: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
        log(f"  {k.workload:6s} {k.side:12s} {k.variant[:60]:60s} "
            + (f"{k.result['ms']:.4f} ms  err {k.result['rel_err']:.1e}" if "ms" in k.result else f"FAILED {k.error}"))

    def retime_in_graph(self, k: Kernel) -> None:
        try:
            k.result["ms"], k.result["method"] = self.time(k, True), "CUDA graphs"
        except Exception as e:  # noqa: BLE001 - keep the queued number, say why
            k.result["graph_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


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
def main(argv=None) -> int:
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
    parser.add_argument("--ms-child", help=argparse.SUPPRESS)
    parser.add_argument("--ms-dir", help=argparse.SUPPRESS)
    parser.add_argument("--target-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ms_child:
        return ms_child(args)

    args.out = args.out or os.environ.get("OUT") or "bench_course_out"
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
        return 2
    arch = auto_arch() if gpu else CUDA(DRY_TARGET)
    target = arch.target
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
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    sizes = {"gemm": args.n, "window": args.window_n}
    descs = {"gemm": f"GEMM fp32 {args.n}³", "window": f"window sum fp32 n={args.window_n}"}
    t_start = time.perf_counter()

    kernels: dict[str, list[Kernel]] = {w: [] for w in workloads}
    funcs = {w: make_func(w, sizes[w]) for w in workloads}
    # 1. hand schedules and stock Dlight: schedule + build
    for w in workloads:
        for h in hand_variants(w):
            k = Kernel(w, "hand", h.label)
            try:
                k.mod = h.schedule(funcs[w]).mod
            except Exception as e:  # noqa: BLE001
                k.error = f"schedule: {type(e).__name__}: {e}"
            kernels[w].append(k)
        k = Kernel(w, "dlight", "ApplyDefaultSchedule(Matmul, GEMV, Reduction, GeneralReduction, Fallback)")
        try:
            k.mod = dlight_schedule(funcs[w], target)
        except Exception as e:  # noqa: BLE001
            k.error = f"schedule: {type(e).__name__}: {e}"
        kernels[w].append(k)
    for w in workloads:
        for k in kernels[w]:
            build_kernel(k, target, log)
    cubin_report([k for w in workloads for k in kernels[w]], target, log, fatal=not gpu)  # registers, smem, spills
    log(f"  hand + Dlight built in {time.perf_counter() - t_start:.0f} s")

    # 2. fastdlight
    if not args.skip_fastdlight:
        for w in workloads:
            kernels[w].append(fastdlight_kernel(w, funcs[w], arch if gpu else DRY_TARGET, args.topk, log))

    report = {"device": device, "date": stamp, "tvm": tvm.__version__, "torch": torch.__version__ if torch else None,
              "args": {k: v for k, v in vars(args).items() if not k.startswith(("ms_child", "ms_dir", "target_json"))},
              "target": str(target), "rows": []}

    def write(final: bool) -> None:
        rows = []
        for w in workloads:
            torch_ms = next((k.result.get("ms") for k in kernels[w] if k.side == "torch"), None)  # the first
            rows += [row_of(k, benches.get(w), torch_ms) for k in kernels[w]]
        report["rows"], report["total_s"] = rows, round(time.perf_counter() - t_start, 1)
        header = (f"**{device}**, {stamp}, TVM {tvm.__version__}" + (f", torch {torch.__version__}" if torch else "")
                  + (". Every kernel checked against float64 numpy and timed the same way: inputs rotated out of "
                     f"L2, launches queued between CUDA events, median over {args.budget_ms:g} ms; a workload whose "
                     "fastest kernel is under 50 µs is timed in CUDA graphs on every side. "
                     "× torch = torch's time / this time."
                     if gpu else ". Dry run: every variant scheduled and compiled to a cubin; nothing timed."))
        table = markdown(rows, header, descs)
        with open(os.path.join(args.out, "bench_course.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(args.out, "bench_course.md"), "w") as f:
            f.write(table + "\n")
        if final:
            log("\n" + table)

    benches: dict[str, Bench] = {}
    # 3. GPU: check and time everything built so far, torch first and last
    if gpu:
        for w in workloads:
            bench = benches[w] = Bench(w, sizes[w], arch, args.budget_ms)
            tk = Kernel(w, "torch", "torch.matmul (cuBLAS, TF32 off)" if w == "gemm" else "a[:-2] + a[1:-1] + a[2:]")
            kernels[w].insert(0, tk)
            for k in kernels[w]:
                bench.measure(k, log, graphs=False)
            fastest = min((k.result["ms"] for k in kernels[w] if "ms" in k.result), default=None)
            if fastest is not None and fastest < 0.05:
                bench.method = "CUDA graphs"
                for k in kernels[w]:
                    if "ms" in k.result:
                        bench.retime_in_graph(k)
            write(False)
    else:
        write(False)

    # 4. MetaSchedule (last: its child process has the GPU to itself)
    if not args.skip_ms:
        ms_kernels = {}
        for w in workloads:
            ms_kernels[w] = Kernel(w, "metaschedule", f"tune_tir: {args.ms_trials} trials, evolutionary, "
                                   f"cost_model=random")
            kernels[w].append(ms_kernels[w])
        try:
            if gpu:
                timeout = args.ms_timeout
                if args.deadline:  # leave time to build, check and time its kernels, and torch again
                    timeout = min(timeout, args.deadline - (time.perf_counter() - t_start) - MS_RESERVE_S)
                info = ms_run(workloads, args, target, timeout, log)
            for w, k in ms_kernels.items():
                if gpu:
                    res = ms_result(info, w, funcs[w], target)
                    k.tune_s = res["tune_s"]
                    k.result.update({kk: v for kk, v in res.items() if kk != "schedule"})
                    if res["schedule"] is None:
                        k.error = "no valid kernel: " + ms_reason(res)
                    else:
                        own = res.get("ms_best_ms")
                        k.mod = res["schedule"]
                        k.notes = ms_reason(res) + (f"; its runner's best {own:.4f} ms" if own else "")
                        build_kernel(k, target, log)
                        cubin_report([k], target, log, fatal=False)
                        benches[w].measure(k, log)
                else:
                    t0 = time.perf_counter()
                    k.mod, n_sketch, tries = ms_sketch(funcs[w], target)
                    k.variant = f"one sampled sketch of {n_sketch} (dry run: no search)"
                    k.notes = f"sampled in {time.perf_counter() - t0:.0f} s, {tries} draw(s) to pass the postprocessors"
                    build_kernel(k, target, log)
                    cubin_report([k], target, log)
        except Exception as e:  # noqa: BLE001
            for k in ms_kernels.values():
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                k.error = k.error or f"{type(e).__name__}: {first}"[:400]
            log(traceback.format_exc())
        write(False)
    if gpu:  # torch once more: its spread over the run
        for w in workloads:
            tk = Kernel(w, "torch", "torch again (run-to-run spread)")
            kernels[w].append(tk)
            benches[w].measure(tk, log)
    write(True)
    log(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
