"""Turning a scheduled IRModule into CUDA source and a real cubin.

Without a GPU driver, ``tvm.compile`` silently returns a module holding only CUDA *source*
(nothing went through nvcc), so "it compiled" must be checked by compiling that source
ourselves. :func:`compile_cubin` is the one place that does it; tests and the compile-only
mode of ``apply_and_build`` both use it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.target import Target

from fastdlight.compiler import nvrtc
from fastdlight.compiler.dependent_launch import dependent_launch, without_dependent_launch

#: PassContext options every fastdlight build uses (cp.async lowering needs the first one;
#: CSE would hoist ``threadIdx.x * 8`` out of tensor-core fragment offsets, and LowerWarpMemory
#: then cannot find the lane coefficient of ldmatrix/mma warp buffers).
PASS_CONFIG = {"tirx.use_async_copy": True, "tirx.disable_cse_tir": True}


def _lower_every_warp_buffer() -> None:
    """Work around a TVM 0.27 bug: ``tirx.transform.LowerWarpMemory`` rewrites only the *first*
    warp-scope allocation of each statement sequence (it stops after one), so the other
    tensor-core fragments (ldmatrix/mma ``warp`` buffers) stay 32x too large in local memory.
    Re-run the original pass until the module stops changing (a no-op without warp buffers)."""
    transform = tvm.tirx.transform
    original = getattr(transform.LowerWarpMemory, "fastdlight_original", transform.LowerWarpMemory)

    @tvm.transform.module_pass(opt_level=0, name="tirx.LowerWarpMemoryAll")
    def lower_all(mod, _ctx):
        for _ in range(16):
            lowered = original()(mod)
            if tvm_ffi.structural_equal(lowered, mod):
                break
            mod = lowered
        return mod

    def LowerWarpMemory():  # noqa: N802 - same name as the TVM pass it replaces
        return lower_all

    LowerWarpMemory.fastdlight_original = original
    transform.LowerWarpMemory = LowerWarpMemory


_lower_every_warp_buffer()


class CompileError(RuntimeError):
    """nvcc/ptxas rejected a kernel; the message carries the compiler's log."""


@dataclass(frozen=True)
class Cubin:
    binary: bytes
    registers: int  # per thread, max over kernels
    spill_bytes: int  # spill stores + loads, summed over kernels
    shared_bytes: int  # static shared memory, max over kernels
    log: str


def as_target(target) -> Target:
    return target if isinstance(target, Target) else Target(target)


def nvcc_arch(target) -> str:
    """The ``sm_XY[a]`` string nvcc should build for."""
    arch = str(as_target(target).attrs.get("arch", ""))
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"target {target} has no usable CUDA arch (got {arch!r})")
    return arch


def build(mod: tvm.IRModule, target) -> tvm.runtime.Module:
    """``tvm.compile`` with fastdlight's pass config. On a machine with a GPU driver the result
    is runnable; without one it only carries CUDA source (see module docstring)."""
    target = as_target(target)
    with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
        return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(mod))


#: attribute of a PrimFunc written in TIRx (a hand-built kernel such as the wgmma template's)
TIRX_KERNEL = "tirx.kernel"
#: the TIR pipeline that lowers each PrimFunc of a module with the pipeline it was written for
HYBRID_PIPELINE = "fastdlight.hybrid"


def is_tirx_kernel(func) -> bool:
    attrs = getattr(func, "attrs", None)
    return isinstance(func, tvm.tirx.PrimFunc) and attrs is not None and bool(attrs.get(TIRX_KERNEL, False))


def is_dispatcher(func) -> bool:
    """A dispatcher of ``schedules.symbolic``: its branches are lowered up to the host/device split."""
    from fastdlight.schedules.symbolic import DISPATCHER

    attrs = getattr(func, "attrs", None)
    return isinstance(func, tvm.tirx.PrimFunc) and attrs is not None and DISPATCHER in attrs


#: our pipelines for a module of s_tir functions only (none asking for options of its own) and
#: of TIRx kernels only: TVM's, then :func:`dependent_launch`
S_TIR_PIPELINE, TIRX_PIPELINE = "fastdlight.s_tir", "fastdlight.tirx"
#: kernels built by fastdlight are launched as programmatic dependents (:mod:`.dependent_launch`);
#: ``FASTDLIGHT_DEPENDENT_LAUNCH=0`` builds them as TVM does (an A/B, or a launcher without it)
DEPENDENT_LAUNCH = os.environ.get("FASTDLIGHT_DEPENDENT_LAUNCH", "1") != "0"


def tir_pipeline(mod: tvm.IRModule) -> str:
    """TIRx's pipeline for a module of TIRx kernels only, TVM's default for scheduled (s_tir)
    functions only, else the hybrid pipeline, which lowers each function with its own: TVM's
    s_tir pipeline cannot lower a TIRx kernel, the TIRx pipeline cannot lower s_tir blocks, and a
    dispatcher (its branches lowered each by its own, up to the split) needs only the rest; the
    hybrid one also lowers functions that carry options of their own under them. Each makes the
    kernels programmatic dependents, once."""
    _register_pipelines()
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    if not _needs_own_lowering(mod):
        return S_TIR_PIPELINE
    from fastdlight.schedules.wgmma.template import register_codegen_fixes

    register_codegen_fixes()  # a kernel may come from a database record, never built here
    if all(is_tirx_kernel(f) for f in funcs) and len(funcs) == len(list(mod.functions_items())):
        return TIRX_PIPELINE
    return HYBRID_PIPELINE


def _then_dependent_launch(lower: tvm.transform.Pass) -> tvm.transform.Pass:
    return tvm.transform.Sequential([lower, dependent_launch if DEPENDENT_LAUNCH else without_dependent_launch])


def _dependent(factory):
    """Pipeline ``factory()`` (its lowering, host and device finalization) with the kernels
    made programmatic dependents after its lowering."""

    def pipeline(**kwargs):
        lower, finalize_host, finalize_device = factory(**kwargs)
        return _then_dependent_launch(lower), finalize_host, finalize_device

    return pipeline


def _register_pipelines() -> None:
    from tvm.s_tir import pipeline as _s_tir  # noqa: F401 - registers "s_tir"
    from tvm.tirx import compilation_pipeline as cp

    if HYBRID_PIPELINE in cp.PIPELINE_MAP:
        return

    def hybrid():
        _, finalize_host, finalize_device = _stock_s_tir()()
        return _lower_each_by_its_own(), finalize_host, finalize_device

    cp.register_tir_pipeline(HYBRID_PIPELINE, hybrid)
    cp.register_tir_pipeline(S_TIR_PIPELINE, _dependent(_stock_s_tir()))
    cp.register_tir_pipeline(TIRX_PIPELINE, _dependent(cp.tirx_pipeline))


#: attribute of a tuned PrimFunc: the PassContext options its lowering needs (PASS_CONFIG). A
#: plain ``tvm.compile`` runs under the caller's PassContext, which has none of them, so they
#: travel with the function and :func:`route_default_pipeline` lowers it under them
PASS_CONFIG_ATTR = "fastdlight.pass_config"


def with_pass_config(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` carrying the PassContext options fastdlight lowers its kernels under."""
    return func.with_attr(PASS_CONFIG_ATTR, PASS_CONFIG)


def _own_config(func) -> tuple:
    """The options ``func`` asks its lowering for, as a hashable key (empty: the caller's)."""
    attrs = getattr(func, "attrs", None)
    if attrs is None or PASS_CONFIG_ATTR not in attrs:
        return ()
    return tuple(sorted((str(k), v) for k, v in attrs[PASS_CONFIG_ATTR].items()))  # values: Python scalars


def _needs_own_lowering(mod: tvm.IRModule) -> bool:
    return any(is_tirx_kernel(f) or is_dispatcher(f) or _own_config(f) for _, f in mod.functions_items())


def _stock_s_tir():
    """TVM's own s_tir pipeline factory (the one :func:`route_default_pipeline` wraps)."""
    from tvm.s_tir import pipeline as _s_tir  # noqa: F401 - registers "s_tir"
    from tvm.tirx import compilation_pipeline as cp

    factory = cp.PIPELINE_MAP["s_tir"]
    return getattr(factory, "fastdlight_stock", factory)


def _lower_each_by_its_own() -> tvm.transform.Pass:
    """Each PrimFunc lowered with the pipeline it was written for (TIRx kernels with TIRx's,
    dispatchers from the host/device split on, the rest with s_tir's), under the PassContext
    options it carries (:data:`PASS_CONFIG_ATTR`) on top of the caller's."""
    from tvm.tirx import compilation_pipeline as cp

    from fastdlight.schedules.wgmma.template import register_codegen_fixes

    tirx_pass, _, _ = cp.get_tir_pipeline("tirx")
    s_tir_pass = _stock_s_tir()()[0]
    runs = {"tirx": tirx_pass, "dispatcher": _after_split(), "s_tir": s_tir_pass}

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.HybridTIRPipeline")
    def lower(mod, _ctx):
        groups: dict[tuple, dict] = {}
        for gvar, func in mod.functions_items():
            kind = "tirx" if is_tirx_kernel(func) else "dispatcher" if is_dispatcher(func) else "s_tir"
            groups.setdefault((kind, _own_config(func)), {})[gvar] = func
        if any(kind != "s_tir" for kind, _ in groups):
            register_codegen_fixes()  # a kernel may come from a database record, never built here
        out = tvm.IRModule(attrs=mod.attrs)
        for (kind, config), funcs in sorted(groups.items(), key=lambda g: list(runs).index(g[0][0])):
            with _context_with(dict(config)):
                out.update(runs[kind](tvm.IRModule(funcs, attrs=mod.attrs)))
        return out

    return _then_dependent_launch(lower)


def _context_with(config: dict) -> tvm.transform.PassContext:
    """The current PassContext with ``config``'s options added (itself when there are none)."""
    current = tvm.transform.PassContext.current()
    if not config:
        return current
    merged = {str(k): v for k, v in current.config.items()}
    merged.update(config)
    return tvm.transform.PassContext(opt_level=current.opt_level, required_pass=list(current.required_pass),
                                     disabled_pass=list(current.disabled_pass), config=merged)


def route_default_pipeline() -> None:
    """Make TVM's default TIR pipeline (``"s_tir"``, what a plain ``tvm.compile`` runs) lower a
    module holding fastdlight's kernels as :data:`HYBRID_PIPELINE` does: a Dlight user builds a
    tuned module with ``tvm.compile``, whose s_tir pipeline cannot lower a TIRx kernel or a
    dispatcher's pre-lowered branches and lacks the options the tuned kernels need. A module
    without them is lowered by TVM's pipeline exactly as before. Idempotent."""
    from tvm.tirx import compilation_pipeline as cp

    stock = _stock_s_tir()
    if cp.PIPELINE_MAP["s_tir"] is not stock:
        return

    def routed(**kwargs):
        s_tir_pass, finalize_host, finalize_device = stock(**kwargs)
        own = []

        @tvm.transform.module_pass(opt_level=0, name="fastdlight.RoutedSTIRPipeline")
        def lower(mod, _ctx):
            if not _needs_own_lowering(mod):
                return s_tir_pass(mod)
            if not own:
                own.append(_lower_each_by_its_own())
            return own[0](mod)

        return lower, finalize_host, finalize_device

    routed.fastdlight_stock = stock
    cp.register_tir_pipeline("s_tir", routed)


def _pipeline_passes(kind: str) -> list:
    """The passes TVM's ``kind`` ("s_tir" or "tirx") pipeline would run under the current
    PassContext, in order: its pipeline function builds the list and runs it through
    ``Sequential``, so it is called with a ``Sequential`` that records the list instead."""
    from tvm.s_tir import pipeline as s_tir_pipeline
    from tvm.tirx import compilation_pipeline as cp

    make = s_tir_pipeline.default_s_tir_pipeline if kind == "s_tir" else cp.tirx_pipeline
    recorded = []

    class _Record:
        def __init__(self, passes):
            recorded.extend(passes)

        def __call__(self, mod):
            return mod

    original = tvm.ir.transform.Sequential
    tvm.ir.transform.Sequential = _Record
    try:
        make()[0](tvm.IRModule())
    finally:
        tvm.ir.transform.Sequential = original
    return recorded


def _split_at(passes: list) -> int:
    return next(i for i, p in enumerate(passes) if p.info.name.rsplit(".", 1)[-1] == "SplitHostDevice")


def _after_split() -> tvm.transform.Pass:
    passes = _pipeline_passes("tirx")  # SplitHostDevice, LowerIket, MakePackedAPI, storage legalization
    return tvm.transform.Sequential(passes[_split_at(passes):])


def pre_lower(func: tvm.tirx.PrimFunc, target) -> tvm.tirx.PrimFunc:
    """``func`` through its own pipeline (TIRx or s_tir) up to the host/device split, for a
    dispatcher branch: kernels under host conditions lower only this way (the s_tir pipeline's
    barrier planning refuses a kernel inside a condition; the TIRx one cannot lower blocks)."""
    target = as_target(target)
    with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
        passes = _pipeline_passes("tirx" if is_tirx_kernel(func) else "s_tir")
        mod = tvm.tirx.transform.BindTarget(target)(tvm.IRModule({"main": func}))
        return tvm.transform.Sequential(passes[: _split_at(passes)])(mod)["main"]


def cuda_source(built) -> str:
    """The CUDA source of a module returned by :func:`build` (a Relax VM executable nests the
    device module one level deeper: imports are searched breadth-first)."""
    todo = [getattr(built, "mod", built)]
    for m in todo:
        todo.extend(m.imports)
        try:
            src = m.inspect_source()
        except Exception:  # noqa: BLE001 - host/LLVM modules carry no CUDA source
            continue
        if "__global__" in src:
            return src
    raise ValueError("built module carries no CUDA source")


COMPILER_ENV = nvrtc.COMPILER_ENV


def cuda_compiler() -> str:
    """``"nvrtc"`` or ``"nvcc"`` (:func:`.nvrtc.compiler_choice`); CompileError for a choice
    that cannot be honoured."""
    try:
        return nvrtc.compiler_choice()
    except nvrtc.CompilerChoiceError as e:
        raise CompileError(str(e)) from None


#: the first line of the log of a cubin that nvcc compiled after NVRTC had rejected its source
NVRTC_REJECTED = "NVRTC rejected this source; nvcc compiled it. NVRTC said:"


def compile_cubin(source: str, target, timeout: float = 300.0, threads: int = 1) -> Cubin:
    """Compile CUDA ``source`` to a cubin for ``target``'s arch, parse ptxas' resource report,
    and raise :class:`CompileError` (with the log) when it does not compile. NVRTC first where
    :func:`cuda_compiler` picks it; a source it rejects gets nvcc's verdict too. ``threads``:
    kernels of the source optimized at a time (:func:`.nvrtc.split_compile`)."""
    arch = nvcc_arch(target)
    if cuda_compiler() == "nvrtc":
        try:
            return _cubin(*nvrtc.compile_source(source, arch, threads))
        except nvrtc.NvrtcError as e:
            cubin = _nvcc_cubin(source, arch, timeout, threads)
            return dataclasses.replace(cubin, log=f"{NVRTC_REJECTED}\n{str(e)[-2000:]}\n{cubin.log}")
    return _nvcc_cubin(source, arch, timeout, threads)


def _nvcc_cubin(source: str, arch: str, timeout: float, threads: int = 1) -> Cubin:
    nvcc = nvrtc.nvcc_command()
    digits = arch[3:]
    with tempfile.TemporaryDirectory(prefix="fastdlight_") as tmp:
        src_path = os.path.join(tmp, "kernel.cu")
        out_path = os.path.join(tmp, "kernel.cubin")
        with open(src_path, "w") as f:
            f.write(source)
        cmd = [
            nvcc, "--cubin", "-O3", f"-gencode=arch=compute_{digits},code=sm_{digits}",
            "-Xptxas=-v", *nvrtc.LANGUAGE_FLAGS, *nvrtc.split_compile(threads), "-diag-suppress=177,550",
            "-o", out_path, src_path,
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError as e:
            raise CompileError("nvcc not found: install the CUDA toolkit or set CUDA_HOME") from e
        except subprocess.TimeoutExpired as e:
            raise CompileError(f"nvcc timed out after {timeout:.0f} s") from e
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:  # the reason on the first line: callers often keep only that one
            raise CompileError(f"nvcc failed for {arch}: {first_error_line(log)}\n{log[-4000:]}")
        with open(out_path, "rb") as f:
            return _cubin(f.read(), log)


def first_error_line(text: str) -> str:
    """The line of a compiler log that says what went wrong, its spaces collapsed: the first
    naming an error or a fatal one (``nvcc fatal : Unsupported gpu architecture 'compute_70'``
    has no "error" in it), else the first line."""
    lines = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        low = ln.lower()
        if "error" in low or "fatal" in low:
            return ln
    return lines[0] if lines else "unknown error"


def _cubin(binary: bytes, log: str) -> Cubin:
    """A cubin with the numbers of ptxas' ``-v`` report in ``log`` (nvcc's and NVRTC's alike)."""
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", log)]
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", log)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    return Cubin(binary, max(regs, default=0), sum(spills), max(smem, default=0), log)


def compile_mod_to_cubin(mod: tvm.IRModule, target) -> tuple[str, Cubin]:
    """Schedule → CUDA source → cubin, with no GPU needed. Returns (source, cubin)."""
    src = cuda_source(build(mod, target))
    return src, compile_cubin(src, target)
