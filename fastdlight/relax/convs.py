"""Convolutions with too few channels for a tensor-core operand row, as an im2col GEMM.

The tensor-core convolution templates read, for each filter tap, a run of input channels as one
operand row: the wgmma template a TMA box of 64 channels, the mma.sync one 16-byte ``ldmatrix``
rows. An image's 3 channels (ResNet's 7x7 stem) make 6-byte pixels, which neither takes: the
stem fell back to a scalar gather in the mma.sync template, 0.144 ms of ResNet-18's 0.42 ms at
batch 16 on an H100.

:func:`im2col_convs` writes such a convolution as two kernels: an injective gather of each output
pixel's receptive field into a row of ``R*S*C`` values (zero-padded to a multiple of 8, a 16-byte
row, which TMA takes), and ``matmul(rows, weights')`` with the weights reshaped to match (a
constant when they are bound, folded at load). The matmul is an ordinary GEMM on the wgmma
template; what FuseOps fused after the convolution (batch norm, ReLU, a cast) fuses after it.

The price is the rows buffer, ``N*P*Q*Kp`` values (61 MB for ResNet-18's stem at batch 16), written
once and read once; the rewrite applies only where ``Kp`` is at most :data:`MAX_ROW` values.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx
from tvm.ir import IRModule
from tvm.relax.expr_functor import PyExprMutator, mutator

#: input channels per 16-byte row: convolutions with a multiple of this are left to the templates
ROW_CHANNELS = 8
#: the longest im2col row (R*S*C rounded up to 8) rewritten: the rows buffer is Kp values a pixel
MAX_ROW = 512
#: the input dtypes whose GEMM runs on tensor cores (others keep their convolution)
TENSOR_CORE_DTYPES = ("float16", "bfloat16")


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _static_shape(expr) -> list[int] | None:
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(v, tirx.IntImm) for v in shape.values):
        return None
    return _ints(shape.values)


def _row_length(k: int) -> int:
    return -(-k // ROW_CHANNELS) * ROW_CHANNELS


def rewritable(call: relax.Call) -> bool:
    """An NHWC/OHWI ``conv2d`` (groups 1, no dilation, static shapes, fp16/bf16) whose channels are
    not a multiple of :data:`ROW_CHANNELS` and whose im2col row is at most :data:`MAX_ROW`."""
    attrs = call.attrs
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" or str(attrs.out_layout) != "NHWC":
        return False
    if int(attrs.groups) != 1 or _ints(attrs.dilation) != [1, 1]:
        return False
    x, w = (_static_shape(a) for a in call.args)
    if x is None or w is None or str(call.args[0].ty.dtype) not in TENSOR_CORE_DTYPES:
        return False
    channels = x[3]
    return channels % ROW_CHANNELS != 0 and _row_length(w[1] * w[2] * channels) <= MAX_ROW


def _geometry(call: relax.Call):
    (n, h, w, c), (o, r, s, _) = (_static_shape(a) for a in call.args)
    stride_h, stride_w = _ints(call.attrs.strides)
    top, left, bottom, right = _ints(call.attrs.padding)
    p = (h + top + bottom - r) // stride_h + 1
    q = (w + left + right - s) // stride_w + 1
    return (n, h, w, c), (o, r, s), (stride_h, stride_w), (top, left), (p, q)


def im2col(data: te.Tensor, rs, strides, pads, pq, k_pad: int) -> te.Tensor:
    """``rows[(n*P + p)*Q + q, (r*S + s)*C + c] = data[n, p*sh - top + r, q*sw - left + s, c]``,
    zero outside the image and in the row's padding."""
    n, h, w, c = (int(v) for v in data.shape)
    (r_taps, s_taps), (sh, sw), (top, left), (p_out, q_out) = rs, strides, pads, pq
    k_real = r_taps * s_taps * c

    def row(m, k):
        img, pix = m // (p_out * q_out), m % (p_out * q_out)
        y = pix // q_out * sh - top + k // (s_taps * c)
        x = pix % q_out * sw - left + k // c % s_taps
        inside = tirx.all(k < k_real, y >= 0, y < h, x >= 0, x < w)
        return tirx.if_then_else(inside, data[img, y, x, k % c], tirx.const(0, data.dtype))

    return te.compute((n * p_out * q_out, k_pad), row, name="im2col")


def weight_rows(weight: te.Tensor, k_pad: int) -> te.Tensor:
    """OHWI weights as ``[O, Kp]`` rows in :func:`im2col`'s order, zero-padded."""
    o, r, s, c = (int(v) for v in weight.shape)

    def row(j, k):
        value = weight[j, k // (s * c), k // c % s, k % c]
        return tirx.if_then_else(k < r * s * c, value, tirx.const(0, weight.dtype))

    return te.compute((o, k_pad), row, name="weight_rows")


@mutator
class _Im2colConvs(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", "") != "relax.nn.conv2d" or not rewritable(call):
            return call
        (n, _, _, c), (o, r, s), strides, pads, (p, q) = _geometry(call)
        k_pad = _row_length(r * s * c)
        data, weight = call.args
        rows = self.builder_.call_te(im2col, data, (r, s), strides, pads, (p, q), k_pad, primfunc_name_hint="im2col")
        w_rows = self.builder_.call_te(weight_rows, weight, k_pad, primfunc_name_hint="weight_rows")
        out_dtype = str(call.attrs.out_dtype) or str(data.ty.dtype)
        product = relax.op.matmul(rows, relax.op.permute_dims(w_rows), out_dtype=out_dtype)
        return relax.op.reshape(product, [n, p, q, o])


def im2col_convs() -> tvm.transform.Pass:
    """Every :func:`rewritable` convolution as ``reshape(matmul(im2col(x), weight_rows(w)^T))``."""

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.Im2colConvs")
    def run(mod: IRModule, _ctx) -> IRModule:
        rewriter = _Im2colConvs(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return run
