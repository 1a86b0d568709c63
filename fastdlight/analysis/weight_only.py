"""Weight-only quantized matmul (4- or 8-bit weights) as one PrimFunc: what it computes
(:class:`WeightOnlyShape`), its TIR (:func:`weight_only_func`), and how a template recognizes it
again (:func:`match_weight_only`).

``Y[..., n] = sum_k X[..., k] * W[n, k]`` with ``W[n, k] = (q[n, k] - z) * S[n, k // group]``:
``q`` packed along K into uint32 words, eight 4-bit or four 8-bit values a word (``Q[n, k //
per_word]``, the lowest bits first), ``S`` the group scales, ``z`` the middle of the range (8 or
128: symmetric) or the group's ``Z[n, k // group]``; fp32 sums. The function carries its shape
as the attribute ``fastdlight.weight_only_matmul`` (the dequantizing GEMV template reads it
instead of re-deriving the bit arithmetic from the blocks); a function that fusion rebuilt
around it (an epilogue) carries none and is scheduled as any other.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tvm import te, tirx

from fastdlight.analysis.prepare import params_agree

ATTR = "fastdlight.weight_only_matmul"
#: bits a weight -> values a uint32 word holds
PER_WORD = {4: 8, 8: 4}
ACTIVATION_DTYPES = ("float16", "bfloat16")
#: uint32 words one lane of the dequantizing GEMV loads a step: one 128-bit load
LANE_WORDS = 4
#: most activation rows (decode batch) that GEMV takes; more go to the tensor-core templates
GEMV_MAX_ROWS = 16
#: shared memory the GEMV's copy of the activations may take
GEMV_MAX_X_BYTES = 96 * 1024


@dataclass(frozen=True)
class WeightOnlyShape:
    lead: tuple[int, ...]  # the activations' leading dims (rows: their product)
    n: int
    k: int
    group_size: int
    dtype: str = "float16"  # activations and scales
    out_dtype: str = "float16"
    zero_point: bool = False
    bits: int = 4

    def __post_init__(self):
        object.__setattr__(self, "lead", tuple(int(d) for d in self.lead))
        if self.bits not in PER_WORD:
            raise ValueError(f"weight-only matmul: {self.bits}-bit weights are not supported (4 or 8)")
        if self.group_size <= 0 or self.group_size % self.per_word or self.k % self.group_size:
            raise ValueError(f"group size {self.group_size} must be a multiple of {self.per_word} dividing K={self.k}")
        if self.dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"weight-only matmul activations must be one of {ACTIVATION_DTYPES}, got {self.dtype!r}")

    @property
    def m(self) -> int:
        return math.prod(self.lead)

    @property
    def per_word(self) -> int:
        return PER_WORD[self.bits]

    @property
    def groups(self) -> int:
        return self.k // self.group_size

    @property
    def x_bytes(self) -> int:
        """Bytes of the 16-bit activations (what the dequantizing GEMV stages in shared memory)."""
        return self.m * self.k * 2

    @property
    def row_bytes(self) -> int:
        """Bytes of one packed weight row."""
        return self.k * self.bits // 8

    @property
    def lane_weights(self) -> int:
        """Weights one lane of the dequantizing GEMV takes a step (32 at 4 bits, 16 at 8)."""
        return LANE_WORDS * self.per_word

    def param_shapes(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of X, Q, S, (Z,) Y, in parameter order."""
        scales = [((self.n, self.groups), self.dtype)] * (2 if self.zero_point else 1)
        return [(self.lead + (self.k,), self.dtype), ((self.n, self.k // self.per_word), "uint32"), *scales,
                (self.lead + (self.n,), self.out_dtype)]

    def to_attr(self) -> dict:
        d = asdict(self)
        d["lead"] = list(self.lead)
        return d


def weight_only_te(X, Q, S, Z, group_size: int, out_dtype: str, bits: int = 4):
    """``Y[..., n] = sum_k X[..., k] * W[n, k]`` over the packed weights ``Q`` (``[N, K / per
    word]`` uint32), scales ``S`` and zeros ``Z`` (None: the middle of the range) dequantized
    elementwise (a block the schedules inline into the product's loads); fp32 sums, the result in
    ``out_dtype``."""
    dtype, per_word = S.dtype, PER_WORD[bits]

    def weight(j, kk):
        word = Q[j, kk // per_word]
        shift = (kk % per_word * bits).astype("uint32")
        q = ((word >> shift) & tirx.const((1 << bits) - 1, "uint32")).astype(dtype)
        zero = Z[j, kk // group_size] if Z is not None else tirx.const(1 << (bits - 1), dtype)
        return (q - zero) * S[j, kk // group_size]

    n, k = Q.shape[0], X.shape[-1]
    W = te.compute((n, k), weight, name="W")
    r = te.reduce_axis((0, k), name="k")
    lead = tuple(X.shape[:-1])
    acc = te.compute(lead + (n,), lambda *ax: te.sum(X[ax[:-1] + (r,)].astype("float32")
                                                     * W[ax[-1], r].astype("float32"), axis=r), name="Y_acc")
    return te.compute(lead + (n,), lambda *ax: acc[ax].astype(out_dtype), name="Y")


def weight_only_func(shape: WeightOnlyShape, name: str | None = None) -> tirx.PrimFunc:
    """The PrimFunc of ``shape`` (named ``matmul_int4`` / ``matmul_int8`` unless ``name``):
    parameters X, Q, S, (Z,) Y; it carries :data:`ATTR`."""
    X = te.placeholder(shape.lead + (shape.k,), shape.dtype, name="X")
    Q = te.placeholder((shape.n, shape.k // shape.per_word), "uint32", name="Q")
    S = te.placeholder((shape.n, shape.groups), shape.dtype, name="S")
    Z = te.placeholder((shape.n, shape.groups), shape.dtype, name="Z") if shape.zero_point else None
    Y = weight_only_te(X, Q, S, Z, shape.group_size, shape.out_dtype, shape.bits)
    tensors = [X, Q, S] + ([Z] if Z is not None else []) + [Y]
    return (te.create_prim_func(tensors).with_attr("global_symbol", name or f"matmul_int{shape.bits}")
            .with_attr(ATTR, shape.to_attr()))


def match_weight_only(func: tirx.PrimFunc) -> WeightOnlyShape | None:
    """The shape ``func`` computes if it is a :func:`weight_only_func` (its attribute, with
    buffers that still agree with it), else None."""
    attrs = func.attrs
    if attrs is None or ATTR not in attrs:
        return None
    raw = attrs[ATTR]
    try:
        shape = WeightOnlyShape(
            lead=tuple(int(d) for d in raw["lead"]), n=int(raw["n"]), k=int(raw["k"]),
            group_size=int(raw["group_size"]), dtype=str(raw["dtype"]), out_dtype=str(raw["out_dtype"]),
            zero_point=bool(raw["zero_point"]), bits=int(raw["bits"]))
    except (KeyError, TypeError, ValueError):
        return None
    return shape if params_agree(func, shape.param_shapes()) else None


def dequant_gemv_fits(shape: WeightOnlyShape) -> bool:
    """Whether the dequantizing GEMV template takes ``shape``: decode rows, K and the groups
    in whole lane steps (one scale a step), the activations in shared memory."""
    # 8-bit values do not fit bf16's 7 mantissa bits (the template's conversion)
    return (shape.dtype in (ACTIVATION_DTYPES if shape.bits == 4 else ("float16",))
            and shape.m <= GEMV_MAX_ROWS and shape.k % shape.lane_weights == 0
            and shape.group_size % shape.lane_weights == 0 and shape.x_bytes <= GEMV_MAX_X_BYTES)


#: ``vectorize`` width of X with which the dequantizing GEMV reads the activations from global
#: memory at each step instead of staging them in shared memory (16 bytes a lane a packed word)
X_GLOBAL_WIDTH = 8


def x_global_fits(shape: WeightOnlyShape) -> bool:
    """Whether the dequantizing GEMV can read ``shape``'s activations from global memory at each
    step (4-bit weights, fp16 activations: the pairs' order is made with byte permutes)."""
    return shape.bits == 4 and shape.dtype == "float16"


def resident_ctas(shape: WeightOnlyShape, warps: int, arch=None) -> int:
    """CTAs of ``warps`` warps that fit on one SM at once beside the staged activations (an H100's
    limits where ``arch`` is None: 2048 threads, 228 KB of shared memory)."""
    threads = arch.max_threads_per_sm if arch is not None else 2048
    smem = arch.smem_per_sm if arch is not None else 228 * 1024
    return max(1, min(threads // (32 * warps), smem // max(1, shape.x_bytes)))


#: K a warp step of the tensor-core dequantizing GEMV (4 lanes of 32 weights), and so the
#: smallest group it takes (one scale a step); its activation rows: the mma's 8 columns
MMA_STEP_K = 128
MMA_MAX_ROWS = 8
#: shared memory the tensor-core GEMV may stage (X and its sums, the scales, the warps' sums)
MMA_MAX_SMEM = 96 * 1024


def mma_gemv_smem(shape: WeightOnlyShape, rows: int, warps: int) -> int:
    """Bytes of shared memory the tensor-core dequantizing GEMV stages for CTAs of ``rows`` rows
    and ``warps`` warps: X, two fp32 sums of each step of each of its rows, the rows' group
    scales, each warp's partial sums."""
    return (shape.x_bytes + shape.m * (shape.k // MMA_STEP_K) * 8 + rows * shape.groups * 2
            + warps * rows * MMA_MAX_ROWS * 4)


def mma_gemv_fits(shape: WeightOnlyShape) -> bool:
    """Whether the tensor-core dequantizing GEMV takes ``shape``: symmetric 4-bit weights, fp16
    activations and output, at most 8 rows, K and the groups in whole steps of 128."""
    return (shape.bits == 4 and shape.dtype == "float16" and shape.out_dtype == "float16" and not shape.zero_point
            and shape.m <= MMA_MAX_ROWS and shape.k % MMA_STEP_K == 0 and shape.group_size % MMA_STEP_K == 0
            and mma_gemv_smem(shape, 16, 1) <= MMA_MAX_SMEM)
