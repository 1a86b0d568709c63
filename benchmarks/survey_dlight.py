"""Coverage survey: every unscheduled GPU workload of TVM's own Dlight tests, compiled to cubin
through fastdlight and through stock Dlight.

    python benchmarks/survey_dlight.py /path/to/apache-tvm [--topk 4] [--target nvidia/nvidia-h100]

The workloads are the modules TVM's tests hand to ``dlight.ApplyDefaultSchedule`` in
``tests/python/s_tir/dlight/test_gpu_*.py``: each test runs with that pass replaced by a
recorder that keeps its input and stops the test. Symbolic dimensions get SHAPE_VALUE through
``opt_shapes`` (both sides see the same specialized function). Each workload is compiled in a
worker process (a crash or hang costs only that workload): fastdlight's policy top-k, compile
only, and stock Dlight's rules (Matmul, GEMV, LowBatchGEMV, Reduction, GeneralReduction,
Fallback), then nvcc to a cubin. Prints a table by workload and a tally by cause. A benchmark,
not a test: it needs an apache/tvm source tree (never copied into this project).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the value every symbolic dimension gets
SHAPE_VALUE = 128
TEST_DIR = os.path.join("tests", "python", "s_tir", "dlight")
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Workload:
    name: str  # file::test::function
    func_json: str
    opt_shapes: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str  # "4/4 compiled (matmul_tc)" or the one-line cause


class _Captured(BaseException):  # not Exception: a test's own ``except Exception`` must not eat it
    pass


# -- collecting -------------------------------------------------------------------------------
def _symbolic_vars(func) -> list[str]:
    import tvm_ffi
    from tvm import ir

    names = []
    for p in func.params:
        for d in getattr(p, "shape", None) or ():
            tvm_ffi.structural_walk(d, (ir.expr.Var, lambda v: names.append(str(v.name))), order="post")
    return sorted(set(names))


def collect(tvm_root: str) -> list[Workload]:
    """Run each GPU Dlight test with ApplyDefaultSchedule replaced by a recorder."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import dlight

    found: list[Workload] = []
    original = dlight.ApplyDefaultSchedule
    current = {"test": ""}

    class Recorder:
        def __init__(self, *rules):
            pass

        def __call__(self, mod):
            for gv, f in mod.functions_items():
                attrs = f.attrs if isinstance(f, tirx.PrimFunc) else None
                if isinstance(f, tirx.PrimFunc) and not (attrs and "tirx.is_scheduled" in attrs):
                    opt = tuple((v, SHAPE_VALUE) for v in _symbolic_vars(f))
                    found.append(Workload(f"{current['test']}::{gv.name_hint}", tvm.ir.save_json(f), opt))
            raise _Captured

    dlight.ApplyDefaultSchedule = Recorder
    try:
        test_dir = os.path.join(tvm_root, TEST_DIR)
        for fname in sorted(os.listdir(test_dir)):
            if fname.startswith("test_gpu_") and fname.endswith(".py"):
                _run_tests(os.path.join(test_dir, fname), current)
    finally:
        dlight.ApplyDefaultSchedule = original
    return found


def _run_tests(path: str, current: dict) -> None:
    stem = os.path.basename(path)[len("test_gpu_"):-3]
    spec = importlib.util.spec_from_file_location(f"tvm_dlight_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # TVMScript finds a function's source through its module
    spec.loader.exec_module(module)
    for name in sorted(n for n in dir(module) if n.startswith("test_")):
        current["test"] = f"{stem}::{name[5:]}"
        try:
            getattr(module, name)()
        except _Captured:
            pass
        except Exception as e:  # noqa: BLE001 - a test that fails before scheduling: nothing to record
            print(f"  (skipped {stem}::{name}: {type(e).__name__})", file=sys.stderr)


# -- compiling (in a worker process) ------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    for ln in lines:  # TVM's checks put the reason on a line of its own
        if ln.startswith(("Check failed", "ValueError", "TypeError", "InternalError", "error")):
            text = ln
            break
    return f"{type(e).__name__}: {text}"[:160]


def run_fastdlight(w: Workload, target: str, topk: int) -> Outcome:
    import warnings

    import tvm

    from fastdlight.arch import CUDA
    from fastdlight.search.candidates import tune_function
    from fastdlight.search.options import TuneOptions

    func = tvm.ir.load_json(w.func_json)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tuned = tune_function(func, CUDA(target), topk, TuneOptions(measure=False, parallel_build=False),
                                  opt_shapes=dict(w.opt_shapes) or None)
    except Exception as e:  # noqa: BLE001 - the outcome is the one line
        return Outcome(False, _one_line(e))
    n_ok = sum(r.compiled for r in tuned.results)
    return Outcome(n_ok > 0, f"{n_ok}/{len(tuned.results)} compiled ({tuned.config.kind})")


def run_stock(w: Workload, target: str) -> Outcome:
    import tvm

    from fastdlight.analysis.prepare import specialize
    from fastdlight.schedules import default_schedule
    from fastdlight.compiler.compile import build, compile_cubin, cuda_source

    try:
        func = specialize(tvm.ir.load_json(w.func_json), dict(w.opt_shapes) or None)
        tgt = tvm.target.Target(target)
        sch = default_schedule(func.with_attr("global_symbol", "main"), tgt)
        compile_cubin(cuda_source(build(sch.mod, tgt)), tgt)
    except Exception as e:  # noqa: BLE001
        return Outcome(False, _one_line(e))
    return Outcome(True, "compiled")


# -- report -----------------------------------------------------------------------------------
def table(rows: list[tuple[Workload, Outcome, Outcome]]) -> str:
    lines = ["| workload | symbolic | fastdlight | stock Dlight |", "|---|---|---|---|"]
    for w, ours, stock in rows:
        sym = ", ".join(f"{k}={v}" for k, v in w.opt_shapes) or "-"
        lines.append(f"| {w.name} | {sym} | {'ok: ' if ours.ok else 'FAIL: '}{ours.detail} "
                     f"| {'ok' if stock.ok else 'FAIL: ' + stock.detail} |")
    n = len(rows)
    lines.append("")
    lines.append(f"fastdlight compiled {sum(o.ok for _, o, _ in rows)} of {n}; "
                 f"stock Dlight compiled {sum(s.ok for _, _, s in rows)} of {n}.")
    causes = collections.Counter(o.detail for _, o, _ in rows if not o.ok)
    if causes:
        lines.append("\nfastdlight failures by cause:")
        lines += [f"- {k} × {v}" for v, k in sorted(((v, k) for k, v in causes.items()), reverse=True)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tvm_root", help="an apache/tvm source tree")
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--target", default="nvidia/nvidia-h100")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", help="substring of workload names to run")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.tvm_root, TEST_DIR)):
        print(f"survey_dlight: {args.tvm_root} has no {TEST_DIR}", file=sys.stderr)
        return 2
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    commit = subprocess.run(["git", "-C", args.tvm_root, "rev-parse", "HEAD"], capture_output=True, text=True)
    import survey_dlight as me  # workers unpickle these functions and types by module name

    t0 = time.perf_counter()
    workloads = [w for w in me.collect(args.tvm_root) if not args.only or args.only in w.name]
    print(f"apache/tvm {commit.stdout.strip() or '(not a git checkout)'}: {len(workloads)} workloads, "
          f"{sum(bool(w.opt_shapes) for w in workloads)} symbolic; target {args.target}, top {args.topk}", flush=True)

    from fastdlight.compiler.workers import Task, WorkerPool

    tasks = [Task((i, "ours"), me.run_fastdlight, (w, args.target, args.topk)) for i, w in enumerate(workloads)]
    tasks += [Task((i, "stock"), me.run_stock, (w, args.target)) for i, w in enumerate(workloads)]
    results = {}
    with WorkerPool(args.workers) as pool:
        for out in pool.imap_unordered(tasks, timeout=TIMEOUT_S):
            results[out.key] = out.value if out.ok else Outcome(False, f"worker: {out.error}")
            if out.key[1] == "ours":
                print(f"  {workloads[out.key[0]].name}: {results[out.key].detail}", flush=True)
    rows = [(w, results[(i, "ours")], results[(i, "stock")]) for i, w in enumerate(workloads)]
    print()
    print(table(rows))
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
