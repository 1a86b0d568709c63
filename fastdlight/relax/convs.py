"""Convolutions as GEMMs: those with too few channels for a tensor-core operand row (im2col),
and pointwise ones (:func:`pointwise_convs`).

The tensor-core convolution templates read, for each filter tap, a run of input channels as one
operand row: the wgmma template a TMA box of 64 channels, the mma.sync one 16-byte ``ldmatrix``
rows. An image's 3 channels (ResNet's 7x7 stem) make 6-byte pixels, which neither takes: the
stem fell back to a scalar gather in the mma.sync template, 0.144 ms of ResNet-18's 0.42 ms at
batch 16 on an H100.

:func:`im2col_convs` writes such a convolution as two kernels: an injective gather of each output
pixel's receptive field into a column of ``K = R*S*C`` values, ``columns[K, N*P*Q]``, and a GEMM
of the columns with the weights as ``[K, O]`` (a constant when they are bound, folded at load).
The columns are pixel-major so that the gather's neighbouring threads take neighbouring pixels:
their reads of the image are coalesced and so are their writes (each thread's k is fixed). The
GEMM reads them as an M-major A (the wgmma template's TMA box transposes it); its epilogue takes
what FuseOps fused after the convolution (batch norm, ReLU, a cast).

The price is the columns buffer, ``K*N*P*Q`` values (59 MB for ResNet-18's stem at batch 16),
written once and read once; the rewrite applies only where ``K`` is at most :data:`MAX_K`.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.relax.rewrites import mutator_pass, static_shape

#: input channels per 16-byte row: convolutions with a multiple of this are left to the templates
ROW_CHANNELS = 8
#: the longest receptive field (R*S*C values) rewritten: the columns buffer holds K values a pixel
MAX_K = 512
#: the input dtypes whose GEMM runs on tensor cores (others keep their convolution)
TENSOR_CORE_DTYPES = ("float16", "bfloat16")


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def rewritable(call: relax.Call) -> bool:
    """An NHWC/OHWI ``conv2d`` (groups 1, no dilation, static shapes, fp16/bf16) whose channels are
    not a multiple of :data:`ROW_CHANNELS` and whose receptive field is at most :data:`MAX_K`."""
    attrs = call.attrs
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" or str(attrs.out_layout) != "NHWC":
        return False
    if int(attrs.groups) != 1 or _ints(attrs.dilation) != [1, 1]:
        return False
    x, w = (static_shape(a) for a in call.args)
    if x is None or w is None or str(call.args[0].ty.dtype) not in TENSOR_CORE_DTYPES:
        return False
    channels = x[3]
    return channels % ROW_CHANNELS != 0 and w[1] * w[2] * channels <= MAX_K


def _geometry(call: relax.Call):
    (n, h, w, c), (o, r, s, _) = (static_shape(a) for a in call.args)
    stride_h, stride_w = _ints(call.attrs.strides)
    top, left, bottom, right = _ints(call.attrs.padding)
    p = (h + top + bottom - r) // stride_h + 1
    q = (w + left + right - s) // stride_w + 1
    return (n, h, w, c), (o, r, s), (stride_h, stride_w), (top, left), (p, q)


def im2col(data: te.Tensor, rs, strides, pads, pq) -> te.Tensor:
    """``columns[(r*S + s)*C + c, (n*P + p)*Q + q] = data[n, p*sh - top + r, q*sw - left + s, c]``,
    zero outside the image."""
    n, h, w, c = (int(v) for v in data.shape)
    (r_taps, s_taps), (sh, sw), (top, left), (p_out, q_out) = rs, strides, pads, pq

    def column(k, m):
        img, pix = m // (p_out * q_out), m % (p_out * q_out)
        y = pix // q_out * sh - top + k // (s_taps * c)
        x = pix % q_out * sw - left + k // c % s_taps
        inside = tirx.all(y >= 0, y < h, x >= 0, x < w)
        return tirx.if_then_else(inside, data[img, y, x, k % c], tirx.const(0, data.dtype))

    return te.compute((r_taps * s_taps * c, n * p_out * q_out), column, name="im2col")


def weight_columns(weight: te.Tensor) -> te.Tensor:
    """OHWI weights as ``[K, O]`` in :func:`im2col`'s order of K."""
    o, r, s, c = (int(v) for v in weight.shape)
    return te.compute((r * s * c, o), lambda k, j: weight[j, k // (s * c), k // c % s, k % c], name="weight_columns")


def gemm(columns: te.Tensor, weights: te.Tensor, out_dtype: str) -> te.Tensor:
    """``out[m, j] = sum_k columns[k, m] * weights[k, j]``, summed in ``out_dtype``."""
    k = te.reduce_axis((0, int(columns.shape[0])), name="k")
    return te.compute((int(columns.shape[1]), int(weights.shape[1])),
                      lambda m, j: te.sum(columns[k, m].astype(out_dtype) * weights[k, j].astype(out_dtype), axis=k),
                      name="matmul")


@mutator
class _Im2colConvs(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", "") != "relax.nn.conv2d" or not rewritable(call):
            return call
        (n, _, _, _), (o, r, s), strides, pads, (p, q) = _geometry(call)
        data, weight = call.args
        columns = self.builder_.emit_te(im2col, data, (r, s), strides, pads, (p, q), primfunc_name_hint="im2col")
        weights = self.builder_.emit_te(weight_columns, weight, primfunc_name_hint="weight_columns")
        out_dtype = str(call.attrs.out_dtype) or str(data.ty.dtype)
        product = self.builder_.call_te(gemm, columns, weights, out_dtype, primfunc_name_hint="matmul")
        return relax.op.reshape(product, [n, p, q, o])


def pointwise(call: relax.Call) -> bool:
    """An NHWC/OHWI ``conv2d`` (groups 1, static shapes, fp16/bf16) with a 1x1 kernel, stride 1
    and no padding: a GEMM of the pixels ``[N*H*W, C]`` and the weights ``[O, C]`` as stored."""
    attrs = call.attrs
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" or str(attrs.out_layout) != "NHWC":
        return False
    x, w = (static_shape(a) for a in call.args)
    if x is None or w is None or str(call.args[0].ty.dtype) not in TENSOR_CORE_DTYPES or int(attrs.groups) != 1:
        return False
    return w[1:3] == [1, 1] and _ints(attrs.strides) == [1, 1] and not any(_ints(attrs.padding))


@mutator
class _PointwiseConvs(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", "") != "relax.nn.conv2d" or not pointwise(call):
            return call
        (n, h, w, c), (o, _, _, _) = (static_shape(a) for a in call.args)
        data, weight = call.args
        out_dtype = str(call.attrs.out_dtype) or str(data.ty.dtype)
        pixels = relax.op.reshape(data, [n * h * w, c])
        product = relax.op.matmul(pixels, relax.op.permute_dims(relax.op.reshape(weight, [o, c])), out_dtype)
        return relax.op.reshape(product, [n, h, w, o])


def pointwise_convs() -> tvm.transform.Pass:
    """Every :func:`pointwise` convolution as ``reshape(matmul(reshape(x), reshape(w)^T))``. The
    matmul templates take any number of pixels (mma.sync below a wgmma tile's 64 rows), where
    the convolution's match did not: MobileNetV2's 1x1 convolutions at batch 1 (7x7 to 56x56
    pixels) got no tensor-core candidate, and stock Dlight's schedules won 15 of its 34
    functions, among them 960-to-320 channels at 7x7 in 55 us (H200, 2026-11-29)."""
    return mutator_pass("fastdlight.PointwiseConvs", _PointwiseConvs)


def im2col_convs() -> tvm.transform.Pass:
    """Every :func:`rewritable` convolution as ``reshape(gemm(im2col(x), weight_columns(w)))``."""
    return mutator_pass("fastdlight.Im2colConvs", _Im2colConvs)
