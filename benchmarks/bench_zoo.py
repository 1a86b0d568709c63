"""A model zoo that must import, tune, run and win: the torchvision, timm and Hugging Face models
of ``zoo_models.py`` (random weights) at the sizes people run them, through the documented path,
against torch on one GPU.

    python benchmarks/bench_zoo.py --list
    python benchmarks/bench_zoo.py [--models resnet50,gpt2_2l] [--sizes quick|all|1,16,1x512,4x2048]
                                   [--time-limit 900] [--topk 20] [--db DIR] [--skip-compile]
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
torch's timings, stock Dlight's, and the tuning, builds, and takes it again for fastdlight's
timing. Timings never overlap one another; another case's weight upload and torch.compile's first
call (a few milliseconds of GPU work) may fall inside a timing's many samples. Tuning seconds
include builds that share the CPU with other cases' CPU stages.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import zoo_models
from bench_setup import unknown_names
from zoo_rows import Row, markdown, row_from

NAME = "bench_zoo"
#: the script a case's process runs (``--child NAME:SIZE``)
CHILD_SCRIPT = os.path.abspath(__file__)
IMPORT_STAGES = ("torch.export", "import", "for_inference", "prepare")


_NOISE = ("Traceback", "File ", "While executing", "Original traceback", "Use tlparse", "Set TORCH_LOGS",
          "For more information", "from user code", "Exception raised from")


def one_line(e: BaseException) -> str:
    """``Type: message``, one line: a TVM error's last line (after its traceback), else the
    message's first line that is not a traceback or a pointer to logs."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line[:1].isspace() and not line.strip().startswith(_NOISE)]
    line = (lines[-1] if text.lstrip().startswith("Traceback") else lines[0]) if lines else ""
    return f"{type(e).__name__}: {line}"[:240]


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


# --- one case ---------------------------------------------------------------------------------


class Case:
    """One model at one size; :meth:`stage` saves the row as each stage begins."""

    def __init__(self, name: str, size: str, save=None):
        spec = zoo_models.MODELS[name]
        self.spec, self.save = spec, save or (lambda row: None)
        self.row = Row(name, spec.family, size, inputs=[[list(s), d] for s, d in spec.inputs_at(size)])
        self.inference_mod = None  # the for_inference module, once imported
        self._since = time.perf_counter()

    def stage(self, name: str) -> None:
        """Begin stage ``name`` (closing the one before: its seconds go to ``stage_s``)."""
        now = time.perf_counter()
        if self.row.stage:
            spent = self.row.stage_s.get(self.row.stage, 0.0) + now - self._since
            self.row.stage_s[self.row.stage] = round(spent, 2)
        self.row.stage, self._since = name, now
        self.save(self.row)

    def fail(self, e: BaseException) -> None:
        row = self.row
        row.reason = row.reason or f"{row.stage}: {one_line(e)}"
        row.errors[row.stage] = one_line(e)
        row.errors["where"] = traceback.extract_tb(e.__traceback__)[-1].filename if e.__traceback__ else ""

    def import_model(self, target):
        """``(torch model fp32, example inputs, prepared module, module before prepare)``."""
        from fastdlight.relax import for_inference, prepare
        from fastdlight.relax.pipeline import prim_funcs

        row = self.row
        self.stage("torch.export")
        model = zoo_models.build(row.model)
        inputs = self.spec.example_inputs(size=row.size)
        program = zoo_models.export(row.model, row.size, model=model)
        self.stage("import")
        mod, params = zoo_models.to_relax(program)
        del program
        self.stage("for_inference")
        mod = for_inference(mod, params, fp16_io=True)
        self.inference_mod = mod  # what stock Dlight's pipeline compiles
        self.stage("prepare")
        prepared = prepare(target)(mod)
        row.functions = len(prim_funcs(prepared))
        row.imported = True
        return model, inputs, prepared


def dry_case(name: str, size: str, target: str) -> Row:
    """The CPU part: export, import, for_inference, prepare (no build, no timing)."""
    case, t0 = Case(name, size), time.perf_counter()
    try:
        case.import_model(target)
        case.stage("done")
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        case.fail(e)
    case.row.seconds = round(time.perf_counter() - t0, 1)
    return case.row


def torch_on_gpu(case: Case, model, inputs, args):
    """The fp16 model and inputs on the GPU, and ``torch.compile``'s module compiled and run
    once (None where it failed, noted): CPU work, done before the case's GPU turn."""
    import torch

    model = model.half().cuda()
    x = [t.half().cuda() if t.is_floating_point() else t.cuda() for t in inputs]
    compiled = None
    if not args.skip_compile:
        case.stage("torch.compile")
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*x)
        except Exception as e:  # noqa: BLE001
            case.row.errors["torch.compile"] = one_line(e)
            compiled = None
    return model, x, compiled


def time_torch_side(case: Case, model, x, compiled):
    """(GPU turn held) torch fp16: eager, in a CUDA graph, torch.compile; its output (fp32 numpy)."""
    import torch
    from bench_models import BUDGET_MS

    from fastdlight.measure.graph_timing import time_torch_graph
    from fastdlight.measure.timing import time_torch

    row = case.row
    with torch.no_grad():
        case.stage("torch eager")
        ref = model(*x).float().cpu().numpy()
        row.torch_eager_ms = time_torch([lambda: model(*x)], BUDGET_MS).median_ms
        case.stage("torch graph")
        try:
            row.torch_graph_ms = time_torch_graph([lambda: model(*x)], BUDGET_MS, row.torch_eager_ms).median_ms
        except Exception as e:  # noqa: BLE001
            row.errors["torch graph"] = one_line(e)
        if compiled is not None:
            case.stage("torch.compile timing")
            try:
                row.torch_compile_ms = time_torch_graph([lambda: compiled(*x)], BUDGET_MS,
                                                        row.torch_eager_ms).median_ms
            except Exception as e:  # noqa: BLE001
                row.errors["torch.compile"] = one_line(e)
    return ref


def free_torch_memory() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


@contextlib.contextmanager
def gpu_turn(case: Case, args):
    """Hold the GPU (``--gpu-lock``, a file lock shared by the cases ``--jobs`` runs at once);
    the wait is a stage of its own, so that no stage's seconds include it."""
    if not args.gpu_lock:
        yield
        return
    case.stage("GPU turn wait")
    with open(args.gpu_lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tune(prepared, arch, db: str, args):
    from fastdlight.relax import ApplyFastTuning
    from fastdlight.relax.apply_fast_tuning import DEFAULT_JOBS

    tuning = ApplyFastTuning(topk=args.topk, target=arch, meta_database_dir=db, progress=False,
                             jobs=args.tune_jobs or DEFAULT_JOBS)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(prepared)
    return tuned, tuning, round(time.perf_counter() - t0, 2)


def build_stock(case: Case, arch, dev):
    """The ``for_inference`` module through TVM's own pipeline, stock Dlight scheduling every
    kernel (``tvm.compile``, as ``bench_models`` builds stock), in a VM; None where the build
    failed (noted, not fatal)."""
    import tvm
    from tvm import relax

    case.stage("stock dlight")
    try:
        with arch.target, tvm.transform.PassContext(opt_level=3):
            return relax.VirtualMachine(tvm.compile(case.inference_mod, target=arch.target), dev)
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        case.row.errors["stock dlight"] = one_line(e)
        return None


def time_stock(case: Case, vm, inputs, dev) -> None:
    """(GPU turn held) stock Dlight's module timed as fastdlight's is."""
    import tvm
    from bench_models import time_vm

    case.stage("stock dlight timing")
    try:
        x = [tvm.runtime.tensor(t.half().numpy() if t.is_floating_point() else t.numpy(), dev) for t in inputs]
        case.row.stock_ms = time_vm(vm, x, dev, case.row)
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        case.row.errors["stock dlight"] = one_line(e)


def tune_case(case: Case, prepared, arch, args):
    """(GPU turn held) Tune cold, then again from the database: (tuned module, both passes)."""
    row = case.row
    db = args.db or tempfile.mkdtemp(prefix="fastdlight_zoo_")
    case.stage("tune")
    tuned, tuning, row.tune_s = tune(prepared, arch, db, args)
    case.stage("tune from database")
    _, again, row.tune_db_s = tune(prepared, arch, db, args)
    return tuned, tuning, again


def record_tuning(row: Row, tuning, again) -> None:
    row.tune_stage_s = {k: round(v, 1) for k, v in tuning.stage_seconds.items()}
    row.untuned = [e.function for e in tuning.report if e.status == "untuned"]
    row.errors.update({f"untuned {e.function}": e.error for e in tuning.report if e.status == "untuned" and e.error})
    for e in tuning.report:
        key = e.winner or e.status  # views and untuned functions have no winner
        row.winners[key] = row.winners.get(key, 0) + 1
    row.report = [[e.function, e.status, e.winner, e.latency_ms and round(e.latency_ms, 4),
                   e.stock_ms and round(e.stock_ms, 4), e.config.kind if e.config is not None else None,
                   e.rank, e.candidates, [list(kv) for kv in e.best_of_first]]
                  for e in tuning.report]
    row.db_hits = sum(e.status == "database" for e in again.report)


def run_fastdlight(case: Case, tuned, inputs, arch, dev):
    """Build the tuned module, run it in the VM (its output, fp32 numpy) and time it."""
    import numpy as np
    import tvm
    from bench_models import time_vm
    from tvm import relax

    from fastdlight.relax import build

    row = case.row
    case.stage("build")
    t0 = time.perf_counter()
    ex = build(tuned, arch.target)
    row.build_s = round(time.perf_counter() - t0, 2)
    vm = relax.VirtualMachine(ex, dev)
    x = [tvm.runtime.tensor(t.half().numpy() if t.is_floating_point() else t.numpy(), dev) for t in inputs]
    case.stage("run")
    out = vm["main"](*x)
    out = out if hasattr(out, "numpy") else out[0]  # the exported graph returns a tuple
    out = out.numpy().astype(np.float32)
    case.stage("fastdlight timing")
    row.fastdlight_ms = time_vm(vm, x, dev, row)
    return out


def gpu_case(name: str, size: str, args, save=None) -> Row:
    import numpy as np
    import tvm
    from bench_setup import torch_fp32_accumulation

    from fastdlight.arch import CUDA

    case, t0 = Case(name, size, save), time.perf_counter()
    row = case.row
    try:
        dev = tvm.cuda(0)
        arch = CUDA.from_device(dev)
        row.device = arch.device_name or arch.name
        torch_fp32_accumulation()
        model, inputs, prepared = case.import_model(arch.target)
        # the CPU work first (stock Dlight's build, torch.compile's), then one GPU turn for
        # every timing, the tuning and the tuned build: the case waits for the GPU once. The
        # build holds the turn too: a case that let it go after tuning waited behind every
        # other case's tuning for its last timing, and ran out of time there.
        stock = build_stock(case, arch, dev)
        model, x, compiled = torch_on_gpu(case, model, inputs, args)
        with gpu_turn(case, args):
            ref = time_torch_side(case, model, x, compiled)
            del model, x, compiled  # not needed while tuning
            free_torch_memory()
            if stock is not None:
                time_stock(case, stock, inputs, dev)
            tuned, tuning, again = tune_case(case, prepared, arch, args)
            record_tuning(row, tuning, again)
            out = run_fastdlight(case, tuned, inputs, arch, dev)
        row.max_rel_err = float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-6))
        case.stage("done")
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        case.fail(e)
    row.seconds = round(time.perf_counter() - t0, 1)
    case.save(row)
    return row


# --- the run ----------------------------------------------------------------------------------


def child_case(name: str, size: str, args) -> Row:
    """:func:`gpu_case` in a process of its own, killed (with its tuning workers) at
    ``--time-limit`` seconds; the row it saved last, with why it stopped."""
    fd, path = tempfile.mkstemp(prefix="bench_zoo_row_", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, CHILD_SCRIPT, "--child", f"{name}:{size}", "--row-file", path, "--topk", str(args.topk),
           "--tune-jobs", str(args.tune_jobs),
           *(["--skip-compile"] if args.skip_compile else []), *(["--db", args.db] if args.db else []),
           *(["--gpu-lock", args.gpu_lock] if args.gpu_lock else [])]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        # its own process group: the tuner's workers go with it at the time limit
        proc = subprocess.Popen(cmd, start_new_session=True, stderr=err)
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
        spec = zoo_models.MODELS[name]
        row = Row(name, spec.family, size, inputs=[[list(s), d] for s, d in spec.inputs_at(size)], stage="start")
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
    ap.add_argument("--db", default="", help="the tuning database dir (default: a fresh one per case)")
    ap.add_argument("--skip-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU only: export, import, for_inference, prepare (no build, no timing)")
    ap.add_argument("--target", default="nvidia/nvidia-h100", help="the target of --dry-run's prepare")
    ap.add_argument("--resume", metavar="JSONL",
                    help="rows of an earlier run (its bench_zoo.jsonl): cases that finished there are kept, not run "
                         "again, and the tables cover both")
    ap.add_argument("--jobs", type=int, default=1,
                    help="cases run at once (each takes its GPU turn; CPU stages overlap); needs --time-limit > 0")
    ap.add_argument("--gpu-lock", help=argparse.SUPPRESS)  # the GPU turn's lock file, set by main
    ap.add_argument("--child", help=argparse.SUPPRESS)  # NAME:SIZE, run by child_case
    ap.add_argument("--row-file", help=argparse.SUPPRESS)
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
        if args.dry_run:
            row = dry_case(name, size, args.target)
        elif args.time_limit > 0:
            row = child_case(name, size, args)
        else:
            row = gpu_case(name, size, args)
        with done_lock:
            with open(jsonl, "a") as f:
                f.write(json.dumps(asdict(row), separators=(",", ":")) + "\n")
            print(f"[{name} {size}: {row.seconds} s] {'ok' if row.stage == 'done' else row.reason}", flush=True)
        return row

    done_lock = threading.Lock()
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
