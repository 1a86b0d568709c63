"""Export a tuned kernel for C++ hosts: a CUDA header, an example program and its data.

    fastdlight.export(func, "out/")                 # tune (or replay a database hit), then export
    fastdlight.export(best, "out/", ref=op.reference)   # a CompileResult already tuned
    fastdlight export softmax 4096 4096 --out out/  # the same from the shell

``out/`` then holds, for a function called ``NAME``:

* ``NAME.cuh``: the CUDA source TVM generated for the tuned schedule (every ``__global__``
  kernel) and ``cudaError_t NAME_launch(<one pointer per parameter>, cudaStream_t stream)``,
  which launches every kernel in the order the function does, with the grid, block and dynamic
  shared memory of TVM's lowered host code (``cudaFuncSetAttribute`` above 48 KB), and encodes
  the TMA tensor maps of Hopper kernels (``cuTensorMapEncodeTiled``, reached through
  ``cudaGetDriverEntryPoint``: no ``-lcuda``). Include it in one translation unit.
* ``NAME_example.cu``: reads the inputs from ``NAME_data.bin``, launches, checks every output
  element against the float64 reference computed at export time (the operator's numpy
  reference, else the function itself widened to float64 and run on the CPU by TVM's LLVM
  backend) within fastdlight's per-element bound (:func:`fastdlight.measure.verify.allowed_error`),
  then times the launch like the tuner does (inputs rotated through copies so none is in L2,
  queued launches between CUDA events, median) and prints both.
* ``NAME_data.bin`` (inputs, expected outputs, allowed error per element), ``Makefile``,
  ``README.md`` (the build command) and ``NAME.json`` (config, launches, tuned latency).

Where the launch geometry comes from: the module is lowered by ``tvm.compile`` with a pass
instrument that keeps the IR just before ``tirx.MakePackedAPI``. There the host function is a
straight line of ``T.call_ffi_kernel(kernel, args..., launch values...)`` calls (the values
named by their ``launch_params``: ``blockIdx.*``, ``threadIdx.*``,
``tirx.use_dyn_shared_memory``), preceded, for TMA kernels, by
``T.call_packed("runtime.cuTensorMapEncodeTiled", map, dtype, rank, ptr, dims, strides, box,
element strides, interleave, swizzle, L2 promotion, OOB fill)``. Host code that does anything
else (a workspace allocation, a loop, a symbolic launch size) is refused with one line.

Nothing is half-written: files go to a temporary directory next to ``out/``, renamed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

from fastdlight.arch.stacklevel import caller_stacklevel

# the launch plan and the C++ text live in .plan and .cpp; their names stay importable from here
from fastdlight.export.cpp import (  # noqa: F401 - re-exported
    DATA_MAGIC,
    DEFAULT_SMEM_LIMIT,
    NVCC_FLAGS,
    OutputCheck,
    data_sections,
    launch_args,
    example_text,
    header_text,
)
from fastdlight.export.plan import (  # noqa: F401 - re-exported
    ExportError,
    Launch,
    LaunchPlan,
    Param,
    TensorMap,
    check_against_source,
    launch_plan,
    lower,
)


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote (paths inside ``out_dir``) and what it exported."""

    out_dir: str
    name: str
    header: str
    example: str
    data: str
    makefile: str
    readme: str
    manifest: str
    build_command: str
    launches: tuple[Launch, ...]
    config: Any
    latency_ms: float | None  # the tuner's measured median (None: not timed)
    reference: str


# -- inputs and the reference -------------------------------------------------------------------
def make_inputs(func, seed: int = 0) -> dict:
    """Random inputs by parameter index, the values the tuner's ``Workload(func, seed)`` uses."""
    from fastdlight.measure.workload import host_inputs

    return {i: a for i, a in enumerate(host_inputs(func, seed)) if a is not None}


def reference_outputs(func, inputs: dict, ref=None):
    """:class:`fastdlight.measure.verify.Expected` for ``inputs``: the numpy ``ref`` when given,
    else ``func`` widened to float64 and run on the CPU (TVM's LLVM backend)."""
    from fastdlight.measure.verify import expected_from_numpy

    host_inputs = [inputs[i] for i in sorted(inputs)]
    if ref is not None:
        return expected_from_numpy(ref, host_inputs, func)
    return _cpu_reference(func, inputs)


def _cpu_reference(func, inputs: dict):
    import numpy as np
    import tvm

    from fastdlight.measure.workload import output_indices, param_buffers, static_shape
    from fastdlight.measure.verify import Reference, expected_from_outputs, magnitude_inputs, output_kinds
    from fastdlight.measure.widen import widen_to_float64

    if not tvm.runtime.enabled("llvm"):
        raise ExportError("no numpy reference was given and TVM has no LLVM backend to run the function on the CPU")
    try:
        wide = widen_to_float64(func).with_attr("global_symbol", "main")
    except ValueError as e:
        raise ExportError(f"no numpy reference was given and {e}") from None
    with tvm.target.Target("llvm"):
        lib = tvm.compile(tvm.IRModule({"main": wide}), target="llvm")
    bufs = param_buffers(wide)
    outs = output_indices(func)
    dev = tvm.cpu()

    def run(values: dict) -> list:
        args = []
        for i, b in enumerate(bufs):
            shape = static_shape(b)
            if i in values:
                args.append(tvm.runtime.tensor(np.ascontiguousarray(values[i], dtype=str(b.dtype)), dev))
            else:
                args.append(tvm.runtime.empty(shape, str(b.dtype), dev))
        lib["main"](*args)
        return [args[i].numpy().astype(np.float64) for i in outs]

    keys = sorted(inputs)
    outputs = run(inputs)
    abs_outputs = None
    if any(k.sum_of_products for k in output_kinds(func)):
        abs_outputs = run(dict(zip(keys, magnitude_inputs([inputs[k] for k in keys], func))))
    return expected_from_outputs(outputs, abs_outputs, func,
                                 Reference("float64 twin of the function run on the CPU by TVM (LLVM)", "naive"))


# -- what to export ----------------------------------------------------------------------------
def _resolve(func_or_result, target, topk, options, opt_shapes, database, overrides, config=None):
    """(function, config, template, tuned latency or None, arch)."""
    import tvm

    from fastdlight.arch import CUDA, auto_arch
    from fastdlight.analysis.prepare import specialize
    from fastdlight.search.results import CompileResult
    from fastdlight.search.candidates import Tuned, tune_function
    from fastdlight.search.database import TuningDatabase
    from fastdlight.search.options import TuneOptions

    arch = target if isinstance(target, CUDA) else auto_arch(target)
    if isinstance(func_or_result, CompileResult):
        r = func_or_result
        if r.replayed and r._func is not None:  # a database hit: its stored config, applied again
            return r._func, r.config, None, r.latency_ms, arch
        if r._func is None or not r.compiled or r.failure is not None:
            raise ExportError(f"candidate #{r.index} ({r.config!r}) did not build: "
                              f"{r.error or 'it carries no function to re-apply its config to'}")
        if r.verified is False:
            raise ExportError(f"candidate #{r.index} failed verification ({r.check_message}); export a verified one")
        return r._func, r.config, r._template, r.latency_ms, arch
    if isinstance(func_or_result, Tuned):
        t = func_or_result
        if t.best is None:
            raise ExportError("a database replay without its function; pass the PrimFunc with database=...")
        return _resolve(t.best, arch, topk, options, opt_shapes, database, overrides)
    if not isinstance(func_or_result, tvm.tirx.PrimFunc):
        raise ExportError(f"cannot export a {type(func_or_result).__name__}: give a PrimFunc or a CompileResult")
    func = func_or_result
    if opt_shapes:
        func = specialize(func, opt_shapes)
    if config is not None:  # a config from elsewhere (a database record): applied, not tuned
        return func, config, None, None, arch
    opts = TuneOptions.of(options, **overrides)
    if database is not None and not isinstance(database, TuningDatabase):
        database = TuningDatabase(database)
    tuned = tune_function(func, arch, topk, opts, db=database)
    return tuned.best._func, tuned.best.config, tuned.best._template, tuned.best.latency_ms, arch


def check_out_dir(out_dir: str, force: bool) -> None:
    parent = os.path.dirname(os.path.abspath(out_dir))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ExportError(f"cannot export to {out_dir}: it is a file")
    if not os.path.isdir(parent):
        raise ExportError(f"cannot export to {out_dir}: no such directory {parent}")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"cannot export to {out_dir}: {parent} is not writable")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not force:
        raise ExportError(f"{out_dir} exists and is not empty (force=True / --force replaces it)")


def _default_name(func) -> str:
    attrs = getattr(func, "attrs", None)
    name = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "kernel"
    return name


def _write_atomically(out_dir: str, files: dict[str, bytes], force: bool) -> None:
    out_dir = os.path.abspath(out_dir)
    parent, base = os.path.dirname(out_dir), os.path.basename(out_dir)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    old = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for fname, content in files.items():
            with open(os.path.join(tmp, fname), "wb") as f:
                f.write(content)
        if os.path.isdir(out_dir):
            if os.listdir(out_dir):
                if not force:
                    raise ExportError(f"{out_dir} exists and is not empty (force=True / --force replaces it)")
                old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
                os.rename(out_dir, os.path.join(old, base))
            else:
                os.rmdir(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.exists(out_dir):
            os.rename(os.path.join(old, base), out_dir)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def export(func_or_result, out_dir, *, name: str | None = None, target=None, topk: int = 20, ref=None,
           options=None, opt_shapes: dict | None = None, database=None, config=None, seed: int = 0,
           force: bool = False, **overrides) -> ExportResult:
    """Export a tuned kernel to ``out_dir`` for C++ hosts (see the module docstring).

    ``func_or_result``: a PrimFunc (tuned here through the same path as ``fastdlight.tune``:
    ``target``, ``topk``, ``options``/keywords of :class:`TuneOptions`, ``opt_shapes``,
    ``database``; without a GPU candidates are compiled and ranked by predicted cost) or an
    already tuned :class:`CompileResult` (its config is re-applied). ``ref``: the float64 numpy
    reference the example checks against (default: the function widened to float64, run on
    the CPU). ``name``: the C name (default: the function's). ``out_dir`` must not exist, be
    empty, or ``force=True``. Raises :class:`ExportError` (one line) for what cannot be exported."""
    out_dir = os.fspath(out_dir)
    if name is not None and not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ExportError(f"bad name {name!r}: use a C identifier")
    check_out_dir(out_dir, force)
    func, config, template, latency_ms, arch = _resolve(func_or_result, target, topk, options, opt_shapes,
                                                        database, overrides, config)
    name = name or re.sub(r"\W", "_", _default_name(func))
    source, plan = _lowered_plan(func, config, template, arch)
    sections, checks, reference = _example_data(name, func, plan, seed, ref)
    files, build_command = _export_files(name, func, arch, config, latency_ms, source, plan, sections, checks,
                                         reference)
    _write_atomically(out_dir, files, force)
    path = os.path.abspath(out_dir)
    return ExportResult(path, name, *(os.path.join(path, f) for f in files if not f.endswith(".json")),
                        os.path.join(path, f"{name}.json"), build_command, plan.launches, config, latency_ms, reference)


def _lowered_plan(func, config, template, arch) -> tuple[str, LaunchPlan]:
    """(CUDA source, launch plan) of ``func`` scheduled by ``config`` and lowered for ``arch``,
    the plan checked against the source."""
    from fastdlight.compiler import build_task

    try:
        with arch.target:
            mod = build_task.as_module(build_task.apply_template(func, config, template))
    except Exception as e:  # noqa: BLE001 - a stale config, a template bug
        raise ExportError(f"the config {config!r} does not apply to the function: {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    source, lowered = lower(mod, arch.target)
    plan = launch_plan(lowered, func)
    check_against_source(plan, source)
    return source, plan


def _example_data(name: str, func, plan: LaunchPlan, seed: int, ref) -> tuple[list[bytes], list[OutputCheck], str]:
    """The example's data: ``NAME_data.bin``'s sections (inputs, expected outputs, allowed
    errors; each padded to 8 bytes), the example's output checks and what the expected values
    are from (a warning when the data is large)."""
    inputs = make_inputs(func, seed)
    expected = reference_outputs(func, inputs, ref)
    sections, checks = data_sections(plan, inputs, expected)
    sections = [s + b"\0" * (-len(s) % 8) for s in sections]  # every section starts 8-byte aligned
    _warn_if_large(name, len(DATA_MAGIC) + sum(map(len, sections)))
    return sections, checks, expected.reference


def _export_files(name: str, func, arch, config, latency_ms: float | None, source: str, plan: LaunchPlan,
                  sections: list[bytes], checks: list[OutputCheck], reference: str) -> tuple[dict[str, bytes], str]:
    """The exported files' contents by file name (the header, the example, its data, the
    Makefile, the README and the manifest, in :class:`ExportResult`'s order) and the example's
    build command."""
    import tvm

    from fastdlight import __version__

    sm = str(arch.target.attrs.get("arch", ""))
    timed = f"{latency_ms:.4f} ms (tuner, median)" if latency_ms is not None else "not timed"
    note = f"config {config!r}, target {arch.name} ({sm}), tuned latency: {timed}; fastdlight {__version__}, TVM {tvm.__version__}"
    header = header_text(name, source, plan, note)
    example = example_text(name, plan, checks, [len(s) for s in sections], reference)
    gencode = f"-gencode=arch=compute_{sm[3:]},code={sm}"  # -arch=sm_90a would also build compute_90 PTX
    build_command = f"nvcc {NVCC_FLAGS} {gencode} {name}_example.cu -o {name}_example"
    launch_sig = f"cudaError_t {name}_launch({launch_args(plan)})"
    readme = _readme(name, f"{arch.name} ({sm})", config, timed, launch_sig, reference, build_command, plan)
    manifest = {
        "name": name, "function": _default_name(func), "target": str(arch.target), "gpu": arch.name, "arch": sm,
        "config": config.to_dict(), "tuned_latency_ms": latency_ms, "reference": reference,
        "launch": launch_sig, "launches": [ln.to_dict() for ln in plan.launches],
        "tensor_maps": len(plan.tensor_maps), "build_command": build_command,
        "params": [{"name": p.name, "dtype": p.dtype, "shape": list(p.shape), "output": p.output} for p in plan.params],
        "fastdlight": __version__, "tvm": tvm.__version__,
    }  # fmt: skip
    files = {
        f"{name}.cuh": header.encode(),
        f"{name}_example.cu": example.encode(),
        f"{name}_data.bin": DATA_MAGIC + b"".join(sections),  # each section padded to 8 bytes
        "Makefile": _makefile(name, sm).encode(),
        "README.md": readme.encode(),
        f"{name}.json": (json.dumps(manifest, indent=1) + "\n").encode(),
    }
    return files, build_command


#: example data above this size is written with a warning (softmax 4096x4096 wrote 160 MiB unannounced)
LARGE_DATA_BYTES = 64 * 2**20


def _warn_if_large(name: str, nbytes: int) -> None:
    if nbytes > LARGE_DATA_BYTES:
        warnings.warn(f"fastdlight.export: {name}_data.bin is {nbytes / 2**20:.3g} MiB (the example's inputs, "
                      f"expected outputs and error bounds); {name}.cuh does not need it: export a smaller shape "
                      "for a small runnable example, or delete the file", stacklevel=caller_stacklevel())


def _makefile(name: str, sm: str) -> str:
    return "\n".join([
        f"# generated by fastdlight.export: {name}",
        "NVCC ?= nvcc",
        f"ARCH ?= {sm[3:]}",
        f"FLAGS ?= {NVCC_FLAGS}",
        "",
        f"{name}_example: {name}_example.cu {name}.cuh",
        f"\t$(NVCC) $(FLAGS) -gencode=arch=compute_$(ARCH),code=sm_$(ARCH) {name}_example.cu -o $@",
        "",
        f"run: {name}_example",
        f"\t./{name}_example {name}_data.bin",
        "",
        ".PHONY: run",
        "",
    ])


def _readme(name: str, gpu: str, config, timed: str, launch_sig: str, reference: str, build_command: str,
            plan) -> str:
    kernels = "\n".join(f"- `{ln.kernel}`: grid {ln.grid}, block {ln.block}, {ln.dynamic_smem} bytes of dynamic "
                        "shared memory" for ln in plan.launches)
    return "\n".join([
        f"# {name}: exported by fastdlight",
        "",
        f"Tuned for {gpu} with {config!r}; tuned latency: {timed}.",
        "",
        f"- `{name}.cuh`: the kernels (CUDA source by TVM) and `{launch_sig}`",
        f"- `{name}_example.cu`: runs it on `{name}_data.bin`, checks every output element against the "
        f"{reference} and times it",
        "",
        "Build and run (or `make run`):",
        "",
        "```",
        build_command,
        f"./{name}_example {name}_data.bin",
        "```",
        "",
        "Launches, in order:",
        kernels,
        "",
    ])


__all__ = ["export", "ExportError", "ExportResult", "Launch", "LaunchPlan", "launch_plan", "lower"]
