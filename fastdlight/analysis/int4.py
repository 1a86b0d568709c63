"""Weight-only 4-bit matmul as one PrimFunc: what it computes (:class:`Int4MatmulShape`), its TIR
(:func:`int4_matmul_func`), and how a template recognizes it again (:func:`match_int4_matmul`).

``Y[..., n] = sum_k X[..., k] * W[n, k]`` with ``W[n, k] = (q[n, k] - z) * S[n, k // group]``:
``q`` packed eight to a uint32 word along K (``Q[n, k // 8]``, the lowest nibble first), ``S``
the group scales, ``z`` 8 (symmetric) or the group's ``Z[n, k // group]``; fp32 sums. The
function carries its shape as the attribute ``fastdlight.int4_matmul`` (the dequantizing GEMV
template reads it instead of re-deriving the bit arithmetic from the blocks); a function that
fusion rebuilt around it (an epilogue) carries none and is scheduled as any other.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tvm import te, tirx

ATTR = "fastdlight.int4_matmul"
#: 4-bit values a uint32 word of packed weights holds (the lowest nibble is the first along K)
INT4_PER_WORD = 8
ACTIVATION_DTYPES = ("float16", "bfloat16")
#: weights one lane of the dequantizing GEMV takes a step: one 128-bit load of four packed words
LANE_WEIGHTS = 4 * INT4_PER_WORD
#: most activation rows (decode batch) that GEMV takes; more go to the tensor-core templates
GEMV_MAX_ROWS = 16
#: shared memory the GEMV's copy of the activations may take
GEMV_MAX_X_BYTES = 96 * 1024


@dataclass(frozen=True)
class Int4MatmulShape:
    lead: tuple[int, ...]  # the activations' leading dims (rows: their product)
    n: int
    k: int
    group_size: int
    dtype: str = "float16"  # activations and scales
    out_dtype: str = "float16"
    zero_point: bool = False

    def __post_init__(self):
        object.__setattr__(self, "lead", tuple(int(d) for d in self.lead))
        if self.group_size <= 0 or self.group_size % INT4_PER_WORD or self.k % self.group_size:
            raise ValueError(f"group size {self.group_size} must be a multiple of {INT4_PER_WORD} dividing K={self.k}")
        if self.dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"4-bit matmul activations must be one of {ACTIVATION_DTYPES}, got {self.dtype!r}")

    @property
    def m(self) -> int:
        return math.prod(self.lead)

    @property
    def groups(self) -> int:
        return self.k // self.group_size

    def param_shapes(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of X, Q, S, (Z,) Y, in parameter order."""
        scales = [((self.n, self.groups), self.dtype)] * (2 if self.zero_point else 1)
        return [(self.lead + (self.k,), self.dtype), ((self.n, self.k // INT4_PER_WORD), "uint32"), *scales,
                (self.lead + (self.n,), self.out_dtype)]

    def to_attr(self) -> dict:
        d = asdict(self)
        d["lead"] = list(self.lead)
        return d


def int4_matmul_te(X, Q, S, Z, group_size: int, out_dtype: str):
    """``Y[..., n] = sum_k X[..., k] * W[n, k]`` over the 4-bit weights ``Q`` (``[N, K / 8]``
    uint32), scales ``S`` and zeros ``Z`` (None: 8) dequantized elementwise (a block the
    schedules inline into the product's loads); fp32 sums, the result in ``out_dtype``."""
    dtype = S.dtype

    def weight(j, kk):
        word = Q[j, kk // INT4_PER_WORD]
        q = ((word >> (kk % INT4_PER_WORD * 4).astype("uint32")) & tirx.const(15, "uint32")).astype(dtype)
        zero = Z[j, kk // group_size] if Z is not None else tirx.const(8, dtype)
        return (q - zero) * S[j, kk // group_size]

    n, k = Q.shape[0], X.shape[-1]
    W = te.compute((n, k), weight, name="W")
    r = te.reduce_axis((0, k), name="k")
    lead = tuple(X.shape[:-1])
    acc = te.compute(lead + (n,), lambda *ax: te.sum(X[ax[:-1] + (r,)].astype("float32")
                                                     * W[ax[-1], r].astype("float32"), axis=r), name="Y_acc")
    return te.compute(lead + (n,), lambda *ax: acc[ax].astype(out_dtype), name="Y")


def int4_matmul_func(shape: Int4MatmulShape, name: str = "matmul_int4") -> tirx.PrimFunc:
    """The PrimFunc of ``shape``: parameters X, Q, S, (Z,) Y; it carries :data:`ATTR`."""
    X = te.placeholder(shape.lead + (shape.k,), shape.dtype, name="X")
    Q = te.placeholder((shape.n, shape.k // INT4_PER_WORD), "uint32", name="Q")
    S = te.placeholder((shape.n, shape.groups), shape.dtype, name="S")
    Z = te.placeholder((shape.n, shape.groups), shape.dtype, name="Z") if shape.zero_point else None
    Y = int4_matmul_te(X, Q, S, Z, shape.group_size, shape.out_dtype)
    tensors = [X, Q, S] + ([Z] if Z is not None else []) + [Y]
    return te.create_prim_func(tensors).with_attr("global_symbol", name).with_attr(ATTR, shape.to_attr())


def match_int4_matmul(func: tirx.PrimFunc) -> Int4MatmulShape | None:
    """The shape ``func`` computes if it is an :func:`int4_matmul_func` (its attribute, with
    buffers that still agree with it), else None."""
    attrs = func.attrs
    if attrs is None or ATTR not in attrs:
        return None
    raw = attrs[ATTR]
    try:
        shape = Int4MatmulShape(
            lead=tuple(int(d) for d in raw["lead"]), n=int(raw["n"]), k=int(raw["k"]),
            group_size=int(raw["group_size"]), dtype=str(raw["dtype"]), out_dtype=str(raw["out_dtype"]),
            zero_point=bool(raw["zero_point"]))
    except (KeyError, TypeError, ValueError):
        return None
    want = shape.param_shapes()
    if len(func.params) != len(want):
        return None
    for param, (dims, dtype) in zip(func.params, want):
        buf = param  # TIRx parameters are the buffers themselves
        if getattr(buf, "shape", None) is None or str(buf.dtype) != dtype:
            return None
        if tuple(int(x) if isinstance(x, tirx.IntImm) else None for x in buf.shape) != dims:
            return None
    return shape


def dequant_gemv_fits(shape: Int4MatmulShape) -> bool:
    """Whether the dequantizing GEMV template takes ``shape``: decode rows, K and the groups
    in whole lane steps (one scale a step), the activations in shared memory."""
    return (shape.dtype in ACTIVATION_DTYPES and shape.m <= GEMV_MAX_ROWS and shape.k % LANE_WEIGHTS == 0
            and shape.group_size % LANE_WEIGHTS == 0 and shape.m * shape.k * 2 <= GEMV_MAX_X_BYTES)


def resident_ctas(shape: Int4MatmulShape, warps: int, arch=None) -> int:
    """CTAs of ``warps`` warps that fit on one SM at once beside the staged activations (an H100's
    limits where ``arch`` is None: 2048 threads, 228 KB of shared memory)."""
    threads = arch.max_threads_per_sm if arch is not None else 2048
    smem = arch.smem_per_sm if arch is not None else 228 * 1024
    return max(1, min(threads // (32 * warps), smem // max(1, shape.m * shape.k * 2)))
