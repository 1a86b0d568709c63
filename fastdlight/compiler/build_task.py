"""What a build worker does for one candidate: schedule → lower → nvcc → (exported library).

Runs inside a :mod:`fastdlight.compiler.workers` process (or in-process for serial builds). A
:class:`~fastdlight.compiler.artifacts.BuildRequest` goes in (the PrimFunc as ``tvm.ir.save_json``
text, the target as its JSON string, the frozen config) and a
:class:`~fastdlight.compiler.artifacts.BuildArtifact` comes back (source, ptxas numbers, cubin, the
path of the exported ``.so``: a runtime module cannot be pickled).

On a machine with the CUDA runtime, ``tvm.compile`` calls the global
``tvm_callback_cuda_compile`` to turn CUDA source into a binary. We override it with our own
nvcc call (:func:`fastdlight.compiler.compile.compile_cubin`) so each kernel goes through nvcc
once and we keep ptxas' register/spill report. Without the CUDA runtime ``tvm.compile`` only
emits source; we then compile that source to a cubin ourselves, which is what "compiled"
means in compile-only mode.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections import OrderedDict

import tvm

from fastdlight.arch.cuda import parse_sm
from fastdlight.compiler.artifacts import BuildArtifact, BuildPhases, BuildRequest
from fastdlight.compiler.compile import (
    PASS_CONFIG,
    CompileError,
    Cubin,
    as_target,
    compile_cubin,
    cuda_source,
    first_error_line,
    tir_pipeline,
)

#: PrimFuncs already parsed in this process, by their JSON text (one func, many candidates).
_FUNCS: dict[int, tuple[str, object]] = {}
#: The cubin our compile callback produced during the current build (one build at a time).
_LAST_CUBIN: list[Cubin] = []
#: A prebuilt cubin the callback should return instead of running nvcc (parent-side rebuild).
_FORCED_CUBIN: list[bytes] = []
_CALLBACK_INSTALLED = [False]


class StageError(RuntimeError):
    """A candidate failed in one stage; ``stage`` is the short reason shown in summaries."""

    def __init__(self, stage: str, message: str, log: str = ""):
        first = (message.strip().splitlines() or [""])[0]
        super().__init__(f"{stage}: {first}")
        #: what the worker pool reports as the one-line reason, and the full log kept with it
        self.one_line, self.stage, self.log = f"{stage}: {first}", stage, log or message


# -- worker setup ---------------------------------------------------------------------------
def _cuda_compile_callback(code, *_):
    """``tvm_callback_cuda_compile`` replacement: :func:`compile_cubin` once, keep ptxas' report
    (of the last module compiled: a model's build calls it once per kernel module)."""
    if _FORCED_CUBIN:
        return bytearray(_FORCED_CUBIN[-1])
    target = tvm.target.Target.current(allow_none=True)
    if target is None:
        raise RuntimeError("tvm_callback_cuda_compile called outside a target scope")
    cubin = compile_cubin(code, target, threads=_COMPILE_THREADS[-1])
    _LAST_CUBIN[:] = [cubin]
    return bytearray(cubin.binary)


#: kernels of one module compiled at a time by the callback (:func:`compile_threads`)
_COMPILE_THREADS = [1]


@contextlib.contextmanager
def compile_threads(threads: int):
    """Within it, the callback optimizes up to ``threads`` kernels of a module at a time: for a
    model's build, whose module holds all its kernels (a build worker's holds one, and the
    workers already fill the CPUs)."""
    _COMPILE_THREADS.append(max(1, threads))
    try:
        yield
    finally:
        _COMPILE_THREADS.pop()


def install_compile_callback() -> None:
    if _CALLBACK_INSTALLED[0]:
        return
    import tvm_ffi
    import tvm.support.nvcc  # noqa: F401 - registers the stock callback first; we override it

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _cuda_compile_callback, override=True)
    _CALLBACK_INSTALLED[0] = True


def uninstall_compile_callback() -> None:
    """Put TVM's stock nvcc/nvrtc callback back (used when ours is rejected by the runtime)."""
    import tvm_ffi
    import tvm.support.nvcc as nvcc

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", nvcc.tvm_callback_cuda_compile, override=True)
    _CALLBACK_INSTALLED[0] = False


def init_worker(cuda_only: bool = False) -> int:
    """Per-worker one-time setup: TVM, the templates, our compile callback. ``cuda_only``: this
    process only builds CUDA candidates (a build worker, not the caller's process)."""
    _CUDA_ONLY_PROCESS[0] = cuda_only
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    install_compile_callback()
    import fastdlight.schedules  # noqa: F401 - the templates pull in Dlight: import once, here

    return os.getpid()


#: set in build worker processes (:func:`init_worker` with ``cuda_only=True``), which only build CUDA
_CUDA_ONLY_PROCESS = [False]


def import_tensor_intrinsics(config=None) -> bool:
    """TVM's ldmatrix/mma TensorIntrins, once per process. A build worker registers each one
    as a schedule names it (``schedules.intrinsics``: 0.04 s, then a few parses, against 1.4 s
    for all 91); any other process imports TVM's module as is, with a cheap inspect.stack.
    The mma.sync template registers the bf16/int8 ones it adds when a config of that dtype is
    scheduled. A MetaSchedule record (``config``) gets every one: its trace names them from C++."""
    from fastdlight.schedules import intrinsics  # the templates' package: workers import it anyway

    if _CUDA_ONLY_PROCESS[0]:
        intrinsics.load_deferred()
        if config is not None and config.kind == "ms_record":
            intrinsics.ensure_all()
    elif intrinsics.MODULE not in sys.modules:
        with intrinsics.cheap_inspect_stack():
            import tvm.s_tir.tensor_intrin.cuda  # noqa: F401
    return True


# -- helpers --------------------------------------------------------------------------------
def load_func(func_json: str):
    key = hash(func_json)
    hit = _FUNCS.get(key)
    if hit is not None and hit[0] == func_json:
        return hit[1]
    func = tvm.ir.load_json(func_json)
    _FUNCS[key] = (func_json, func)
    return func


def as_module(scheduled) -> tvm.IRModule:
    """A template's result (Schedule, IRModule or PrimFunc) as an IRModule."""
    if scheduled is None:
        raise StageError("schedule", "template returned None (config does not apply to this function)")
    if isinstance(scheduled, tvm.IRModule):
        return scheduled
    mod = getattr(scheduled, "mod", None)
    if isinstance(mod, tvm.IRModule):
        return mod
    if isinstance(scheduled, tvm.tirx.PrimFunc):
        return tvm.IRModule({"main": scheduled})
    raise StageError("schedule", f"template returned {type(scheduled).__name__}, not a Schedule")


def needs_tensor_intrinsics(config) -> bool:
    """Our tensor-core template, stock Dlight at a plain arch (sm_80, sm_90), whose Matmul
    rule tensorizes there, or a MetaSchedule record that tensorizes (TVM's own import of the intrinsics takes ~30 s; ours ~4 s)."""
    return (config.kind == "matmul_tc" or (config.kind == "dlight" and not parse_sm(config.arch)[1])
            or (config.kind == "ms_record" and "tensorize" in config.trace))


def apply_template(func, config, template=None):
    """``template(func, config)`` (default: :func:`fastdlight.schedules.apply_config`), with the
    tensor-core intrinsics registered first when the config needs them."""
    if not needs_tensor_intrinsics(config):
        return resolve_template(template)(func, config)
    if config.kind != "dlight" or _CUDA_ONLY_PROCESS[0]:
        # Dlight's tensor-core rules import the intrinsics themselves, when they tensorize: in
        # this process stock Dlight at sm_90 then costs nothing more on a softmax or a norm,
        # where importing them first was 2-5 s before a tune's first build could start
        import_tensor_intrinsics(config)
    from fastdlight.schedules import intrinsics

    with intrinsics.cheap_inspect_stack():  # the template may register intrinsics of its dtype
        return resolve_template(template)(func, config)


def resolve_template(template):
    if template is not None:
        return template
    from fastdlight.schedules import apply_config  # the worker imports the templates lazily

    return apply_config


def runtime_has_cuda() -> bool:
    """Whether this TVM can make (and load) libraries of CUDA kernels: its runtime has CUDA."""
    try:
        return bool(tvm.runtime.enabled("cuda"))
    except Exception:  # noqa: BLE001
        return False


def _compile(mod, target):
    with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
        try:
            return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(mod))
        except CompileError as e:
            raise StageError("nvcc", first_error_line(str(e)), str(e)) from e
        except Exception as e:
            # Our nvcc errors may come back wrapped by the FFI; anything else is a lowering failure.
            text = str(e)
            if "nvcc failed" in text or "nvcc timed out" in text:
                raise StageError("nvcc", first_error_line(text), text) from e
            raise StageError("lower", f"{type(e).__name__}: {first_error_line(text)}", traceback.format_exc()) from e


def lower_and_compile(mod: tvm.IRModule, target) -> tuple[object, str, Cubin]:
    """``tvm.compile`` + nvcc. Returns (executable, CUDA source, cubin report)."""
    _LAST_CUBIN.clear()
    try:
        ex = _compile(mod, target)
    except StageError:
        if not _LAST_CUBIN:
            raise
        # nvcc succeeded but TVM failed afterwards: the runtime may not accept our callback's
        # cubin. Retry once with TVM's stock callback (ptxas numbers then come from our own run).
        uninstall_compile_callback()
        _LAST_CUBIN.clear()
        ex = _compile(mod, target)
    try:
        source = cuda_source(ex)
    except ValueError as e:
        raise StageError("lower", str(e)) from e
    cubin = _LAST_CUBIN[-1] if _LAST_CUBIN else None
    if cubin is None:  # no CUDA runtime here (or TVM's own callback ran): compile it ourselves
        try:
            cubin = compile_cubin(source, target)
        except CompileError as e:
            raise StageError("nvcc", first_error_line(str(e)), str(e)) from e
    return ex, source, cubin


# -- the task -------------------------------------------------------------------------------
def schedule_request(func, request: BuildRequest, target) -> tvm.IRModule:
    """The scheduled module a request asks for: the config's template, or (config None) the
    naive float64 reference schedule."""
    try:
        if request.config is None:
            from fastdlight.measure.widen import naive_reference_module

            return naive_reference_module(func, target)
        with target:  # templates that read the target (stock Dlight's rules) see the tuning target
            return as_module(apply_template(func, request.config, request.template))
    except StageError:
        raise
    except Exception as e:  # ScheduleError and template bugs alike: the config is not buildable
        raise StageError("schedule", f"{type(e).__name__}: {e}", traceback.format_exc()) from e


def export(ex, mod, request: BuildRequest) -> tuple[str | None, str | None, str | None]:
    """(so_path, mod_json, export_error): a library the probe and this process can load, or the
    scheduled module for a parent-side rebuild from the cubin when there is no host compiler."""
    if not runtime_has_cuda():
        raise StageError("export", "no CUDA runtime in the build worker: cannot make a runnable module")
    path = os.path.join(request.out_dir, f"candidate_{request.key}.so")
    try:
        ex.export_library(path)
        return path, None, None
    except Exception as e:  # noqa: BLE001 - e.g. no host C compiler
        return None, tvm.ir.save_json(mod), f"{type(e).__name__}: {e}"


def build_candidate(request: BuildRequest) -> BuildArtifact:
    """Build one candidate; failures raise :class:`StageError` (recorded by the caller)."""
    t0, wall_start = time.perf_counter(), time.time()
    func = load_func(request.func_json)
    target = as_target(request.target)
    if request.hook is not None:
        request.hook(request.key, request.config)
    mod = schedule_request(func, request, target)
    t_sched = time.perf_counter()
    ex, source, cubin = lower_and_compile(mod, target)
    t_build = time.perf_counter()
    so_path = mod_json = export_error = probe_json = None
    if request.want_module:
        so_path, mod_json, export_error = export(ex, mod, request)
        probe_json = request.func_json if request.config is not None else tvm.ir.save_json(mod["main"])
    t_end = time.perf_counter()
    phases = BuildPhases(schedule_s=t_sched - t0, compile_s=t_build - t_sched, export_s=t_end - t_build,
                         start_s=wall_start, end_s=time.time())
    return BuildArtifact(request.key, source, cubin.registers, cubin.spill_bytes, cubin.shared_bytes, cubin.binary,
                         cubin.log, so_path, mod_json, export_error, phases, probe_json)


def rebuild_with_cubin(mod_json: str, target, cubin: bytes):
    """Parent-side fallback when a worker could not export a library: lower the scheduled
    module again, but hand TVM the worker's cubin instead of running nvcc."""
    install_compile_callback()
    mod = tvm.ir.load_json(mod_json)
    target = as_target(target)
    _FORCED_CUBIN.append(cubin)
    try:
        with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
            return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(mod)).mod
    finally:
        _FORCED_CUBIN.pop()


# -- the probe ------------------------------------------------------------------------------
#: the probe process's inputs, by (func_json, seed), most recently used last. Several functions
#: of a model are tuned at once and their probes interleave: with one cached workload each
#: switch re-made a function's random inputs (hundreds of ms for a weight matrix) while the
#: GPU turn was held
PROBE_INPUTS: OrderedDict = OrderedDict()
#: what the cache may hold: workloads, and bytes of device memory
PROBE_CACHE_ENTRIES, PROBE_CACHE_BYTES = 16, 8 << 30


#: the probe process's GPU (:func:`init_probe_worker`)
PROBE_DEVICE = [0]


def init_probe_worker(device: int = 0) -> int:
    """The probe process of GPU ``device``: TVM with its own CUDA context there (made now,
    while candidates build)."""
    PROBE_DEVICE[0] = device
    tvm.cuda(device).exist  # noqa: B018 - creates the context
    return os.getpid()


def probe_candidate(so_path: str, func_json: str, seed: int) -> bool:
    """Run a built module once, in the probe process, on the same random inputs the tuning
    process times and checks it with (``Workload(func, seed)``: identical values, so an index
    read from an input is the one the real run reads). A kernel that faults (illegal address,
    ...) poisons only this process's CUDA context; one that hangs is killed by the pool's
    timeout. Raises on any error."""
    from fastdlight.measure.timing import function_name

    wl = probe_inputs(func_json, seed)
    mod = tvm.runtime.load_module(so_path)
    mod[function_name(mod, wl.func)](*wl.args)
    wl.dev.sync()
    return True


def probe_inputs(func_json: str, seed: int):
    """The probe process's inputs for a function, made on first use (a task of its own, sent
    ahead of the first probe: see :meth:`stages.Prober.prepare`)."""
    from fastdlight.measure.workload import Workload

    return probe_workload(func_json, seed, lambda: Workload(load_func(func_json), tvm.cuda(PROBE_DEVICE[0]), seed))


def prepare_probe_inputs(func_json: str, seed: int) -> bool:
    probe_inputs(func_json, seed)
    return True


def probe_workload(func_json: str, seed: int, make):
    key = (func_json, seed)
    if key in PROBE_INPUTS:
        PROBE_INPUTS.move_to_end(key)
        return PROBE_INPUTS[key]
    wl = PROBE_INPUTS[key] = make()
    while len(PROBE_INPUTS) > 1 and (len(PROBE_INPUTS) > PROBE_CACHE_ENTRIES
                                      or sum(w.bytes for w in PROBE_INPUTS.values()) > PROBE_CACHE_BYTES):
        PROBE_INPUTS.popitem(last=False)
    return wl
