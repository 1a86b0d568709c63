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
  backend) within fastdlight's per-element bound (:func:`fastdlight.tune.verify.allowed_error`),
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

import argparse
import json
import keyword
import math
import os
import re
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Any

#: the magic bytes that open every data file (version 1 of its layout)
DATA_MAGIC = b"FDLXDAT1"
#: the dynamic shared memory a kernel may use without opting in
DEFAULT_SMEM_LIMIT = 48 * 1024
#: nvcc flags the tuner compiles candidates with (fastdlight.tune.compile.compile_cubin)
NVCC_FLAGS = "-O3 --use_fast_math -std=c++17 -diag-suppress=177,550"

#: parameter dtype -> (C type, size in bytes, TMA data type)
_CTYPES = {
    "float16": ("half", 2, "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"),
    "bfloat16": ("__nv_bfloat16", 2, "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"),
    "float32": ("float", 4, "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"),
    "float64": ("double", 8, "CU_TENSOR_MAP_DATA_TYPE_FLOAT64"),
    "int8": ("int8_t", 1, "CU_TENSOR_MAP_DATA_TYPE_UINT8"),
    "uint8": ("uint8_t", 1, "CU_TENSOR_MAP_DATA_TYPE_UINT8"),
    "int16": ("int16_t", 2, "CU_TENSOR_MAP_DATA_TYPE_UINT16"),  # (TVM encodes no int16 maps)
    "uint16": ("uint16_t", 2, "CU_TENSOR_MAP_DATA_TYPE_UINT16"),
    "int32": ("int32_t", 4, "CU_TENSOR_MAP_DATA_TYPE_INT32"),
    "uint32": ("uint32_t", 4, "CU_TENSOR_MAP_DATA_TYPE_UINT32"),
    "int64": ("int64_t", 8, "CU_TENSOR_MAP_DATA_TYPE_INT64"),
    "uint64": ("uint64_t", 8, "CU_TENSOR_MAP_DATA_TYPE_UINT64"),
    "bool": ("bool", 1, "CU_TENSOR_MAP_DATA_TYPE_UINT8"),
}
_LAUNCH_AXES = {"blockIdx.x": ("grid", 0), "blockIdx.y": ("grid", 1), "blockIdx.z": ("grid", 2),
                "threadIdx.x": ("block", 0), "threadIdx.y": ("block", 1), "threadIdx.z": ("block", 2)}
_DYN_SMEM = "tirx.use_dyn_shared_memory"
#: C++ words a parameter must not be called (besides Python's keywords, which C++ shares mostly)
_RESERVED = {"int", "float", "double", "char", "void", "bool", "half", "long", "short", "unsigned", "signed",
             "const", "static", "inline", "stream", "auto", "new", "delete", "this", "template", "typename",
             "namespace", "struct", "union", "switch", "case", "default", "goto", "do", "register", "volatile"}
_TMA_ENCODE = "runtime.cuTensorMapEncodeTiled"


class ExportError(ValueError):
    """The function or result cannot be exported; the message is one line saying why."""


# -- what the lowered host code does ---------------------------------------------------------
@dataclass(frozen=True)
class Param:
    name: str  # a C identifier
    dtype: str
    shape: tuple[int, ...]
    output: bool

    @property
    def ctype(self) -> str:
        return _CTYPES[self.dtype][0]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _CTYPES[self.dtype][1]


@dataclass(frozen=True)
class TensorMap:
    """One ``cuTensorMapEncodeTiled`` call of the host code (dims, strides, box innermost first)."""

    name: str
    dtype: str
    param: int  # the parameter whose data it maps
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, rank - 1 of them
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int
    force_dtype: int = -1  # a CUtensorMapDataType replacing the dtype's (TVM's optional last field)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: arguments as ("param", i) | ("tensormap", j) | (int dtype, value)."""

    kernel: str
    args: tuple[tuple[str, int], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "dynamic_smem": self.dynamic_smem}


@dataclass(frozen=True)
class LaunchPlan:
    params: tuple[Param, ...]
    tensor_maps: tuple[TensorMap, ...]
    launches: tuple[Launch, ...]


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


def _int(expr, what: str) -> int:
    import tvm

    if isinstance(expr, int):
        return expr
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    raise ExportError(f"{what} is not a constant ({expr}); only static shapes can be exported")


def _call_name(call) -> str:
    return str(getattr(call.op, "name", ""))


def _c_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "arg"
    # the launcher's own names all start with fdl_
    if base[0].isdigit() or keyword.iskeyword(base) or base.startswith("fdl_") or base in _RESERVED:
        base = f"{base}_"
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


def launch_plan(lowered, func) -> LaunchPlan:
    """The kernels the host code of ``lowered`` (the module just before ``MakePackedAPI``)
    launches, in order, with their arguments and launch geometry; ``func`` is the function
    exported (its parameters, shapes and outputs)."""
    import tvm

    from .tune.measure import output_indices, param_buffers, static_shape

    hosts = [f for _, f in lowered.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and f.attrs.get("tirx.is_entry_func", False)]
    if len(hosts) != 1:
        raise ExportError(f"expected one host entry function after lowering, found {len(hosts)}")
    host = hosts[0]
    devices = {str(gv.name_hint): f for gv, f in lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and int(f.attrs.get("calling_conv", 0)) == 2}
    bufs = param_buffers(func)
    if len(host.params) != len(bufs):
        raise ExportError(f"the lowered host function has {len(host.params)} parameters, the function {len(bufs)}")
    outs, taken = set(output_indices(func)), set()
    params = []
    for i, b in enumerate(bufs):
        dtype = str(b.dtype)
        if dtype not in _CTYPES:
            raise ExportError(f"parameter {b.name} has dtype {dtype}, which the exporter does not support")
        params.append(Param(_c_name(str(b.name), taken), dtype, static_shape(b), i in outs))

    host_params = list(host.params)
    maps: list[TensorMap] = []
    map_vars: list = []
    map_names: list[str] = []
    launches: list[Launch] = []

    def lookup(var, table):
        return next((v for k, v in table if k.same_as(var)), None)

    decl_table: list = []  # (declared buffer var, the data pointer it views)

    def pointer_of(expr, depth=0) -> int:
        """The parameter whose data pointer ``expr`` is."""
        if depth < 16 and isinstance(expr, tvm.ir.Call) and _call_name(expr) == "tirx.buffer_data":
            var = expr.args[0]
            for i, p in enumerate(host_params):
                if p.same_as(var):
                    return i
            data = lookup(var, decl_table)
            if data is not None:
                return pointer_of(data, depth + 1)
        raise ExportError(f"a kernel argument ({expr}) is not a parameter's data pointer (a workspace "
                          "buffer or pointer arithmetic), which the exporter cannot reproduce")

    def argument(expr, device_param) -> tuple[str, int]:
        for j, v in enumerate(map_vars):
            if isinstance(expr, tvm.tirx.Var) and v.same_as(expr):
                return ("tensormap", j)
        if isinstance(expr, tvm.tirx.IntImm):
            dtype = str(device_param.dtype)
            if dtype not in ("int32", "int64", "uint32", "uint64"):
                raise ExportError(f"kernel argument {device_param} has dtype {dtype}")
            return (dtype, int(expr.value))
        if isinstance(expr, tvm.ir.Call) and _call_name(expr) == "tirx.buffer_data":
            return ("param", pointer_of(expr))
        raise ExportError(f"kernel argument {expr} is computed on the host, which the exporter cannot reproduce")

    def visit(stmt) -> None:
        if isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, tvm.tirx.DeclBuffer):
            decl_table.append((stmt.buffer, stmt.data))
            if hasattr(stmt, "body") and isinstance(stmt.body, tvm.tirx.Stmt):
                visit(stmt.body)
        elif isinstance(stmt, tvm.tirx.Bind):
            value = stmt.value
            if isinstance(value, tvm.ir.Call) and _call_name(value) == "tirx.tvm_stack_alloca" \
                    and str(value.args[0].value) == "tensormap":
                map_vars.append(stmt.var)
                maps.append(None)
                map_names.append(_c_name(str(stmt.var.name), taken))
            else:
                raise ExportError(f"the host code binds {stmt.var} = {value}, which the exporter cannot reproduce")
        elif isinstance(stmt, tvm.tirx.AttrStmt):
            visit(stmt.body)
        elif isinstance(stmt, tvm.tirx.AssertStmt):
            if hasattr(stmt, "body") and isinstance(stmt.body, tvm.tirx.Stmt):
                visit(stmt.body)
        elif isinstance(stmt, tvm.tirx.Evaluate) and isinstance(stmt.value, tvm.ir.Call):
            call(stmt.value)
        elif isinstance(stmt, tvm.tirx.Evaluate) and isinstance(stmt.value, tvm.tirx.IntImm):
            pass  # a no-op
        else:
            raise ExportError(f"the host code has a {type(stmt).__name__} statement (only kernel launches and "
                              "TMA descriptors can be exported)")

    def call(c) -> None:
        name = _call_name(c)
        if name == "tirx.call_ffi_kernel":
            launches.append(kernel_launch(c))
        elif name in ("tirx.tvm_call_packed", "tirx.call_packed") and str(c.args[0].value) == _TMA_ENCODE:
            tensor_map(c)
        else:
            label = c.args[0].value if c.args and hasattr(c.args[0], "value") else name
            raise ExportError(f"the host code calls {label}, which the exporter cannot reproduce")

    def tensor_map(c) -> None:
        args = list(c.args[1:])
        slot = next((j for j, v in enumerate(map_vars) if v.same_as(args[0])), None)
        if slot is None:
            raise ExportError(f"a TMA descriptor is encoded into {args[0]}, not a tensormap of the host code")
        dtype, rank = str(args[1].value), _int(args[2], "the TMA rank")
        ints = [_int(a, "a TMA descriptor field") for a in args[4:]]
        if len(ints) not in (4 * rank + 3, 4 * rank + 4):  # + an optional CUtensorMapDataType override
            raise ExportError(f"a rank-{rank} TMA descriptor has {len(ints)} fields, expected {4 * rank + 3}")
        if dtype not in _CTYPES:
            raise ExportError(f"a TMA descriptor of dtype {dtype} is not supported")
        dims, rest = ints[:rank], ints[rank:]
        strides, rest = rest[: rank - 1], rest[rank - 1:]
        box, rest = rest[:rank], rest[rank:]
        estrides, rest = rest[:rank], rest[rank:]
        force = rest[4] if len(rest) > 4 else -1
        maps[slot] = TensorMap(map_names[slot], dtype, pointer_of(args[3]), tuple(dims), tuple(strides),
                               tuple(box), tuple(estrides), *rest[:4], force)

    def kernel_launch(c) -> Launch:
        kernel = str(c.args[0].value)
        device = devices.get(kernel)
        if device is None:
            raise ExportError(f"the host code launches {kernel}, which is not a device function of the module")
        tags = [str(t) for t in c.attrs.launch_params]
        values = list(c.args[1:])
        n_args = len(values) - len(tags)
        if n_args != len(device.params):
            raise ExportError(f"{kernel} takes {len(device.params)} arguments; the host passes {n_args}")
        grid, block, smem = [1, 1, 1], [1, 1, 1], 0
        for tag, value in zip(tags, values[n_args:]):
            v = _int(value, f"the {tag} extent of {kernel}")
            if tag == _DYN_SMEM:
                smem = v
            elif tag in _LAUNCH_AXES:
                which, axis = _LAUNCH_AXES[tag]
                (grid if which == "grid" else block)[axis] = v
            else:
                raise ExportError(f"{kernel} has the launch parameter {tag}, which the exporter does not support")
        args = tuple(argument(a, p) for a, p in zip(values[:n_args], device.params))
        return Launch(kernel, args, tuple(grid), tuple(block), smem)

    visit(host.body)
    if not launches:
        raise ExportError("the lowered function launches no kernel")
    if any(m is None for m in maps):
        raise ExportError("a tensormap of the host code is never encoded")
    return LaunchPlan(tuple(params), tuple(maps), tuple(launches))


def lower(mod, target) -> tuple[str, Any]:
    """(CUDA source, the module just before ``MakePackedAPI``) of a scheduled module."""
    import tvm

    from .tune.build_task import install_compile_callback
    from .tune.compile import PASS_CONFIG, as_target, cuda_source, tir_pipeline

    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    install_compile_callback()  # with a CUDA runtime, tvm.compile runs nvcc: fastdlight's own call
    snaps = []

    @tvm.instrument.pass_instrument
    class _KeepBeforePackedAPI:
        def run_before_pass(self, m, info):
            if info.name == "tirx.MakePackedAPI":
                snaps.append(m)

    target = as_target(target)
    with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG, instruments=[_KeepBeforePackedAPI()]):
        built = tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(mod))
    if not snaps:
        raise ExportError("lowering never reached MakePackedAPI: no host code to read the launches from")
    lowered = snaps[0]
    for extra in snaps[1:]:  # a hybrid pipeline lowers TIRx kernels and scheduled functions apart
        lowered.update(extra)
    return cuda_source(built), lowered


def check_against_source(plan: LaunchPlan, source: str) -> None:
    """Every launched kernel is defined in the source, with launch bounds equal to its block."""
    for launch in plan.launches:
        m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\((\d+)\)\s+)?" + re.escape(launch.kernel) + r"\s*\(",
                      source)
        if m is None:
            raise ExportError(f"kernel {launch.kernel} is launched but not defined in the CUDA source")
        threads = math.prod(launch.block)
        if m.group(1) is not None and int(m.group(1)) != threads:
            raise ExportError(f"{launch.kernel}: the host launches {threads} threads per block, the source's "
                              f"__launch_bounds__ says {m.group(1)}")
        if threads > 1024:
            raise ExportError(f"{launch.kernel}: {threads} threads per block")


# -- the files ----------------------------------------------------------------------------------
def _tma_dtype(tm: TensorMap) -> str:
    return f"(CUtensorMapDataType){tm.force_dtype}" if tm.force_dtype >= 0 else _CTYPES[tm.dtype][2]


def _launch_args(plan: LaunchPlan) -> str:
    return ", ".join([f"{'' if p.output else 'const '}{p.ctype}* {p.name}" for p in plan.params]
                     + ["cudaStream_t stream"])


def header_text(name: str, source: str, plan: LaunchPlan, note: str) -> str:
    uses_bf16 = any(p.dtype == "bfloat16" for p in plan.params)
    lines = [
        f"// {name}.cuh: generated by fastdlight.export; {note}",
        "// CUDA source by Apache TVM; include this header in exactly one translation unit and build",
        f"// with nvcc {NVCC_FLAGS} -gencode=arch=compute_XX,code=sm_XX (the exported arch).",
        f"#ifndef FASTDLIGHT_{name.upper()}_CUH_",
        f"#define FASTDLIGHT_{name.upper()}_CUH_",
        "#include <cuda_runtime.h>",
        "#include <cuda_fp16.h>",
        *(["#include <cuda_bf16.h>"] if uses_bf16 else []),
        *(["#include <cuda.h>"] if plan.tensor_maps else []),
        "#include <cstdint>",
        "",
        "// ---- TVM-generated CUDA source ----",
        source.rstrip(),
        "// ---- end of TVM-generated CUDA source ----",
        "",
    ]
    if plan.tensor_maps:
        lines += [
            f"typedef CUresult (*{name}_encode_tiled_t)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,",
            "    const cuuint64_t*, const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,",
            "    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);",
            "",
            "// cuTensorMapEncodeTiled from the driver, found through the runtime (no -lcuda needed).",
            f"static inline {name}_encode_tiled_t {name}_encode_tiled() {{",
            f"  static {name}_encode_tiled_t fn = nullptr;",
            "  if (fn == nullptr) {",
            "    void* p = nullptr;",
            "    cudaDriverEntryPointQueryResult found;",
            "#if CUDART_VERSION >= 12050",
            '    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) '
            "== cudaSuccess &&",
            "#else",
            '    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found) == cudaSuccess &&',
            "#endif",
            "        found == cudaDriverEntryPointSuccess) {",
            f"      fn = ({name}_encode_tiled_t)p;",
            "    }",
            "  }",
            "  return fn;",
            "}",
            "",
        ]
    lines += [
        f"// Runs {name} on device pointers (row-major, contiguous) on `stream`; returns the first error.",
        f"static inline cudaError_t {name}_launch({_launch_args(plan)}) {{",
        "  cudaError_t fdl_err = cudaSuccess;",
    ]
    if plan.tensor_maps:
        lines += [f"  {name}_encode_tiled_t fdl_encode = {name}_encode_tiled();",
                  "  if (fdl_encode == nullptr) return cudaErrorNotSupported;"]
    for tm in plan.tensor_maps:
        rank = len(tm.dims)
        lines += [
            f"  alignas(64) CUtensorMap {tm.name};",
            "  {",
            f"    const cuuint64_t fdl_dims[{rank}] = {{{', '.join(f'{d}ULL' for d in tm.dims)}}};",
            f"    const cuuint64_t fdl_strides[{max(rank - 1, 1)}] = {{{', '.join(f'{s}ULL' for s in tm.strides) or '0'}}};",
            f"    const cuuint32_t fdl_box[{rank}] = {{{', '.join(f'{b}u' for b in tm.box)}}};",
            f"    const cuuint32_t fdl_element_strides[{rank}] = {{{', '.join(f'{e}u' for e in tm.element_strides)}}};",
            f"    if (fdl_encode(&{tm.name}, {_tma_dtype(tm)}, {rank}, (void*){plan.params[tm.param].name}, fdl_dims, "
            f"fdl_strides, fdl_box, fdl_element_strides, (CUtensorMapInterleave){tm.interleave}, (CUtensorMapSwizzle){tm.swizzle}, "
            f"(CUtensorMapL2promotion){tm.l2_promotion}, (CUtensorMapFloatOOBfill){tm.oob_fill}) != CUDA_SUCCESS) "
            "return cudaErrorInvalidValue;",
            "  }",
        ]
    for k, launch in enumerate(plan.launches):
        lines.append(f"  {{  // kernel {k}: {launch.kernel}")
        refs = []
        for j, (kind, value) in enumerate(launch.args):
            if kind == "param":
                lines.append(f"    void* fdl_a{j} = (void*){plan.params[value].name};")
                refs.append(f"&fdl_a{j}")
            elif kind == "tensormap":
                refs.append(f"(void*)&{plan.tensor_maps[value].name}")
            else:
                lines.append(f"    {kind}_t fdl_a{j} = {value};")
                refs.append(f"&fdl_a{j}")
        if launch.dynamic_smem > DEFAULT_SMEM_LIMIT:
            lines += [f"    fdl_err = cudaFuncSetAttribute((const void*){launch.kernel}, "
                      f"cudaFuncAttributeMaxDynamicSharedMemorySize, {launch.dynamic_smem});",
                      "    if (fdl_err != cudaSuccess) return fdl_err;"]
        g, b = launch.grid, launch.block
        lines += [
            f"    void* fdl_args[] = {{{', '.join(refs) or 'nullptr'}}};",
            f"    fdl_err = cudaLaunchKernel((const void*){launch.kernel}, dim3({g[0]}, {g[1]}, {g[2]}), "
            f"dim3({b[0]}, {b[1]}, {b[2]}), fdl_args, {launch.dynamic_smem}, stream);",
            "    if (fdl_err != cudaSuccess) return fdl_err;",
            "  }",
        ]
    lines += ["  return fdl_err;", "}", "", f"#endif  // FASTDLIGHT_{name.upper()}_CUH_", ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class OutputCheck:
    """How the example judges one output: ``float`` (|got - expected| <= allowed, per element;
    an infinity of the right sign where the exact value passes ``limit``) or ``exact``."""

    param: int
    mode: str  # "float" | "exact"
    limit: float


def _data_sections(plan: LaunchPlan, inputs: dict, expected) -> tuple[list[bytes], list[OutputCheck]]:
    """The data file's sections: each input's bytes (parameter order), then per output the
    expected values (float32, or int64 for exact outputs) and the allowed error (float32)."""
    import numpy as np

    from .tune.measure import _bf16_bits
    from .tune.verify import MAX_FINITE, allowed_error

    sections, checks = [], []
    for i, p in enumerate(plan.params):
        if not p.output:
            arr = inputs[i]
            raw = _bf16_bits(arr) if p.dtype == "bfloat16" else np.ascontiguousarray(arr, dtype=np.dtype(p.dtype))
            sections.append(raw.tobytes())
    outs = [i for i, p in enumerate(plan.params) if p.output]
    for i, ref, mag, kind, out_dtype in zip(outs, expected.outputs, expected.magnitudes, expected.kinds,
                                            expected.out_dtypes):
        ref64 = np.asarray(ref, dtype=np.float64)
        if out_dtype.startswith(("float", "bfloat")):
            allowed = allowed_error(ref64, mag, kind, out_dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                ref32 = ref64.astype(np.float32)
                slack = np.where(np.isfinite(ref64), np.abs(ref64 - ref32.astype(np.float64)), 0.0)
            need = allowed + slack  # float32 storage of the expected value widens the bound by its rounding
            allowed32 = need.astype(np.float32)
            allowed32 = np.where(allowed32.astype(np.float64) < need, np.nextafter(allowed32, np.float32(np.inf)),
                                 allowed32).astype(np.float32)
            sections += [ref32.tobytes(), allowed32.tobytes()]
            limit = min((MAX_FINITE.get(d, math.inf) for d in (kind.narrow_dtype, kind.inner_dtype)), default=math.inf)
            checks.append(OutputCheck(i, "float", limit))
        else:
            sections.append(np.rint(ref64).astype(np.int64).tobytes())
            checks.append(OutputCheck(i, "exact", math.inf))
    return sections, checks


def _to_double(p: Param, host: str) -> str:
    if p.dtype == "float16":
        return f"(double)__half2float(((const half*){host})[i])"
    if p.dtype == "bfloat16":
        return f"(double)__bfloat162float(((const __nv_bfloat16*){host})[i])"
    return f"(double)((const {p.ctype}*){host})[i]"


def example_text(name: str, plan: LaunchPlan, checks: list[OutputCheck], sizes: list[int], reference: str) -> str:
    params = plan.params
    inputs = [i for i, p in enumerate(params) if not p.output]
    total = len(DATA_MAGIC) + sum(sizes)
    L = [
        f"// {name}_example.cu: generated by fastdlight.export. Runs {name}_launch on the inputs stored in",
        f"// {name}_data.bin, checks every output element against the {reference} (computed at export",
        "// time) within fastdlight's per-element bound, then times the launch with CUDA events: inputs rotated",
        "// through copies so none is in L2, launches queued between events, median of the samples.",
        f"// Usage: ./{name}_example [{name}_data.bin] [budget_ms]",
        f'#include "{name}.cuh"',
        "#include <algorithm>",
        "#include <cmath>",
        "#include <cstdio>",
        "#include <cstdlib>",
        "#include <cstring>",
        "#include <vector>",
        "",
        "#define FDL_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \\",
        '    fprintf(stderr, "%s:%d: %s failed: %s\\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(2); } } while (0)',
        "",
        "struct Check { size_t bad = 0, total = 0, worst_at = 0; double max_err = 0, worst = 0, got = 0, want = 0, tol = 0; };",
        "",
        "static void judge(Check& c, size_t i, double got, double want, double tol, double limit) {",
        "  bool ok;",
        "  double err = std::fabs(got - want);",
        "  if (std::isfinite(want)) {",
        "    ok = err <= tol || (std::isinf(got) && std::signbit(got) == std::signbit(want) && std::fabs(want) + tol >= limit);",
        "    if (std::isfinite(err)) c.max_err = std::max(c.max_err, err);",
        "  } else {",
        "    ok = got == want || (std::isnan(want) && std::isnan(got));",
        "  }",
        "  c.total++;",
        "  if (!ok) {",
        "    double score = std::isfinite(err) && tol > 0 ? err / tol : INFINITY;",
        "    if (c.bad == 0 || score > c.worst) { c.worst = score; c.worst_at = i; c.got = got; c.want = want; c.tol = tol; }",
        "    c.bad++;",
        "  }",
        "}",
        "",
        "int main(int argc, char** argv) {",
        f'  const char* path = argc > 1 ? argv[1] : "{name}_data.bin";',
        "  const double budget_ms = argc > 2 ? atof(argv[2]) : 100.0;",
        '  FILE* f = fopen(path, "rb");',
        '  if (f == nullptr) { fprintf(stderr, "cannot open %s\\n", path); return 2; }',
        f"  std::vector<char> data({total}ULL + 1);",
        "  const size_t got_bytes = fread(data.data(), 1, data.size(), f);",
        "  fclose(f);",
        f'  if (got_bytes != {total}ULL || memcmp(data.data(), "{DATA_MAGIC.decode()}", 8) != 0) {{',
        f'    fprintf(stderr, "%s is not the data file of this export (%zu bytes, expected {total})\\n", path, got_bytes);',
        "    return 2;",
        "  }",
        "  cudaDeviceProp prop;",
        "  FDL_CHECK(cudaGetDeviceProperties(&prop, 0));",
        "  cudaStream_t stream;",
        "  FDL_CHECK(cudaStreamCreate(&stream));",
    ]
    offset = len(DATA_MAGIC)
    section = iter(sizes)
    in_bytes = sum(params[i].nbytes for i in inputs)
    L += [
        "  // rotate through enough copies of the inputs that at least twice the L2 is read between two",
        "  // uses of one copy (fastdlight.tune.measure.rotation_copies)",
        f"  const size_t in_bytes = {in_bytes}ULL;",
        "  const double l2 = std::max<double>(prop.l2CacheSize, 8 << 20);",
        "  int copies = in_bytes == 0 ? 1 : 1 + (int)std::ceil(2 * l2 / (double)in_bytes);",
        "  const size_t fit = std::max<size_t>(1, (4ULL << 30) / std::max<size_t>(in_bytes, 1));",
        "  copies = (int)std::max<size_t>(1, std::min<size_t>({(size_t)copies, fit, 256}));",
    ]
    for i, p in enumerate(params):
        if p.output:
            L.append(f"  void* d{i} = nullptr;  // output {p.name}: {p.dtype}{list(p.shape)}")
            L.append(f"  FDL_CHECK(cudaMalloc(&d{i}, {p.nbytes}ULL));")
        else:
            size = next(section)
            L += [f"  std::vector<void*> d{i}(copies);  // input {p.name}: {p.dtype}{list(p.shape)}",
                  f"  for (int c = 0; c < copies; ++c) {{",
                  f"    FDL_CHECK(cudaMalloc(&d{i}[c], {p.nbytes}ULL));",
                  f"    FDL_CHECK(cudaMemcpy(d{i}[c], data.data() + {offset}ULL, {p.nbytes}ULL, cudaMemcpyHostToDevice));",
                  "  }"]
            offset += size
    call_args = [f"({'' if p.output else 'const '}{p.ctype}*)" + (f"d{i}" if p.output else f"d{i}[c]")
                 for i, p in enumerate(params)]
    L += [
        f"  auto launch = [&](int c) {{ return {name}_launch({', '.join(call_args + ['stream'])}); }};",
        "",
        "  // 1. check: outputs poisoned (NaN / a sentinel), one launch, every element judged",
    ]
    for chk in checks:
        p = params[chk.param]
        if chk.mode == "float":
            L.append(f"  FDL_CHECK(cudaMemset(d{chk.param}, 0xFF, {p.nbytes}ULL));  // NaN")
        else:
            L.append(f"  FDL_CHECK(cudaMemset(d{chk.param}, 0x5A, {p.nbytes}ULL));  // a sentinel")
    L += ["  FDL_CHECK(launch(0));", "  FDL_CHECK(cudaStreamSynchronize(stream));", "  Check total;", "  bool pass = true;"]
    for chk in checks:
        p = params[chk.param]
        n = math.prod(p.shape)
        exp_off = offset
        size = next(section)
        offset += size
        L += [f"  {{  // output {p.name}",
              f"    std::vector<char> host({p.nbytes}ULL);",
              f"    FDL_CHECK(cudaMemcpy(host.data(), d{chk.param}, host.size(), cudaMemcpyDeviceToHost));",
              "    Check c;"]
        if chk.mode == "float":
            tol_off = offset
            offset += next(section)
            limit = "INFINITY" if math.isinf(chk.limit) else repr(float(chk.limit))
            L += [f"    const float* want = (const float*)(data.data() + {exp_off}ULL);",
                  f"    const float* tol = (const float*)(data.data() + {tol_off}ULL);",
                  f"    for (size_t i = 0; i < {n}ULL; ++i) judge(c, i, {_to_double(p, 'host.data()')}, want[i], tol[i], {limit});"]
        else:
            L += [f"    const int64_t* want = (const int64_t*)(data.data() + {exp_off}ULL);",
                  f"    for (size_t i = 0; i < {n}ULL; ++i) judge(c, i, {_to_double(p, 'host.data()')}, (double)want[i], 0.0, INFINITY);"]
        L += ["    if (c.bad) {",
              f'      printf("{p.name}: %zu of %zu elements out of bound; worst at flat index %zu: got %.6g, expected %.6g '
              '(allowed +-%.3g)\\n", c.bad, c.total, c.worst_at, c.got, c.want, c.tol);',
              "      pass = false;",
              "    }",
              "    total.bad += c.bad; total.total += c.total; total.max_err = std::max(total.max_err, c.max_err);",
              "  }"]
    L += [
        '  printf("%s: %s\\n", prop.name, pass ? "all elements within bound" : "MISMATCH");',
        f'  printf("check: %zu of %zu elements within the bound against the {reference}, max |error| %.4g\\n",',
        "         total.total - total.bad, total.total, total.max_err);",
        "",
        "  // 2. time: warm-up over every copy, then samples of `number` queued launches between events",
        "  int state = 0;",
        "  auto run = [&](int k) { for (int j = 0; j < k; ++j) { FDL_CHECK(launch(state % copies)); ++state; } };",
        "  cudaEvent_t start, stop;",
        "  FDL_CHECK(cudaEventCreate(&start));",
        "  FDL_CHECK(cudaEventCreate(&stop));",
        "  run(copies);",
        "  float per_launch = 0;",
        "  for (int k : {1, 4}) {",
        "    FDL_CHECK(cudaEventRecord(start, stream));",
        "    run(k);",
        "    FDL_CHECK(cudaEventRecord(stop, stream));",
        "    FDL_CHECK(cudaEventSynchronize(stop));",
        "    FDL_CHECK(cudaEventElapsedTime(&per_launch, start, stop));",
        "    per_launch /= k;",
        "  }",
        "  const int number = std::max(1, (int)std::ceil(0.5 / std::max(per_launch, 1e-4f)));",
        "  const double sample_s = per_launch * number / 1e3;",
        "  const int lo = sample_s > 0.01 ? 5 : 10;",
        "  const int n_samples = (int)std::min(2000.0, std::max((double)lo, budget_ms / 1e3 / std::max(sample_s, 1e-7)));",
        "  std::vector<cudaEvent_t> ev(2 * std::min(n_samples, 50));",
        "  for (auto& e : ev) FDL_CHECK(cudaEventCreate(&e));",
        "  std::vector<float> samples;",
        "  while ((int)samples.size() < n_samples) {",
        "    const int batch = std::min<int>(n_samples - (int)samples.size(), (int)ev.size() / 2);",
        "    for (int s = 0; s < batch; ++s) {",
        "      FDL_CHECK(cudaEventRecord(ev[2 * s], stream));",
        "      run(number);",
        "      FDL_CHECK(cudaEventRecord(ev[2 * s + 1], stream));",
        "    }",
        "    FDL_CHECK(cudaEventSynchronize(ev[2 * batch - 1]));",
        "    for (int s = 0; s < batch; ++s) {",
        "      float ms = 0;",
        "      FDL_CHECK(cudaEventElapsedTime(&ms, ev[2 * s], ev[2 * s + 1]));",
        "      samples.push_back(ms / number);",
        "    }",
        "  }",
        "  FDL_CHECK(cudaGetLastError());",
        "  std::vector<float> sorted = samples;",
        "  std::sort(sorted.begin(), sorted.end());",
        "  const size_t m = sorted.size();",
        "  const double median = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);",
        f'  printf("time: median %.4f ms, min %.4f ms ({name}_launch; %zu samples of %d launches, inputs rotated through %d copies)\\n",',
        "         median, sorted[0], m, number, copies);",
        '  printf("%s\\n", pass ? "PASS" : "FAIL");',
        "  return pass ? 0 : 1;",
        "}",
        "",
    ]
    return "\n".join(L)


# -- inputs and the reference -------------------------------------------------------------------
def make_inputs(func, seed: int = 0) -> dict:
    """Random inputs by parameter index, the values the tuner's ``Workload(func, seed)`` uses."""
    import numpy as np

    from .tune.measure import index_bounds, output_indices, param_buffers, random_array, static_shape

    rng = np.random.default_rng(seed)
    bounds, outs = index_bounds(func), set(output_indices(func))
    inputs = {}
    for i, buf in enumerate(param_buffers(func)):
        if i in outs:
            continue
        shape, dtype = static_shape(buf), str(buf.dtype)
        if str(buf.name) in bounds:
            inputs[i] = rng.integers(0, bounds[str(buf.name)], size=shape).astype(dtype)
        else:
            inputs[i] = random_array(shape, dtype, rng)
    return inputs


def reference_outputs(func, inputs: dict, ref=None):
    """:class:`fastdlight.tune.verify.Expected` for ``inputs``: the numpy ``ref`` when given,
    else ``func`` widened to float64 and run on the CPU (TVM's LLVM backend)."""
    from .tune.verify import expected_from_numpy

    host_inputs = [inputs[i] for i in sorted(inputs)]
    if ref is not None:
        return expected_from_numpy(ref, host_inputs, func)
    return _cpu_reference(func, inputs)


def _cpu_reference(func, inputs: dict):
    import numpy as np
    import tvm

    from .tune.measure import output_indices, param_buffers, static_shape
    from .tune.verify import Reference, expected_from_outputs, magnitude_inputs, output_kinds, widen_to_float64

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
        abs_outputs = run(dict(zip(keys, magnitude_inputs([inputs[k] for k in keys]))))
    return expected_from_outputs(outputs, abs_outputs, func,
                                 Reference("float64 twin of the function run on the CPU by TVM (LLVM)", "naive"))


# -- what to export ----------------------------------------------------------------------------
def _resolve(func_or_result, target, topk, options, opt_shapes, database, overrides, config=None):
    """(function, config, template, tuned latency or None, arch)."""
    import tvm

    from .arch import CUDA, auto_arch
    from .policies.prepare import specialize
    from .tune.candidate import CompileResult
    from .tune.candidates import Tuned, tune_function
    from .tune.database import TuningDatabase
    from .tune.options import TuneOptions

    arch = target if isinstance(target, CUDA) else auto_arch(target)
    if isinstance(func_or_result, CompileResult):
        r = func_or_result
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
    if tuned.best is not None:
        return tuned.best._func, tuned.best.config, tuned.best._template, tuned.best.latency_ms, arch
    return func, tuned.config, None, None, arch  # a database hit, not rebuilt


def _check_out_dir(out_dir: str, force: bool) -> None:
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
    import tvm

    from . import __version__
    from .tune import build_task

    out_dir = os.fspath(out_dir)
    if name is not None and not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ExportError(f"bad name {name!r}: use a C identifier")
    _check_out_dir(out_dir, force)
    func, config, template, latency_ms, arch = _resolve(func_or_result, target, topk, options, opt_shapes,
                                                        database, overrides, config)
    name = name or re.sub(r"\W", "_", _default_name(func))
    try:
        with arch.target:
            mod = build_task.as_module(build_task.apply_template(func, config, template))
    except Exception as e:  # noqa: BLE001 - a stale config, a template bug
        raise ExportError(f"the config {config!r} does not apply to the function: {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    source, lowered = lower(mod, arch.target)
    plan = launch_plan(lowered, func)
    check_against_source(plan, source)

    inputs = make_inputs(func, seed)
    expected = reference_outputs(func, inputs, ref)
    sections, checks = _data_sections(plan, inputs, expected)
    sections = [s + b"\0" * (-len(s) % 8) for s in sections]  # every section starts 8-byte aligned
    reference = expected.reference
    sm = str(arch.target.attrs.get("arch", ""))
    timed = f"{latency_ms:.4f} ms (tuner, median)" if latency_ms is not None else "not timed"
    note = f"config {config!r}, target {arch.name} ({sm}), tuned latency: {timed}; fastdlight {__version__}, TVM {tvm.__version__}"
    header = header_text(name, source, plan, note)
    example = example_text(name, plan, checks, [len(s) for s in sections], reference)
    gencode = f"-gencode=arch=compute_{sm[3:]},code={sm}"  # -arch=sm_90a would also build compute_90 PTX
    build_command = f"nvcc {NVCC_FLAGS} {gencode} {name}_example.cu -o {name}_example"
    makefile = "\n".join([
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
    launch_sig = f"cudaError_t {name}_launch({_launch_args(plan)})"
    kernels = "\n".join(f"- `{ln.kernel}`: grid {ln.grid}, block {ln.block}, {ln.dynamic_smem} bytes of dynamic "
                        "shared memory" for ln in plan.launches)
    readme = "\n".join([
        f"# {name}: exported by fastdlight",
        "",
        f"Tuned for {arch.name} ({sm}) with {config!r}; tuned latency: {timed}.",
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
        "Makefile": makefile.encode(),
        "README.md": readme.encode(),
        f"{name}.json": (json.dumps(manifest, indent=1) + "\n").encode(),
    }
    _write_atomically(out_dir, files, force)
    path = os.path.abspath(out_dir)
    return ExportResult(path, name, *(os.path.join(path, f) for f in files if not f.endswith(".json")),
                        os.path.join(path, f"{name}.json"), build_command, plan.launches, config, latency_ms, reference)


# -- the command line ---------------------------------------------------------------------------
def add_parser(sub) -> argparse.ArgumentParser:
    """``fastdlight export``: the operator spec of ``fastdlight tune`` plus ``--out``."""
    from .cli import OPS, _positive, _shape_var
    from .tune.options import DEFAULT_BUDGET_MS, DEFAULT_SCREEN_MS, DEFAULT_TIMEOUT

    p = sub.add_parser(
        "export", help="tune one operator (or a TVMScript PrimFunc) and export it for C++ hosts",
        description="Tune like 'fastdlight tune', then write OUT/NAME.cuh (the kernels and NAME_launch), "
        "OUT/NAME_example.cu (checks the result against a float64 reference and times it), its data, a Makefile "
        "and a README with the nvcc command. Operators: " + "; ".join(f"{k} {d}" for k, (_, d) in OPS.items()) + ".",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    p.add_argument("op", nargs="?", help=f"operator: {', '.join(OPS)}")
    p.add_argument("shape", nargs="*", help="dimensions, e.g. 'softmax 4096 4096'")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (must not exist, or be empty)")
    p.add_argument("--name", help="C name of the export (default: the function's)")
    p.add_argument("--force", action="store_true", help="replace DIR when it is not empty")
    p.add_argument("--file", help="export the TVMScript PrimFunc in this Python file instead of OP")
    p.add_argument("--func", help="with --file: the PrimFunc (or IRModule function) to export")
    p.add_argument("--shape-var", action="append", type=_shape_var, default=[], metavar="NAME=VALUE",
                   help="give a symbolic dimension of the --file function a value (repeatable)")
    p.add_argument("--dtype", default="float16", help="input dtype")
    p.add_argument("--out-dtype", help="output/accumulator dtype (default: from --dtype)")
    p.add_argument("--layout", default="NN", help="matmul layout: NN, NT, TN (T: stored transposed)")
    p.add_argument("--batch", type=int, help="matmul: batch size (batched matmul)")
    p.add_argument("--m", type=int, default=1, help="gemv: rows of X")
    p.add_argument("--axis", type=int, default=-1, choices=(-1, 0), help="sum/max: reduced axis")
    p.add_argument("--kernel", type=int, default=3, help="conv2d: kernel size R=S")
    p.add_argument("--stride", type=int, default=1, help="conv2d: stride")
    p.add_argument("--pad", type=int, default=1, help="conv2d: padding")
    p.add_argument("--topk", type=_positive(int), default=20, help="candidates to build and time")
    p.add_argument("--target", help="TVM target or tag (default: the live GPU, else nvidia/nvidia-h100)")
    p.add_argument("--no-measure", action="store_true", help="compile only; export the top-ranked candidate")
    p.add_argument("--workers", type=_positive(int), help="build processes (default: one per CPU)")
    p.add_argument("--serial", action="store_true", help="build in this process (no worker pool)")
    p.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT, help="seconds one candidate may take to build")
    p.add_argument("--budget-ms", type=_positive(float), default=DEFAULT_BUDGET_MS, help="timing budget of each finalist")
    p.add_argument("--screen-ms", type=_positive(float), default=DEFAULT_SCREEN_MS, help="timing budget of the first pass")
    p.add_argument("--seed", type=int, default=0, help="seed of the example's random inputs")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(json=None)
    return p


def run(args) -> int:
    """The ``fastdlight export`` command: bad input exits 2 with one line (nothing written);
    a tuning run where no candidate works exits 1."""
    from .cli import UsageError

    try:
        return _run(args)
    except UsageError as e:  # printed here: under ``python -m fastdlight.cli`` the caller's class differs
        print(f"fastdlight: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from .cli import UsageError, _describe, _one_line, _validate, _workload, resolve_arch
    from .tune.runner import TuningError

    _validate(args)
    if args.name is not None and not re.fullmatch(r"[A-Za-z_]\w*", args.name):
        raise UsageError(f"bad --name {args.name!r}: use a C identifier")
    out = os.path.abspath(args.out)
    try:
        _check_out_dir(out, args.force)
    except ExportError as e:
        raise UsageError(str(e)) from None
    if not args.serial:  # start the build workers now: they import TVM while we do
        from .tune.pool import shared_pool

        shared_pool(args.workers).warm_up()
    fname, func, ref, _flops, _nbytes, _mb, opt_shapes = _workload(args)
    arch, can_measure, notice = resolve_arch(args.target)
    measure = can_measure and not args.no_measure
    if notice:
        print(notice)
    print(f"Exporting {_describe(args, fname)} for {arch.name} ({arch.arch}), top {args.topk} candidates"
          + ("" if measure else ", compile-only"))
    try:
        result = export(func, out, name=args.name or re.sub(r"\W", "_", fname), target=arch, topk=args.topk,
                        ref=ref, opt_shapes=opt_shapes, seed=args.seed, force=args.force, measure=measure,
                        parallel_build=not args.serial, max_workers=args.workers, timeout=args.timeout,
                        budget_ms=args.budget_ms, screen_ms=args.screen_ms,
                        progress=not args.quiet and sys.stderr.isatty())
    except ExportError as e:
        raise UsageError(str(e)) from None
    except (ValueError, NotImplementedError) as e:  # the policy cannot analyze this function
        raise UsageError(f"cannot export {fname}: {_one_line(e)}") from None
    except TuningError as e:
        print(str(e), file=sys.stderr)
        print("fastdlight: export failed: no candidate could be used", file=sys.stderr)
        return 1
    timed = f"{result.latency_ms:.4f} ms (tuner)" if result.latency_ms is not None else "not timed"
    print(f"Exported {result.config!r}, {timed}, to {result.out_dir}:")
    for ln in result.launches:
        print(f"  {ln.kernel}<<<{ln.grid}, {ln.block}, {ln.dynamic_smem}>>>")
    print(f"Build and run: cd {result.out_dir} && {result.build_command} && ./{result.name}_example")
    return 0


__all__ = ["export", "ExportError", "ExportResult", "Launch", "LaunchPlan", "launch_plan", "lower"]


class _CallableModule(types.ModuleType):
    """``fastdlight.export(...)`` calls :func:`export` once this submodule is imported too (the
    import binds the module to the package attribute), as ``fastdlight.tune`` does."""

    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
