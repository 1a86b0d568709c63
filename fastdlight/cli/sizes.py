"""The tensors of the built-in operators, and the size checks made on them before any work
starts (no TVM: ``fastdlight.ops`` builds the same tensors with TVM, and a test holds the two
to the same shapes and dtypes).

An 8 PiB matmul operand used to be "tuned" (every candidate compiled, none could ever run), and
a 2^62-element add spent minutes in the tile search before failing: sizes no GPU can hold are
refused in one line, naming the tensor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fastdlight.analysis.dtypes import OP_DTYPES as DTYPES
from fastdlight.analysis.dtypes import FP8_DTYPES, default_out_dtype
from fastdlight.arch.table import GPUS_BY_TAG, LARGEST_DRAM_BYTES

#: input dtypes each operator takes (``fastdlight.ops`` refuses the others)
OP_DTYPES = {
    "matmul": ("float16", "bfloat16", "float32", "int8", "float8_e4m3fn", "float8_e5m2"),
    "gemv": ("float16", "bfloat16", "float32", "int8"),
    "add": DTYPES,
    "copy": DTYPES,
    "bias_relu": DTYPES,
    "sum": ("float16", "bfloat16", "float32"),
    "max": ("float16", "bfloat16", "float32"),
    "softmax": ("float16", "bfloat16", "float32"),
    "conv2d": ("float16", "bfloat16", "float32", "int8"),
    "attention": ("float16", "bfloat16", "float32"),
}
LAYOUTS = ("NN", "NT", "TN", "TT")
#: a dimension must be an int64 (TVM's widest index type)
MAX_DIM = 2**63 - 1
#: the hardware model a machine without a GPU tunes for
DEFAULT_TARGET = "nvidia/nvidia-h100"


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return -(-math.prod(self.shape) * dtype_bits(self.dtype) // 8)

    def __str__(self) -> str:
        return f"{self.name} ({'x'.join(map(str, self.shape))} {self.dtype})"


def dtype_bits(dtype: str) -> int:
    """Bits of one element of a TVM dtype: float16 16, float8_e4m3fn 8, float16x4 64, bool 8."""
    bits = re.match(r"\D*(\d+)", dtype)
    lanes = re.search(r"x(\d+)$", dtype)
    return (int(bits.group(1)) if bits else 8) * (int(lanes.group(1)) if lanes else 1)


def conv_output(h: int, w: int, r: int, stride: int, pad: int) -> tuple[int, int]:
    return (h + 2 * pad - r) // stride + 1, (w + 2 * pad - r) // stride + 1


def matmul_layout(args) -> str:
    """The matmul's layout: ``--layout``, by default NN (NT for float8 inputs, which Hopper's
    tensor cores read K-major only)."""
    return (args.layout or ("NT" if args.dtype in FP8_DTYPES else "NN")).upper()


def op_tensors(op: str, dims: list[int], args) -> list[Tensor]:
    """The parameters of the PrimFunc ``fastdlight.ops`` builds for ``op`` and the arguments
    (``dtype``, ``out_dtype``, ``layout``, ``batch``, ``m``, ``axis``, ``kernel``, ``stride``,
    ``pad``, ``kv_heads``), in order, the output last."""
    dt, out = args.dtype, args.out_dtype or default_out_dtype(args.dtype)
    if op == "matmul" and getattr(args, "weight_dtype", None) in ("int4", "int8"):
        m, n, k = dims
        groups, per_word = (n, k // args.group_size), 32 // int(args.weight_dtype[3:])
        return [Tensor("X", (m, k), dt), Tensor("Q", (n, k // per_word), "uint32"), Tensor("S", groups, dt),
                *([Tensor("Z", groups, dt)] if args.zero_point else []), Tensor("Y", (m, n), dt)]
    if op == "matmul" and getattr(args, "scales", None):
        m, n, k = dims
        rows = {"A": (m,), "B": (n,)} if args.scales == "row" else {"A": (1,), "B": (1,)}
        return [Tensor("A", (m, k), dt), Tensor("B", (n, k), dt), Tensor("SA", rows["A"], "float32"),
                Tensor("SB", rows["B"], "float32"), Tensor("D", (m, n), out)]
    if op == "matmul":
        m, n, k = dims
        pre = (args.batch,) if args.batch else ()
        layout = matmul_layout(args)
        a = (k, m) if layout[0] == "T" else (m, k)
        b = (n, k) if layout[1] == "T" else (k, n)
        return [Tensor("A", pre + a, dt), Tensor("B", pre + b, dt), Tensor("C", pre + (m, n), out)]
    if op == "gemv":
        n, k = dims
        return [Tensor("X", (args.m, k), dt), Tensor("W", (n, k), dt), Tensor("Y", (args.m, n), out)]
    if op in ("add", "copy", "bias_relu"):
        shape = tuple(dims)
        second = {"add": [Tensor("B", shape, dt)], "copy": [], "bias_relu": [Tensor("bias", shape[-1:], dt)]}[op]
        return [Tensor("A", shape, dt), *second, Tensor("C" if second else "B", shape, dt)]
    if op in ("sum", "max"):
        rows, cols = dims
        return [Tensor("A", (rows, cols), dt), Tensor("B", (rows,) if args.axis == -1 else (cols,), dt)]
    if op == "softmax":
        return [Tensor("A", tuple(dims), dt), Tensor("softmax", tuple(dims), dt)]
    if op == "attention":
        b, h, tq, tkv, d = dims
        g = args.kv_heads or h
        return [Tensor("Q", (b, h, tq, d), dt), Tensor("K", (b, g, tkv, d), dt), Tensor("V", (b, g, tkv, d), dt),
                Tensor("out", (b, h, tq, d), dt)]
    n, h, w, c, k = dims
    p, q = conv_output(h, w, args.kernel, args.stride, args.pad)
    r = args.kernel
    if dt in ("float16", "bfloat16") and args.out_dtype is None:  # the OHWI form (see workload.make_op)
        return [Tensor("data", (n, h, w, c), dt), Tensor("weight", (k, r, r, c), dt), Tensor("out", (n, p, q, k), dt)]
    return [Tensor("data", (n, h, w, c), dt), Tensor("W", (r, r, c, k), dt), Tensor("out", (n, p, q, k), out)]


def early_memory_bound(target: str | None, gpu_nodes: bool) -> tuple[int, str]:
    """(bytes, what has that memory) before TVM is loaded: the table's row of a tag it knows, or
    the default model on a machine without a GPU; else the most any GPU has (the exact check
    follows once the target is resolved)."""
    tag = DEFAULT_TARGET if target is None and not gpu_nodes else (target or "").strip()
    if tag in GPUS_BY_TAG:
        return GPUS_BY_TAG[tag].dram_bytes, GPUS_BY_TAG[tag].name
    return LARGEST_DRAM_BYTES, "the largest GPU"


def size_text(n: float) -> str:
    """Bytes in binary units, three significant digits: ``8 PiB``, ``160 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def too_large(tensors: list[Tensor], memory: int, holder: str) -> str | None:
    """Why ``tensors`` cannot be on a GPU with ``memory`` bytes (``holder`` names it), or None."""
    for t in tensors:
        if math.prod(t.shape) > MAX_DIM:
            return f"{t} has {math.prod(t.shape)} elements, more than int64 indexing reaches"
    biggest = max(tensors, key=lambda t: t.nbytes)
    if biggest.nbytes > memory:
        return f"{biggest} is {size_text(biggest.nbytes)}, more than the {size_text(memory)} of {holder}"
    total = sum(t.nbytes for t in tensors)
    if total > memory:
        return (f"its tensors need {size_text(total)} together ({', '.join(t.name for t in tensors)}), "
                f"more than the {size_text(memory)} of {holder}")
    return None
