"""The weight-only quantized matmuls (4- and 8-bit weights packed in uint32 words, group scales
and optional zeros) and the numpy dequantization their references use."""

from __future__ import annotations

import numpy as np

from fastdlight.analysis.dtypes import NBYTES
from fastdlight.analysis.weight_only import PER_WORD, WeightOnlyShape, weight_only_func
from fastdlight.measure.inputs import RANDOM_BITS
from fastdlight.ops.core import Op, check_dtype, check_shape


def matmul_int4(m, n, k, group_size=128, dtype="float16", zero_point=False) -> Op:
    """Weight-only 4-bit matmul, as a linear layer quantized for serving holds it:
    Y[m, n] = sum_k X[m, k] * W[n, k], with W[n, k] = (q[n, k] - z) * S[n, k // group_size]
    dequantized in the kernel; q packed eight to a uint32 word along K (``Q[n, k // 8]``, the
    lowest nibble first), S the group scales, z 8 (symmetric) or, with ``zero_point``, the
    group's ``Z[n, k // group_size]``. fp32 sums, the result in ``dtype``."""
    return _weight_only(4, m, n, k, group_size, dtype, zero_point)


def matmul_int8(m, n, k, group_size=128, dtype="float16", zero_point=False) -> Op:
    """Weight-only 8-bit matmul: as :func:`matmul_int4` with q packed four to a word (``Q[n, k //
    4]``, the lowest byte first) and z 128 (symmetric) or the group's zero."""
    return _weight_only(8, m, n, k, group_size, dtype, zero_point)


def _weight_only(bits, m, n, k, group_size, dtype, zero_point) -> Op:
    check_shape(m, n, k, group_size)
    check_dtype(dtype, ("float16", "bfloat16"))
    shape = WeightOnlyShape((m,), n, k, group_size, dtype, dtype, zero_point, bits)
    func = weight_only_func(shape).with_attr(RANDOM_BITS, ["Q"])

    def ref(x, q, s, z=None):
        return x.astype(np.float64) @ dequantize_weights(q, s, z, group_size, dtype, bits).T

    groups = k // group_size
    nbytes = (m * k + (2 if zero_point else 1) * n * groups + m * n) * NBYTES[dtype] + n * k * bits // 8
    return Op(f"matmul_int{bits}", func, ref, 2.0 * m * n * k, nbytes)


def dequantize_weights(q, s, z, group_size: int, dtype: str = "float16", bits: int = 4) -> np.ndarray:
    """The float64 weights ``[N, K]`` packed words ``q`` (``[N, K / per word]`` uint32), scales
    ``s`` and zeros ``z`` (None: the middle of the range) stand for, each step rounded as the
    kernel rounds it (the value minus the zero and the product with the scale are ``dtype``
    operations)."""
    n, per_word = q.shape[0], PER_WORD[bits]
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    values = ((q.astype(np.uint32)[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(n, -1)
    scale = np.repeat(np.asarray(s, np.float64), group_size, axis=1)
    zero = float(1 << (bits - 1)) if z is None else np.repeat(np.asarray(z, np.float64), group_size, axis=1)
    low = np.float32 if dtype == "bfloat16" else np.float16  # bf16 stand-in: exact for these values
    return (((values - zero).astype(low)).astype(np.float64) * scale).astype(low).astype(np.float64)
