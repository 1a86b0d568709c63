"""Builders for the operators fastdlight tunes out of the box (CLI, tests, benchmarks).

Each builder returns an :class:`Op`: the TIR PrimFunc, a float64 numpy reference, and the
work it does (FLOPs, minimal bytes moved) so results can be reported as TFLOPS or GB/s.
The last parameter of every PrimFunc is its output.

The builders live by family — :mod:`~fastdlight.ops.dense` (matmuls, gemv),
:mod:`~fastdlight.ops.conv`, :mod:`~fastdlight.ops.memory_bound` (elementwise, transpose,
reduce, softmax), :mod:`~fastdlight.ops.attention_ops` and :mod:`~fastdlight.ops.quantized`
(weight-only matmuls) — on :mod:`~fastdlight.ops.core` (:class:`Op` and the shared checks);
this package exports them all.
"""

from fastdlight.ops.attention_ops import attention, decode_attention
from fastdlight.ops.conv import conv2d_nhwc, conv2d_nhwc_ohwi
from fastdlight.ops.core import DTYPES, Op
from fastdlight.ops.dense import (
    FP8_SCALES,
    gemv,
    matmul,
    matmul_bias_relu,
    matmul_gated,
    matmul_residual,
    matmul_scaled,
    matmul_symbolic_rows,
)
from fastdlight.ops.memory_bound import elementwise, reduce, softmax, transpose
from fastdlight.ops.quantized import dequantize_weights, matmul_int4, matmul_int8

__all__ = [
    "Op", "DTYPES", "matmul", "matmul_scaled", "FP8_SCALES", "matmul_symbolic_rows", "matmul_bias_relu",
    "matmul_gated", "matmul_residual", "gemv", "conv2d_nhwc", "conv2d_nhwc_ohwi", "elementwise", "transpose",
    "reduce", "softmax", "attention", "decode_attention", "matmul_int4", "matmul_int8", "dequantize_weights",
]
