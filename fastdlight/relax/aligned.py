"""Matmuls whose rows TMA cannot address, made addressable: fp16/bf16 operands with K not a
multiple of 8, whose rows of K elements are not a whole number of 16 bytes. The wgmma template
loads its tiles by TMA, which needs every global stride to be a multiple of 16 bytes, so such a
GEMM would be left to the mma.sync template (0.5-0.67x of cuBLAS on an H100). Instead both
operands are zero-padded along K to a multiple of 8: the added products are 0 x 0, so the
result is the same. A bound weight is padded here, once, as a constant; an activation or a
weight passed in gets a ``nn.pad``, a copy of it (one, however many matmuls read it).

N not a multiple of 8 leaves the output's rows and a ``[K, N]`` weight's rows unaddressable:
the template stores such outputs itself (``wgmma_tma.Output.tma``), and a bound weight is
stored ``[N, K]`` instead, its rows then K long."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.arch import CUDA
from fastdlight.relax.rewrites import bound_value, call_to, constant_value, mutator_pass, static_shape

#: TMA: the global strides of a tensor map are multiples of 16 bytes
TMA_STRIDE_BYTES = 16
#: the input dtypes the wgmma template takes, and their sizes
WGMMA_INPUT_BYTES = {"float16": 2, "bfloat16": 2}
#: one wgmma tile: products with fewer rows or columns go to the GEMV and decode paths, which
#: load rows at any alignment (see ``wgmma_match._stores_whole_tiles``)
MIN_ROWS, MIN_COLUMNS = 64, 16


def aligned_extent(extent: int, dtype: str) -> int:
    """The smallest extent >= ``extent`` whose rows of ``dtype`` are whole multiples of 16 bytes."""
    per = TMA_STRIDE_BYTES // WGMMA_INPUT_BYTES[dtype]
    return -(-extent // per) * per


def matmul_nt(a: te.Tensor, weight: te.Tensor, out_dtype: str) -> te.Tensor:
    """``a @ weight^T`` for ``a [..., M, K]`` and ``weight [N, K]``, products and sums in ``out_dtype``."""
    k = te.reduce_axis((0, a.shape[-1]), name="k")
    return te.compute(
        (*a.shape[:-1], weight.shape[0]),
        lambda *i: te.sum(a[(*i[:-1], k)].astype(out_dtype) * weight[i[-1], k].astype(out_dtype), axis=k),
        name="matmul")


@mutator
class _TmaAlignedMatmuls(PyExprMutator):
    """:func:`tma_aligned_matmuls`' rewrite: matmuls with K padded to whole 16-byte rows, or a
    bound weight stored ``[N, K]``."""

    def __init__(self, mod=None, has_wgmma: bool = True):
        super().__init__(mod)
        self.has_wgmma = has_wgmma  # False: left alone (the other templates load rows at any alignment)
        self.padded = {}  # an activation's padded binding, by the activation (shared by its matmuls)

    def visit_dataflow_block_(self, block):
        self.padded = {}  # a padded binding is visible in its own block only
        return super().visit_dataflow_block_(block)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not self.has_wgmma or getattr(call.op, "name", "") != "relax.matmul":
            return call
        a, b = call.args
        sa, sb = static_shape(a), static_shape(b)
        dtype = str(a.ty.dtype)
        if sa is None or sb is None or len(sa) < 2 or len(sb) < 2 or dtype not in WGMMA_INPUT_BYTES:
            return call
        if str(b.ty.dtype) != dtype or sa[-1] != sb[-2] or sa[-2] < MIN_ROWS or sb[-1] < MIN_COLUMNS:
            return call
        k = sa[-1]
        extra = aligned_extent(k, dtype) - k
        out_dtype = str(call.ty.dtype)
        # a weight's values only where N needs them (a bound weight's numpy copy is large)
        weight = constant_value(self, b) if aligned_extent(sb[-1], dtype) != sb[-1] else None
        if weight is not None and weight.ndim == 2:
            # a bound weight [K, N] whose rows TMA cannot address: read as [N, K] instead
            rows_k = np.ascontiguousarray(np.pad(weight, [(0, extra), (0, 0)]).T)
            return self.builder_.call_te(matmul_nt, self.pad(a, len(sa) - 1, extra), relax.const(rows_k, dtype),
                                         out_dtype, primfunc_name_hint="matmul_nt")
        if extra == 0:
            return call
        return relax.op.matmul(self.pad(a, len(sa) - 1, extra), self.pad(b, len(sb) - 2, extra), out_dtype)

    def pad(self, x, axis: int, extra: int):
        if extra == 0:
            return x
        ndim = len(static_shape(x))
        widths = [(0, extra if i == axis else 0) for i in range(ndim)]
        value = constant_value(self, x)
        if value is not None:
            return relax.const(np.pad(value, widths), str(x.ty.dtype))
        transposed = call_to(bound_value(self, x), "relax.permute_dims")
        if transposed is not None and ndim == 2:
            # a weight [N, K] read transposed: padded as it is, K its rows' axis, and read
            # transposed again (so it stays K-major, as it was)
            return relax.op.permute_dims(self.pad(transposed.args[0], 1 - axis, extra), transposed.attrs.axes)
        key = (x, axis)
        if key not in self.padded:
            flat = [w for pair in widths for w in pair]
            self.padded[key] = self.builder_.emit(relax.op.nn.pad(x, flat), name_hint="k_padded")
        return self.padded[key]


def tma_aligned_matmuls(target=None) -> tvm.transform.Pass:
    """``matmul(a, b)`` with fp16/bf16 operands of static shapes and at least one wgmma tile of
    output, where K is not a multiple of 8: ``matmul(pad(a), pad(b))`` along K. Where N is not
    and ``b`` is a bound weight ``[K, N]``: :func:`matmul_nt` of ``a`` and the weight stored
    ``[N, K]`` (its rows then are K long; the template stores the output's rows itself). Not
    applied where ``target`` has no wgmma: the other templates load rows at any alignment."""
    has_wgmma = target is None or CUDA(target).has_wgmma
    return mutator_pass("fastdlight.TmaAlignedMatmuls", lambda mod: _TmaAlignedMatmuls(mod, has_wgmma),
                        relax.transform.DeadCodeElimination())
