"""MetaSchedule's side of ``bench_course.py``: ``tune_tir`` in a child process (this script,
with ``--ms-child``), killed at its deadline; what its database holds afterwards, and why its
trials failed. ``ms_sketch`` is the dry run's stand-in: one sampled design-space sketch."""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import tvm
from tvm import s_tir

from course_schedules import make_func

#: MetaSchedule's LocalBuilder timeout per candidate: its default (30 s) is spent by a fresh build
#: worker's first ``import tvm.s_tir.tensor_intrin`` (~20 s on 2 cores), failing every build
MS_BUILD_TIMEOUT_S = 120.0
#: MetaSchedule's per-task log in its work dir (the trials' errors are there)
MS_TASK_LOG = "*.task_[0-9]*_{}.log"


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


#: MetaSchedule's runner: fewer repetitions than its default (min_repeat_ms=100), to fit the
#: run; its timings only rank its candidates (the winner is timed again here, like every kernel)
MS_EVALUATOR = {"number": 3, "repeat": 1, "min_repeat_ms": 25}
#: put first on a MetaSchedule process's PYTHONPATH: tvm_ffi imports torch in every process when
#: it is installed (4-5 s on the H100 machine), and MetaSchedule starts a pool of build workers
#: for every batch; none of them uses torch (cf. fastdlight.compiler.workers._block_torch)
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


def main(argv=None) -> int:
    """The child process's entry (``ms_run`` starts it)."""
    parser = argparse.ArgumentParser(description="bench_course's MetaSchedule child process")
    parser.add_argument("--ms-child", required=True, help="workloads, comma-separated")
    parser.add_argument("--ms-dir", required=True)
    parser.add_argument("--ms-trials", type=int, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--window-n", type=int, required=True)
    parser.add_argument("--target-json", required=True)
    return ms_child(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
