"""Hopper wgmma for NHWC convolutions: an implicit GEMM whose A tiles are TMA boxes of the input.

A ``conv2d`` with the input ``X[N, H, W, C]`` (its zero padding inlined), OHWI weights
``Wt[K, R, S, C]`` and the output ``[N, P, Q, K]`` is the GEMM ``M = N*P*Q`` pixels by ``K``
output channels over ``R*S*C``. A tile of ``bm`` output rows is a patch of ``bm / PATCH_W``
image rows by ``PATCH_W`` columns of one image; for the K step ``(r, s, c0..c0+63)`` its A tile
is one 4-D TMA box of the input, ``64 channels x PATCH_W x bm / PATCH_W`` pixels starting at
``(p0 * stride + r - pad, q0 * stride + s - pad)``, with the element stride of the convolution:
TMA zero-fills what falls outside the image, which *is* the padding. The weights are the GEMM's
K-major B as they are (``[K, R*S*C]``), and the output is stored as boxes of the same patches
(TMA clips the patch's part past the image). No im2col buffer, no index arithmetic per element.

Each 64-row wgmma slice is ``64 / PATCH_W`` image rows, so a patch's rows stay whole in every
slice and its store is a box. Tiles past the image's edge compute rows nobody stores:
``PATCH_W = 8`` wastes at most one column in eight at ResNet's 56/28/14/7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, tirx
from tvm.sym.pattern import detect_linear_equation

#: output columns of a tile's patch (one 64-row wgmma slice is 8 x 8 pixels)
PATCH_W = 8
#: one K step is 64 input channels of one kernel tap (a 128-byte swizzled row of 16-bit values)
CHANNEL_STEP = 64
#: TMA's largest element stride
MAX_ELEMENT_STRIDE = 8


@dataclass(frozen=True)
class ConvGeometry:
    """Shapes of an NHWC convolution, as the kernel needs them."""

    n: int
    h: int
    w: int
    c: int
    p: int  # output rows
    q: int  # output columns
    r: int
    s: int
    stride: tuple[int, int]
    pad: tuple[int, int]  # top, left

    def patch_rows(self, bm: int) -> int:
        return bm // PATCH_W

    def tiles_p(self, bm: int) -> int:
        return -(-self.p // self.patch_rows(bm))

    @property
    def tiles_q(self) -> int:
        return -(-self.q // PATCH_W)

    def m_tiles(self, bm: int) -> int:
        return self.n * self.tiles_p(bm) * self.tiles_q

    def patch(self, m_tile, bm: int):
        """(image, first output row, first output column) of M tile ``m_tile``."""
        per_image = self.tiles_p(bm) * self.tiles_q
        return (m_tile // per_image, (m_tile // self.tiles_q) % self.tiles_p(bm) * self.patch_rows(bm),
                m_tile % self.tiles_q * PATCH_W)

    def tap(self, k_step):
        """(kernel row, kernel column, first channel) of K step ``k_step``."""
        per_tap = self.c // CHANNEL_STEP
        rs = k_step // per_tap
        return rs // self.s, rs % self.s, k_step % per_tap * CHANNEL_STEP


def _loads(value, params: dict) -> list:
    found = []
    tvm_ffi.structural_walk(value, (ir.TensorLoad, found.append), order="pre")
    return [ld for ld in found if str(ld.source.name) in params]


def _tap_axis(expr, out_var, tap_var) -> tuple[int, int] | None:
    """(stride, pad) of an input index ``out * stride + tap - pad``, else None."""
    coef = list(detect_linear_equation(expr, [out_var, tap_var]))
    if len(coef) != 3 or not all(isinstance(c, tirx.IntImm) for c in coef):
        return None
    stride, unit, offset = (int(c.value) for c in coef)
    return (stride, -offset) if unit == 1 and stride >= 1 and offset <= 0 else None


def match_conv(block, params: dict, out) -> tuple[tuple | None, str]:
    """For the convolution block ``block`` (producers inlined) of a function with parameters
    ``params`` (by name) and output ``out``: ``((x_name, w_name, ConvGeometry), "")``, or
    ``(None, reason)`` when it is not an NHWC/OHWI convolution the TMA boxes can load."""
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) != 4 or len(reduce) != 3:
        return None, "not a 2-D convolution (4 output axes, 3 reduction axes)"
    n_v, p_v, q_v, k_v = (iv.var for iv in spatial)
    r_v, s_v, c_v = reduce
    loads = _loads(block.body.value, params)
    if len(loads) != 2:
        return None, f"{len(loads)} parameter reads in the convolution (need the input and the weights)"
    weights = [ld for ld in loads if all(isinstance(i, tirx.Var) for i in ld.indices)]
    inputs = [ld for ld in loads if not any(ld.same_as(wl) for wl in weights)]
    if len(weights) != 1 or len(inputs) != 1:
        return None, "the input is not read at out * stride + tap - pad"
    wt, x = weights[0], inputs[0]
    if not all(a.same_as(b) for a, b in zip(wt.indices, (k_v, r_v, s_v, c_v))) or len(wt.indices) != 4:
        return None, "weights are not OHWI [K, R, S, C]"
    idx = x.indices
    if len(idx) != 4 or not (idx[0].same_as(n_v) and idx[3].same_as(c_v)):
        return None, "input is not NHWC [N, H, W, C]"
    rows, cols = _tap_axis(idx[1], p_v, r_v), _tap_axis(idx[2], q_v, s_v)
    if rows is None or cols is None:
        return None, "the input is not read at out * stride + tap - pad (dilation?)"
    shape = [int(d) for d in x.source.shape]
    n, h, w, c = shape
    k, r, s, _c = (int(d) for d in wt.source.shape)
    p, q = (int(iv.dom.extent) for iv in spatial[1:3])
    geo = ConvGeometry(n, h, w, c, p, q, r, s, (rows[0], cols[0]), (rows[1], cols[1]))
    if [int(d) for d in out.shape] != [n, p, q, k]:
        return None, "the output is not [N, P, Q, K]"
    if c % CHANNEL_STEP:
        return None, f"{c} input channels: the wgmma conv steps through {CHANNEL_STEP} channels of one tap at a time"
    if max(geo.stride) > MAX_ELEMENT_STRIDE:
        return None, f"stride {geo.stride}: TMA element strides go up to {MAX_ELEMENT_STRIDE}"
    return (str(x.source.name), str(wt.source.name), geo), ""


def gemm_shape(geo: ConvGeometry, k: int) -> tuple[int, int, int]:
    """(M, N, K) of the implicit GEMM."""
    return geo.n * geo.p * geo.q, k, geo.r * geo.s * geo.c


def patch_waste(geo: ConvGeometry, bm: int) -> float:
    """Fraction of the tiles' rows that fall past the image."""
    return 1 - geo.n * geo.p * geo.q / (geo.m_tiles(bm) * bm) if bm % PATCH_W == 0 else math.inf
