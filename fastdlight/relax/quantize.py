"""Weight-only quantization of a model's linear layers: ``quantize_weights(bits=4, group_size=128)``.

A matmul whose right operand is a bound weight (a constant ``[K, N]``, or a cast or transpose
of one, as the exporter and ``for_inference`` leave ``nn.Linear``) becomes one call of the
4-bit matmul of :func:`fastdlight.ops.int4_matmul_te`: the weight is stored as 4-bit values
packed eight to a uint32 word along K (``[N, K / 8]``), one fp16/bf16 scale per group of
``group_size`` weights along K (and, with ``zero_point``, one zero), and dequantized inside the
kernel. Serving is bound by reading the weights: a quarter of the fp16 bytes.

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

from fastdlight.analysis.int4 import ATTR as INT4_ATTR
from fastdlight.analysis.int4 import INT4_PER_WORD, Int4MatmulShape, dequant_gemv_fits, int4_matmul_te

#: relax's op pattern kind of a function FuseOps leaves alone (kOpaque)
OPAQUE_PATTERN = 8
from fastdlight.relax.rewrites import calls_pass, constant_value, static_shape

#: activation dtypes the 4-bit matmul takes (the scales are stored in the activations' dtype)
QUANTIZED_DTYPES = ("float16", "bfloat16")


def quantize_int4(w: np.ndarray, group_size: int, zero_point: bool = False):
    """``(Q, S, Z)`` of weights ``w`` ``[N, K]``: the 4-bit values packed (``[N, K / 8]`` uint32,
    lowest nibble first), the group scales and zeros (``[N, K / group_size]``, float32; Z is None
    without ``zero_point``). Symmetric: ``q = round(w / s) + 8`` with ``s = max|w| / 7``; with
    zero points: ``s = (max - min) / 15``, ``z = -min / s`` (fp16, not an integer). q is clipped to [0, 15]."""
    n, k = w.shape
    groups = w.astype(np.float64).reshape(n, k // group_size, group_size)
    if zero_point:
        lo, hi = groups.min(axis=-1), groups.max(axis=-1)
        scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0)
        # stored in fp16 like the scales, so not rounded to an integer: the group's range maps
        # onto the 16 steps exactly (an integer zero can push an end past a step and clip it)
        zero = (-lo / scale).astype(np.float16).astype(np.float64)
    else:
        peak = np.abs(groups).max(axis=-1)
        scale = np.where(peak > 0, peak / 7.0, 1.0)
        zero = np.full_like(scale, 8.0)
    q = np.clip(np.round(groups / scale[..., None] + zero[..., None]), 0, 15).astype(np.uint32).reshape(n, k)
    words = q.reshape(n, k // INT4_PER_WORD, INT4_PER_WORD) << (np.arange(INT4_PER_WORD, dtype=np.uint32) * 4)
    packed = np.bitwise_or.reduce(words, axis=-1).astype(np.uint32)
    return packed, scale.astype(np.float32), (zero.astype(np.float32) if zero_point else None)


def quantize_weights(bits: int = 4, group_size: int = 128, zero_point: bool = False) -> tvm.transform.Pass:
    """Every matmul over a bound 2-D weight (fp16/bf16 activations, K a multiple of
    ``group_size``) as a 4-bit weight-only matmul (see the module docstring)."""
    if bits != 4:
        raise ValueError(f"quantize_weights: bits={bits} is not supported (4-bit weights only)")
    if not isinstance(group_size, int) or group_size <= 0 or group_size % INT4_PER_WORD:
        raise ValueError(f"quantize_weights: group_size must be a positive multiple of {INT4_PER_WORD}, "
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
        packed, scale, zero = quantize_int4(np.ascontiguousarray(weight.T), group_size, zero_point)
        args = [x, relax.const(packed, "uint32"), relax.const(scale.astype(dtype), dtype)]
        if zero is not None:
            args.append(relax.const(zero.astype(dtype), dtype))
        out_dtype = str(call.ty.dtype)

        def product(x_, q_, s_, z_=None):
            return int4_matmul_te(x_, q_, s_, z_, group_size, out_dtype)

        sx = static_shape(x)
        # static shapes: the function says what it is, for the dequantizing GEMV template
        shape = None if sx is None else Int4MatmulShape(tuple(sx[:-1]), sw[1], sw[0], group_size, dtype, out_dtype,
                                                          zero_point)
        attrs = {} if shape is None else {"primfunc_attrs": {INT4_ATTR: shape.to_attr()}}
        if shape is not None and dequant_gemv_fits(shape):
            # decode rows: kept out of fusion (an epilogue stays a kernel of its own), so the
            # dequantizing GEMV template, which has no epilogue, takes the product
            attrs["primfunc_attrs"]["op_pattern"] = OPAQUE_PATTERN
        return mutator.builder_.call_te(product, *args, primfunc_name_hint="matmul_int4", **attrs)

    # the float weights' bindings (a transpose or a cast of the constant) are dead now: dropped
    return calls_pass("fastdlight.QuantizeWeights", "relax.matmul", rewrite,
                      finish=relax.transform.DeadCodeElimination())
