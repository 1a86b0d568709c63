"""The convolution ops: NHWC conv2d with HWIO weights (padding built in) and with OHWI weights
(TOPI's conv2d, as Relax's layout conversion leaves a ResNet layer)."""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from fastdlight.analysis.dtypes import NBYTES, default_out_dtype
from fastdlight.ops.core import Op, check_dtype, check_shape, prim_func


def conv2d_nhwc(n, h, w, c, k, r=3, s=3, stride=1, pad=1, dtype="float16", out_dtype=None) -> Op:
    """Out[n, p, q, k] = sum_{r, s, c} In[n, p*stride + r - pad, q*stride + s - pad, c] * W[r, s, c, k]."""
    check_shape(n, h, w, c, k, r, s, stride)
    if pad < 0:
        raise ValueError("padding must be >= 0")
    check_dtype(dtype, ("float16", "bfloat16", "float32", "int8"))
    out_dtype = check_dtype(out_dtype or default_out_dtype(dtype))
    p = (h + 2 * pad - r) // stride + 1
    q = (w + 2 * pad - s) // stride + 1
    if p <= 0 or q <= 0:
        raise ValueError("conv2d: kernel larger than the padded input")
    I = te.placeholder((n, h, w, c), dtype, name="data")
    W = te.placeholder((r, s, c, k), dtype, name="W")
    zero = tirx.const(0, dtype)
    P = te.compute(
        (n, h + 2 * pad, w + 2 * pad, c),
        lambda b, y, x, ci: tirx.if_then_else(
            tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad), I[b, y - pad, x - pad, ci], zero
        ),
        name="pad",
    )
    rr = te.reduce_axis((0, r), name="rr")
    rs = te.reduce_axis((0, s), name="rs")
    rc = te.reduce_axis((0, c), name="rc")
    O = te.compute(
        (n, p, q, k),
        lambda b, y, x, co: te.sum(
            P[b, y * stride + rr, x * stride + rs, rc].astype(out_dtype) * W[rr, rs, rc, co].astype(out_dtype),
            axis=[rr, rs, rc],
        ),
        name="conv",
    )

    def ref(i, wt):
        i = np.pad(i.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        wt = wt.astype(np.float64)
        out = np.zeros((n, p, q, k))
        for y in range(r):
            for x in range(s):
                patch = i[:, y : y + stride * p : stride, x : x + stride * q : stride, :]
                out += patch @ wt[y, x]
        return out

    flops = 2.0 * n * p * q * k * r * s * c
    nbytes = (n * h * w * c + r * s * c * k) * NBYTES[dtype] + n * p * q * k * NBYTES[out_dtype]
    return Op("conv2d_nhwc", prim_func([I, W, O], "conv2d_nhwc"), ref, flops, nbytes)


def conv2d_nhwc_ohwi(n, h, w, c, k, r=3, stride=1, pad=1, dtype="float16") -> Op:
    """Out = dtype(conv2d(In, W)) with NHWC data, OHWI weights ``W[k, r, s, c]`` and fp32 sums:
    a ResNet layer as ``relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})``
    and FuseOps leave it (TOPI's conv2d, then a cast)."""
    from tvm import topi

    check_shape(n, h, w, c, k, r, stride)
    check_dtype(dtype, ("float16", "bfloat16"))
    data = te.placeholder((n, h, w, c), dtype, name="data")
    weight = te.placeholder((k, r, r, c), dtype, name="weight")
    conv = topi.nn.conv2d(data, weight, stride, pad, 1, data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
    out = topi.cast(conv, dtype)
    hwio = conv2d_nhwc(n, h, w, c, k, r, r, stride, pad, "float32")

    def ref(i, wt):
        return hwio.reference(i, np.transpose(wt, (1, 2, 3, 0)))

    return Op("conv2d_nhwc_ohwi", prim_func([data, weight, out], "conv2d_nhwc_ohwi"), ref, hwio.flops,
              hwio.bytes * NBYTES[dtype] // 4)
