"""The launch plan of an export: what the lowered host code of a tuned kernel launches, in order
(kernels, arguments, grid, block, dynamic shared memory, TMA descriptors), read from the IR just
before ``tirx.MakePackedAPI`` (see :mod:`fastdlight.export`)."""

from __future__ import annotations

import keyword
import math
import os
import re
from dataclasses import dataclass
from typing import Any

#: parameter dtype -> (C type, size in bytes, TMA data type)
CTYPES = {
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
#: thread-block cluster extents (the wgmma template's 2-CTA clusters): launched with
#: ``cudaLaunchKernelExC`` and a cluster-dimension attribute
_CLUSTER_AXES = {"clusterCtaIdx.x": 0, "clusterCtaIdx.y": 1, "clusterCtaIdx.z": 2}
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
        return CTYPES[self.dtype][0]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * CTYPES[self.dtype][1]


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
    cluster: tuple[int, int, int] = (1, 1, 1)

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "dynamic_smem": self.dynamic_smem, "cluster": list(self.cluster)}


@dataclass(frozen=True)
class LaunchPlan:
    params: tuple[Param, ...]
    tensor_maps: tuple[TensorMap, ...]
    launches: tuple[Launch, ...]


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

    from fastdlight.measure.workload import output_indices, param_buffers, static_shape

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
        if dtype not in CTYPES:
            raise ExportError(f"parameter {b.name} has dtype {dtype}, which the exporter does not support")
        params.append(Param(_c_name(str(b.name), taken), dtype, static_shape(b), i in outs))
    code = _HostCode(host, devices, taken)
    code.visit(host.body)
    if not code.launches:
        raise ExportError("the lowered function launches no kernel")
    if any(m is None for m in code.maps):
        raise ExportError("a tensormap of the host code is never encoded")
    return LaunchPlan(tuple(params), tuple(code.maps), tuple(code.launches))


class _HostCode:
    """What a lowered host function does, read statement by statement: the TMA descriptors it
    encodes and the kernels it launches, in order. Anything else it cannot reproduce in C++ is an
    :class:`ExportError`."""

    def __init__(self, host, devices: dict, taken: set[str]):
        self.host_params = list(host.params)
        self.devices, self.taken = devices, taken
        self.maps: list[TensorMap | None] = []
        self.map_vars: list = []
        self.map_names: list[str] = []
        self.launches: list[Launch] = []
        self.decls: list = []  # (declared buffer var, the data pointer it views)

    def pointer_of(self, expr, depth=0) -> int:
        """The parameter whose data pointer ``expr`` is."""
        import tvm

        if depth < 16 and isinstance(expr, tvm.ir.Call) and _call_name(expr) == "tirx.buffer_data":
            var = expr.args[0]
            for i, p in enumerate(self.host_params):
                if p.same_as(var):
                    return i
            data = next((v for k, v in self.decls if k.same_as(var)), None)
            if data is not None:
                return self.pointer_of(data, depth + 1)
        raise ExportError(f"a kernel argument ({expr}) is not a parameter's data pointer (a workspace "
                          "buffer or pointer arithmetic), which the exporter cannot reproduce")

    def argument(self, expr, device_param) -> tuple[str, int]:
        import tvm

        for j, v in enumerate(self.map_vars):
            if isinstance(expr, tvm.tirx.Var) and v.same_as(expr):
                return ("tensormap", j)
        if isinstance(expr, tvm.tirx.IntImm):
            dtype = str(device_param.dtype)
            if dtype not in ("int32", "int64", "uint32", "uint64"):
                raise ExportError(f"kernel argument {device_param} has dtype {dtype}")
            return (dtype, int(expr.value))
        if isinstance(expr, tvm.ir.Call) and _call_name(expr) == "tirx.buffer_data":
            return ("param", self.pointer_of(expr))
        raise ExportError(f"kernel argument {expr} is computed on the host, which the exporter cannot reproduce")

    def visit(self, stmt) -> None:
        import tvm

        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.visit(s)
        elif isinstance(stmt, tirx.DeclBuffer):
            self.decls.append((stmt.buffer, stmt.data))
            if hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
                self.visit(stmt.body)
        elif isinstance(stmt, tirx.Bind):
            value = stmt.value
            if isinstance(value, tvm.ir.Call) and _call_name(value) == "tirx.tvm_stack_alloca" \
                    and str(value.args[0].value) == "tensormap":
                self.map_vars.append(stmt.var)
                self.maps.append(None)
                self.map_names.append(_c_name(str(stmt.var.name), self.taken))
            else:
                raise ExportError(f"the host code binds {stmt.var} = {value}, which the exporter cannot reproduce")
        elif isinstance(stmt, tirx.AttrStmt):
            self.visit(stmt.body)
        elif isinstance(stmt, tirx.AssertStmt):
            if hasattr(stmt, "body") and isinstance(stmt.body, tirx.Stmt):
                self.visit(stmt.body)
        elif isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tvm.ir.Call):
            self.call(stmt.value)
        elif isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tirx.IntImm):
            pass  # a no-op
        else:
            raise ExportError(f"the host code has a {type(stmt).__name__} statement (only kernel launches and "
                              "TMA descriptors can be exported)")

    def call(self, c) -> None:
        name = _call_name(c)
        if name == "tirx.call_ffi_kernel":
            self.launches.append(self.kernel_launch(c))
        elif name in ("tirx.tvm_call_packed", "tirx.call_packed") and str(c.args[0].value) == _TMA_ENCODE:
            self.tensor_map(c)
        else:
            label = c.args[0].value if c.args and hasattr(c.args[0], "value") else name
            raise ExportError(f"the host code calls {label}, which the exporter cannot reproduce")

    def tensor_map(self, c) -> None:
        args = list(c.args[1:])
        slot = next((j for j, v in enumerate(self.map_vars) if v.same_as(args[0])), None)
        if slot is None:
            raise ExportError(f"a TMA descriptor is encoded into {args[0]}, not a tensormap of the host code")
        dtype, rank = str(args[1].value), _int(args[2], "the TMA rank")
        ints = [_int(a, "a TMA descriptor field") for a in args[4:]]
        if len(ints) not in (4 * rank + 3, 4 * rank + 4):  # + an optional CUtensorMapDataType override
            raise ExportError(f"a rank-{rank} TMA descriptor has {len(ints)} fields, expected {4 * rank + 3}")
        if dtype not in CTYPES:
            raise ExportError(f"a TMA descriptor of dtype {dtype} is not supported")
        dims, rest = ints[:rank], ints[rank:]
        strides, rest = rest[: rank - 1], rest[rank - 1:]
        box, rest = rest[:rank], rest[rank:]
        estrides, rest = rest[:rank], rest[rank:]
        force = rest[4] if len(rest) > 4 else -1
        self.maps[slot] = TensorMap(self.map_names[slot], dtype, self.pointer_of(args[3]), tuple(dims),
                                    tuple(strides), tuple(box), tuple(estrides), *rest[:4], force)

    def kernel_launch(self, c) -> Launch:
        kernel = str(c.args[0].value)
        device = self.devices.get(kernel)
        if device is None:
            raise ExportError(f"the host code launches {kernel}, which is not a device function of the module")
        tags = [str(t) for t in c.attrs.launch_params]
        values = list(c.args[1:])
        n_args = len(values) - len(tags)
        if n_args != len(device.params):
            raise ExportError(f"{kernel} takes {len(device.params)} arguments; the host passes {n_args}")
        grid, block, cluster, smem = [1, 1, 1], [1, 1, 1], [1, 1, 1], 0
        for tag, value in zip(tags, values[n_args:]):
            v = _int(value, f"the {tag} extent of {kernel}")
            if tag == _DYN_SMEM:
                smem = v
            elif tag in _LAUNCH_AXES:
                which, axis = _LAUNCH_AXES[tag]
                (grid if which == "grid" else block)[axis] = v
            elif tag in _CLUSTER_AXES:
                cluster[_CLUSTER_AXES[tag]] = v
            else:
                raise ExportError(f"{kernel} has the launch parameter {tag}, which the exporter does not support")
        args = tuple(self.argument(a, p) for a, p in zip(values[:n_args], device.params))
        return Launch(kernel, args, tuple(grid), tuple(block), smem, tuple(cluster))


def lower(mod, target) -> tuple[str, Any]:
    """(CUDA source, the module just before ``MakePackedAPI``) of a scheduled module."""
    import tvm

    from fastdlight.compiler.build_task import install_compile_callback
    from fastdlight.compiler.compile import PASS_CONFIG, as_target, cuda_source, tir_pipeline

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
