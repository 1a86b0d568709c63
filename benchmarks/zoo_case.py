"""One case of the zoo (``bench_zoo.py``): a model at one size, stage by stage, on the GPU.

A case first does its CPU work (export, import, ``for_inference``, ``prepare``, stock Dlight's
build, ``torch.compile``'s compile), then takes the GPU once (``gpu_turn``: a file lock shared
by the cases ``--jobs`` runs at once) for torch's timings, stock Dlight's, the tuning (cold, then
from the database), the tuned build and fastdlight's timing. Its row is saved as each stage
begins, so a case cut short keeps what it measured and names the stage it was in.
"""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
import time
import traceback
import warnings

import zoo_models
from bench_setup import one_line
from zoo_rows import Row, new_row


class Case:
    """One model at one size; :meth:`stage` saves the row as each stage begins."""

    def __init__(self, name: str, size: str, save=None):
        spec = zoo_models.MODELS[name]
        self.spec, self.save = spec, save or (lambda row: None)
        self.row = new_row(name, spec, size)
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
                             jobs=args.tune_jobs or DEFAULT_JOBS, max_workers=args.tune_workers or None)
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
        stock = None if args.skip_stock else build_stock(case, arch, dev)
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
