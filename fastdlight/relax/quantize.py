"""Weight-only quantization of a model's linear layers: ``quantize_weights(bits=4, group_size=128)``.

A matmul whose right operand is a bound weight (a constant ``[K, N]``, or a cast or transpose
of one, as the exporter and ``for_inference`` leave ``nn.Linear``) becomes one call of the
weight-only matmul of :func:`fastdlight.analysis.weight_only.weight_only_te`: the weight is
stored as 4-bit (or 8-bit) values packed eight (four) to a uint32 word along K, one fp16/bf16
scale per group of ``group_size`` weights along K (and, with ``zero_point``, one zero), and
dequantized inside the kernel. Serving is bound by reading the weights: a quarter (a half) of
the fp16 bytes.

Use it on the ``for_inference`` module, before ``prepare``::

    mod = for_inference(mod, params, fp16_io=True)
    mod = quantize_weights(bits=4, group_size=128)(mod)
    ex = compile_model(mod, target)

Weights whose K is not a multiple of ``group_size`` stay as they are.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from fastdlight.analysis.weight_only import ATTR as WEIGHT_ONLY_ATTR
from fastdlight.analysis.weight_only import (
    PER_WORD,
    WeightOnlyShape,
    dequant_gemv_fits,
    weight_only_te,
)
from fastdlight.relax.rewrites import OPAQUE, calls_pass, constant_value, static_shape

#: activation dtypes the weight-only matmul takes (the scales are stored in the activations' dtype)
QUANTIZED_DTYPES = ("float16", "bfloat16")


def quantize_packed(w: np.ndarray, group_size: int, zero_point: bool = False, bits: int = 4):
    """``(Q, S, Z)`` of weights ``w`` ``[N, K]``: the ``bits``-bit values packed (``[N, K / per
    word]`` uint32, lowest bits first), the group scales and zeros (``[N, K / group_size]``,
    float32; Z is None without ``zero_point``). Symmetric: ``q = round(w / s) + h`` with ``h =
    2^(bits-1)`` and ``s = max|w| / (h - 1)``; with zero points: ``s = (max - min) / (2^bits -
    1)``, ``z = -min / s`` (fp16, not an integer). q is clipped to the range."""
    n, k = w.shape
    top, half, per_word = (1 << bits) - 1, 1 << (bits - 1), PER_WORD[bits]
    groups = w.astype(np.float64).reshape(n, k // group_size, group_size)
    if zero_point:
        lo, hi = groups.min(axis=-1), groups.max(axis=-1)
        scale = np.where(hi > lo, (hi - lo) / top, 1.0)
        # stored in fp16 like the scales, so not rounded to an integer: the group's range maps
        # onto the steps exactly (an integer zero can push an end past a step and clip it)
        zero = (-lo / scale).astype(np.float16).astype(np.float64)
    else:
        peak = np.abs(groups).max(axis=-1)
        scale = np.where(peak > 0, peak / (half - 1), 1.0)
        zero = np.full_like(scale, float(half))
    q = np.clip(np.round(groups / scale[..., None] + zero[..., None]), 0, top).astype(np.uint32).reshape(n, k)
    words = q.reshape(n, k // per_word, per_word) << (np.arange(per_word, dtype=np.uint32) * bits)
    packed = np.bitwise_or.reduce(words, axis=-1).astype(np.uint32)
    return packed, scale.astype(np.float32), (zero.astype(np.float32) if zero_point else None)


def quantize_weights(bits: int = 4, group_size: int = 128, zero_point: bool = False) -> tvm.transform.Pass:
    """Every matmul over a bound 2-D weight (fp16/bf16 activations, K a multiple of
    ``group_size``) as a ``bits``-bit (4 or 8) weight-only matmul (see the module docstring)."""
    if bits not in PER_WORD:
        raise ValueError(f"quantize_weights: bits={bits} is not supported (4 or 8)")
    per_word = PER_WORD[bits]
    if not isinstance(group_size, int) or group_size <= 0 or group_size % per_word:
        raise ValueError(f"quantize_weights: group_size must be a positive multiple of {per_word}, "
                         f"got {group_size!r}")

    def rewrite(mutator, call):
        x, w = call.args
        sw = static_shape(w)
        dtype = str(x.ty.dtype)
        if sw is None or len(sw) != 2 or dtype not in QUANTIZED_DTYPES or sw[0] % group_size:
            return call
        weight = constant_value(mutator, w)
        if weight is None or weight.shape != tuple(sw):
            return call
        packed, scale, zero = quantize_packed(np.ascontiguousarray(weight.T), group_size, zero_point, bits)
        args = [x, relax.const(packed, "uint32"), relax.const(scale.astype(dtype), dtype)]
        if zero is not None:
            args.append(relax.const(zero.astype(dtype), dtype))
        out_dtype = str(call.ty.dtype)

        def product(x_, q_, s_, z_=None):
            return weight_only_te(x_, q_, s_, z_, group_size, out_dtype, bits)

        sx = static_shape(x)
        # static shapes: the function says what it is, for the dequantizing GEMV template
        shape = None if sx is None else WeightOnlyShape(tuple(sx[:-1]), sw[1], sw[0], group_size, dtype, out_dtype,
                                                          zero_point, bits)
        attrs = {} if shape is None else {"primfunc_attrs": {WEIGHT_ONLY_ATTR: shape.to_attr()}}
        if shape is not None and dequant_gemv_fits(shape):
            # decode rows: kept out of fusion (an epilogue stays a kernel of its own), so the
            # dequantizing GEMV template, which has no epilogue, takes the product
            attrs["primfunc_attrs"]["op_pattern"] = OPAQUE
        return mutator.builder_.call_te(product, *args, primfunc_name_hint=f"matmul_int{bits}", **attrs)

    # the float weights' bindings (a transpose or a cast of the constant) are dead now: dropped
    return calls_pass("fastdlight.QuantizeWeights", "relax.matmul", rewrite,
                      finish=relax.transform.DeadCodeElimination())
