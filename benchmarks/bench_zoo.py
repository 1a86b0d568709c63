"""A model zoo that must import, tune, run and win: the torchvision, timm and Hugging Face models
of ``zoo_models.py`` (random weights) at the sizes people run them, through the documented path,
against torch on one GPU.

    python benchmarks/bench_zoo.py --list
    python benchmarks/bench_zoo.py [--models resnet50,gpt2_2l] [--sizes quick|all|1,16,1x512,4x2048]
                                   [--time-limit 900] [--topk 20] [--db DIR] [--skip-compile] [--skip-stock]
    python benchmarks/bench_zoo.py --dry-run [--models timm_resnet18]   # CPU: export .. prepare

One row per model and size: imported (``torch.export`` -> Relax) or the one-line reason it was
not; the largest error against torch fp16, relative to the largest output; ms of torch eager
(queued launches, as users run it), torch in a CUDA graph, ``torch.compile`` (default inductor,
in a CUDA graph), stock Dlight (TVM's own pipeline, ``tvm.compile``) and fastdlight
(``for_inference(mod, params, fp16_io=True)`` -> ``prepare`` ->
``ApplyFastTuning`` with a database dir -> ``build`` -> VM, in a CUDA graph where it can be
captured), all timed as ``bench_models.py`` times them (warm-up, CUDA events, median over
>= 200 ms); tuning seconds cold and again from the database the cold pass filled; the functions
left untuned and who won each (``ApplyFastTuning``'s ``FunctionReport``).

Sizes: ``"B"`` is batch B (vision: 1 and 16), ``"BxS"`` batch B of S tokens (text prefill:
1x512 and 4x2048); ``--sizes quick`` (default) runs each model's first. Each case runs in a
process of its own, killed at ``--time-limit`` seconds; it saves its row stage by stage, so a case
cut short keeps what it measured and names the stage it was in. Rows go to
``$OUT/bench_zoo.jsonl`` as they finish, and all of them to ``$OUT/bench_zoo.json`` and ``.md``.
``--list`` and the argument checks import neither torch nor TVM. ``--resume JSONL`` continues
an earlier run (its ``bench_zoo.jsonl``): the cases that finished there are kept as they are,
the others run, and the JSON and the table hold all of them (a zoo longer than one stay on a
GPU machine is one run in parts).

``--jobs N`` runs N cases at once. A case first does its CPU work (export, import, prepare,
stock Dlight's build, ``torch.compile``'s compile), then takes the GPU (a file lock) once for
torch's timings, stock Dlight's, the tuning, the tuned build and fastdlight's timing
(``zoo_case.py``). Timings never overlap one another; another case's weight upload and torch.compile's first
call (a few milliseconds of GPU work) may fall inside a timing's many samples. Tuning seconds
include builds that share the CPU with other cases' CPU stages; with several cases at once each
tune gets its GPU's share of the CPUs' build processes (``--tune-workers``) and each
torch.compile its case's share of compile processes. ``--gpus 0,1`` spreads the
cases over several GPUs of one machine: each case sees one (``CUDA_VISIBLE_DEVICES``), takes
that GPU's turn and runs on that GPU's slice of the CPUs, so two cases time at once, each on its
own GPU; ``--jobs`` equal to the GPUs' number then runs each case as on a machine of one GPU and
its share of the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import zoo_models
from bench_setup import unknown_names
from zoo_case import dry_case, gpu_case
from zoo_rows import Row, markdown, new_row, row_from

NAME = "bench_zoo"
#: the script a case's process runs (``--child NAME:SIZE``)
CHILD_SCRIPT = os.path.abspath(__file__)


def sizes_of(spec: zoo_models.ZooModel, sizes: str) -> list[str]:
    """The sizes of ``spec`` that ``--sizes`` selects (a model lacking every size named: none)."""
    if sizes == "quick":
        return list(spec.sizes[:1])
    if sizes == "all":
        return list(spec.sizes)
    wanted = [s for s in sizes.split(",") if s]
    return [s for s in spec.sizes if s in wanted]


def list_models() -> str:
    lines = ["| model | family | sizes |", "|---|---|---|"]
    lines += [f"| {name} | {spec.family} | {', '.join(spec.sizes)} |" for name, spec in zoo_models.MODELS.items()]
    return "\n".join(lines)


# --- the run ----------------------------------------------------------------------------------


def child_case(name: str, size: str, args, gpu: str | None = None) -> Row:
    """:func:`gpu_case` in a process of its own, killed (with its tuning workers) at
    ``--time-limit`` seconds; the row it saved last, with why it stopped. ``gpu``: the one GPU
    the case sees (``CUDA_VISIBLE_DEVICES``), whose turn lock it takes (``--gpus``)."""
    fd, path = tempfile.mkstemp(prefix="bench_zoo_row_", suffix=".json")
    os.close(fd)
    lock = gpu_lock_of(args, gpu)
    cmd = [sys.executable, CHILD_SCRIPT, "--child", f"{name}:{size}", "--row-file", path, "--topk", str(args.topk),
           "--tune-jobs", str(args.tune_jobs), "--tune-workers", str(args.tune_workers),
           *(["--skip-compile"] if args.skip_compile else []), *(["--skip-stock"] if args.skip_stock else []),
           *(["--db", args.db] if args.db else []),
           *(["--gpu-lock", lock] if lock else []),
           *(["--cpus", ",".join(map(str, share))] if (share := cpu_share(gpu_list(args), gpu)) else [])]
    env = case_env(os.environ, gpu, args.jobs, len(os.sched_getaffinity(0)))
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        # its own process group: the tuner's workers go with it at the time limit
        proc = subprocess.Popen(cmd, start_new_session=True, stderr=err, env=env)
        LIVE_CASES.add(proc)
        try:
            rc = proc.wait(timeout=args.time_limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        finally:
            LIVE_CASES.discard(proc)
        err.seek(0)
        err_text = err.read()
    sys.stderr.write(err_text)
    try:
        with open(path) as f:
            row = row_from(json.load(f))
    except (OSError, ValueError):
        row = new_row(name, zoo_models.MODELS[name], size, stage="start")
    finally:
        os.unlink(path)
    if row.stage != "done":
        why = (f"time limit ({args.time_limit:g} s) reached" if rc is None
               else f"the process exited with {rc}" if rc > 0 else "stopped" if rc == 0
               else f"the process died of {signal.Signals(-rc).name}")
        crash = crash_line(err_text) if rc else ""
        why += f" ({crash})" if crash else ""
        row.errors["stopped"] = f"{why} at stage {row.stage}"
        row.reason = row.reason or f"{row.stage}: {why}"
        row.seconds = round(time.perf_counter() - t0, 1)
    return row


def cpu_share(gpus: list[str], gpu: str | None, cpus: list[int] | None = None) -> list[int]:
    """The CPUs a case on ``gpu`` runs on where ``--gpus`` names several: that GPU's equal slice
    of the CPUs this run may use, so that a case tunes as on a machine of one GPU and its share
    of the cores. Without pinning, the build processes of the tune on one GPU and the other
    GPU's torch.compile and stock builds took each other's cores (a tune's builds took 1.7-2.2
    times the worker-seconds they took alone). Empty: no pinning (one GPU, or none named)."""
    if gpu is None or len(gpus) < 2:
        return []
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    per, i = len(cpus) // len(gpus), gpus.index(gpu)
    return cpus[i * per:(i + 1) * per] if per else []


def gpu_lock_of(args, gpu: str | None) -> str | None:
    """The turn lock of ``gpu`` (a lock file each GPU of ``--gpus``), or the one GPU's lock."""
    if gpu is None or not args.gpu_lock:
        return args.gpu_lock
    return f"{args.gpu_lock}.{gpu}"


class GpuChooser:
    """Gives each starting case the GPU of ``--gpus`` that the fewest running cases use (the
    first of them on a tie), so the cases spread over the GPUs and each times on its own."""

    def __init__(self, gpus: list[str]):
        self.running = {g: 0 for g in gpus}
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def one(self):
        if not self.running:
            yield None
            return
        with self.lock:
            gpu = min(self.running, key=self.running.get)
            self.running[gpu] += 1
        try:
            yield gpu
        finally:
            with self.lock:
                self.running[gpu] -= 1


def crash_line(stderr: str) -> str:
    """What a process that died said last of an error (e.g. ``what(): CUDA Runtime Error: ...``)."""
    lines = [line.strip() for line in stderr.splitlines() if "Error" in line or "what():" in line]
    return " ".join(lines[-1].replace("what():", "").split())[:200] if lines else ""


def gpu_missing() -> str | None:
    """Why the full run cannot run here, or None."""
    from fastdlight.arch import has_gpu

    if not has_gpu():
        return "needs a CUDA GPU"
    from bench_setup import torch_gpu_missing

    return torch_gpu_missing()


def gpu_list(args) -> list[str]:
    return [g.strip() for g in args.gpus.split(",") if g.strip()]


#: torch.compile's (Inductor's) own setting for the processes that compile its kernels
INDUCTOR_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


def case_env(environ, gpu: str | None, jobs: int, cpus: int) -> dict:
    """A case process's environment: its one GPU (``--gpus``) and, with several cases at once,
    its share of the CPUs for torch.compile's kernel compiles (Inductor starts a compile
    process per CPU in every case otherwise, beside the other cases' tunes), unless the caller
    set it."""
    env = dict(environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if jobs > 1 and INDUCTOR_THREADS not in env:
        env[INDUCTOR_THREADS] = str(max(1, cpus // jobs))
    return env


def tune_workers_per_gpu(cpus: int, gpus: int) -> int:
    """Build processes for each case's tuning where ``gpus`` cases tune at once (one per GPU's
    turn): an equal share of the CPUs, one of it left to the tuning process. Each tuner would
    otherwise start a process per CPU but two: two tunes on 32 CPUs ran 60 build processes
    (and the other cases' stock builds and torch.compile beside them), and a tune's builds took
    1.7-2.2 times the worker-seconds they took on a machine of 16 CPUs to itself."""
    return max(1, cpus // gpus - 1)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the models (name, family, sizes) and exit")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--sizes", default="quick",
                    help="quick (each model's first size), all, or a comma list of sizes (1,16,1x512,4x2048)")
    ap.add_argument("--time-limit", type=float, default=900.0,
                    help="seconds a case (one model at one size) may take; 0: no limit, in this process")
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument("--tune-jobs", type=int, default=0,
                    help="functions a model's tuning works on at once (default: ApplyFastTuning's)")
    ap.add_argument("--tune-workers", type=int, default=0,
                    help="build processes of a case's tuning (default: the tuner's, one per CPU but two; with "
                         "--gpus of several GPUs, whose cases tune at once, each GPU's share of the CPUs)")
    ap.add_argument("--db", default="", help="the tuning database dir (default: a fresh one per case)")
    ap.add_argument("--skip-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--skip-stock", action="store_true", help="leave stock Dlight's build and timing out")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU only: export, import, for_inference, prepare (no build, no timing)")
    ap.add_argument("--target", default="nvidia/nvidia-h100", help="the target of --dry-run's prepare")
    ap.add_argument("--resume", metavar="JSONL",
                    help="rows of an earlier run (its bench_zoo.jsonl): cases that finished there are kept, not run "
                         "again, and the tables cover both")
    ap.add_argument("--jobs", type=int, default=1,
                    help="cases run at once (each takes its GPU turn; CPU stages overlap); needs --time-limit > 0")
    ap.add_argument("--gpus", default="",
                    help="GPUs to spread the cases over (e.g. 0,1): each case runs on one, taking that GPU's "
                         "turn; needs --jobs >= their number")
    ap.add_argument("--start-before", type=float, default=0.0,
                    help="start no case once this many seconds of the run have passed (0: no limit): the rest "
                         "are left to a --resume, where a case cut short by an outside time limit is lost")
    ap.add_argument("--gpu-lock", help=argparse.SUPPRESS)  # the GPU turn's lock file, set by main
    ap.add_argument("--child", help=argparse.SUPPRESS)  # NAME:SIZE, run by child_case
    ap.add_argument("--row-file", help=argparse.SUPPRESS)
    ap.add_argument("--cpus", default="", help=argparse.SUPPRESS)  # the CPUs a case runs on (cpu_share)
    return ap.parse_args(argv)


#: the case processes running now: a run stopped from outside (SIGTERM, as ``timeout`` sends)
#: takes them along, since each runs in a process group of its own
LIVE_CASES: set = set()


def stop_cases(signum, _frame) -> None:
    """Kill the running cases and end the run at once (no case starts after): the cases that
    finished are in the JSONL, which ``--resume`` continues."""
    for proc in list(LIVE_CASES):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"bench_zoo: stopped by signal {signum}; finished cases are in the JSONL (--resume continues)",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def finished_rows(path: str) -> dict[tuple[str, str], Row] | None:
    """The rows of ``path`` (a ``bench_zoo.jsonl``) whose case finished, by (model, size); None
    when the file cannot be read as one."""
    try:
        with open(path) as f:
            rows = [row_from(json.loads(line)) for line in f if line.strip()]
    except (OSError, ValueError, TypeError):
        return None
    return {(r.model, r.size): r for r in rows if r.stage == "done"}


def run_cases(cases: list[tuple[str, str]], args, jsonl: str) -> list[Row]:
    """Each case's row, in the order of ``cases``; a row goes to ``jsonl`` as its case ends
    (``--jobs`` cases at a time)."""

    def one(case: tuple[str, str]) -> Row:
        name, size = case
        if args.start_before and time.perf_counter() - t_start > args.start_before:
            return new_row(name, zoo_models.MODELS[name], size, stage="start",
                           reason=f"not started: --start-before {args.start_before:g} s passed")
        if args.dry_run:
            row = dry_case(name, size, args.target)
        elif args.time_limit > 0:
            with chooser.one() as gpu:
                row = child_case(name, size, args, gpu)
        else:
            row = gpu_case(name, size, args)
        with done_lock:
            with open(jsonl, "a") as f:
                f.write(json.dumps(asdict(row), separators=(",", ":")) + "\n")
            print(f"[{name} {size}: {row.seconds} s] {'ok' if row.stage == 'done' else row.reason}", flush=True)
        return row

    done_lock, t_start = threading.Lock(), time.perf_counter()
    chooser = GpuChooser(gpu_list(args))
    jobs = 1 if args.dry_run or args.time_limit <= 0 else max(1, args.jobs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, cases))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        print(list_models())
        return 0
    if args.child:
        name, size = args.child.split(":")
        if args.cpus:  # before torch and TVM start their thread pools
            os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])

        def save(row: Row) -> None:
            tmp = args.row_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(asdict(row), f)
            os.replace(tmp, args.row_file)

        gpu_case(name, size, args, save)
        return 0
    names = [n for n in args.models.split(",") if n] or list(zoo_models.MODELS)
    error = unknown_names(names, zoo_models.MODELS, "model")
    if error:
        print(error, file=sys.stderr)
        return 2
    cases = [(n, s) for n in names for s in sizes_of(zoo_models.MODELS[n], args.sizes)]
    if not cases:
        print(f"error: no model of {names} has a size in {args.sizes!r}", file=sys.stderr)
        return 2
    gpus = gpu_list(args)
    if gpus and (args.dry_run or args.jobs < len(gpus) or len(set(gpus)) < len(gpus)
                 or not all(g.isdigit() for g in gpus)):
        print(f"error: --gpus {args.gpus}: give distinct GPU numbers, as many --jobs at least, and no --dry-run",
              file=sys.stderr)
        return 2
    if not args.dry_run:
        why = gpu_missing()
        if why:
            print(f"error: bench_zoo {why} (--dry-run runs the CPU part)", file=sys.stderr)
            return 2
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    suffix = "_dry" if args.dry_run else ""
    if args.jobs > 1 and not args.dry_run:
        if args.time_limit <= 0:
            print("error: --jobs needs --time-limit > 0 (each case runs in a process of its own)", file=sys.stderr)
            return 2
        args.gpu_lock = os.path.join(tempfile.mkdtemp(prefix="bench_zoo_"), "gpu.lock")
    if not args.tune_workers and len(gpus) > 1:
        args.tune_workers = tune_workers_per_gpu(len(os.sched_getaffinity(0)), len(gpus))
    earlier = finished_rows(args.resume) if args.resume else {}
    if earlier is None:
        print(f"error: --resume {args.resume}: not a bench_zoo.jsonl (one JSON row a line)", file=sys.stderr)
        return 2
    todo = [c for c in cases if c not in earlier]
    signal.signal(signal.SIGTERM, stop_cases)
    fresh = dict(zip(todo, run_cases(todo, args, os.path.join(out_dir, f"{NAME}{suffix}.jsonl"))))
    rows = [earlier[c] if c in earlier else fresh[c] for c in cases]
    from bench_setup import write_results

    device = next((r.device for r in rows if r.device), "")
    data = {"benchmark": NAME, "device": device, "date": time.strftime("%Y-%m-%d"), "dry_run": args.dry_run,
            "rows": [asdict(r) for r in rows]}
    header = f"{NAME}{' --dry-run' if args.dry_run else ''}, {device or 'CPU'}, {data['date']}\n\n"
    write_results(NAME + suffix, data, header + markdown(rows, args.dry_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
