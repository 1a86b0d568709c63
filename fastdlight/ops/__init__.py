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

from fastdlight.analysis.attention import AttentionShape, attention_func
from fastdlight.analysis.decode_attention import (
    TICKETS,
    DecodeAttentionShape,
    chunk_reference,
    combine_reference,
    decode_paged_func,
    decode_split_func,
)
from fastdlight.analysis.dtypes import FP8_DTYPES, NBYTES, default_out_dtype
from fastdlight.analysis.weight_only import PER_WORD, WeightOnlyShape, weight_only_func
from fastdlight.measure.inputs import DISTINCT_INDICES, INPUT_VALUES, RANDOM_BITS
from fastdlight.ops.attention_ops import attention, decode_attention
from fastdlight.ops.conv import conv2d_nhwc, conv2d_nhwc_ohwi
from fastdlight.ops.core import DTYPES, INT32_ELEMENTS, Op
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
    # the op builders and what they return
    "Op", "matmul", "matmul_scaled", "matmul_symbolic_rows", "matmul_bias_relu", "matmul_gated",
    "matmul_residual", "gemv", "conv2d_nhwc", "conv2d_nhwc_ohwi", "elementwise", "transpose", "reduce",
    "softmax", "attention", "decode_attention", "matmul_int4", "matmul_int8", "dequantize_weights",
    # constants the builders use, exported here as fastdlight.ops always has
    "DTYPES", "FP8_DTYPES", "FP8_SCALES", "INT32_ELEMENTS", "NBYTES", "default_out_dtype",
    "AttentionShape", "attention_func", "DecodeAttentionShape", "TICKETS", "chunk_reference",
    "combine_reference", "decode_paged_func", "decode_split_func", "WeightOnlyShape", "PER_WORD",
    "weight_only_func", "DISTINCT_INDICES", "INPUT_VALUES", "RANDOM_BITS",
]
