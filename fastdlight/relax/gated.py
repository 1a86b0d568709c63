"""Gated feed-forward layers (LLaMA's ``silu(x @ Wg) * (x @ Wu)``) as one GEMM.

The two projections read the same ``x``; computed apart they read it twice, write both
products and read them back for the product (or read ``up`` in the gate GEMM's epilogue, which
the tensor cores wait for). :func:`gated_projections` interleaves the two bound weights once,
at compile time, into ``W`` of ``[2N, K]``: column block ``b`` of ``G`` columns of the GEMM's
output is gate columns ``b*G .. b*G+G-1`` and the next block the same columns of ``up``. One
GEMM ``x @ W^T`` then holds, in every output tile of a multiple of ``2G`` columns, each gate
value beside its ``up`` value, in the same thread's accumulators of the wgmma template
(``fastdlight.schedules.wgmma.template``, which takes the pair as its epilogue), and only the
product is written.

``G`` is the template's epilogue chunk: 128 bytes of 16-bit outputs. The rewrite applies where
the target has wgmma, both weights are bound fp16 or bf16 constants of one shape, ``N`` is a
multiple of ``G`` and ``x``'s rows are 16-byte aligned (TMA), and ``x`` has more than 16 rows
(fewer: decode, two GEMVs).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.arch import CUDA
from fastdlight.relax.rewrites import bound_value, call_to, constant_value, mutator_pass, static_shape

#: interleave granularity: the wgmma epilogue's chunk of 16-bit outputs (128 bytes)
PAIR_COLUMNS = 64
#: rows of x at most that stay two projections (decode; the GEMV template's low batch)
DECODE_ROWS = 16


def interleave(gate: np.ndarray, up: np.ndarray, g: int = PAIR_COLUMNS) -> np.ndarray:
    """``[2N, K]`` rows: blocks of ``g`` rows of ``gate`` (``[N, K]``) and of ``up``, alternating."""
    n, k = gate.shape
    return np.stack([gate.reshape(n // g, g, k), up.reshape(n // g, g, k)], axis=1).reshape(2 * n, k)


def gated_product(x: te.Tensor, w: te.Tensor, acc_dtype: str, gate_dtype: str, up_dtype: str,
                  g: int = PAIR_COLUMNS) -> te.Tensor:
    """``silu(gate) * up`` from one GEMM ``acc = x @ w^T`` over the interleaved ``w``: the
    operations (casts included) of the two projections' graph, in its order."""
    *lead, kdim = (int(d) for d in x.shape)
    n = int(w.shape[0]) // 2
    k = te.reduce_axis((0, kdim), name="k")
    acc = te.compute((*lead, 2 * n),
                     lambda *i: te.sum(x[(*i[:-1], k)].astype(acc_dtype) * w[i[-1], k].astype(acc_dtype), axis=k),
                     name="matmul")

    def product(*i):
        col = i[-1] // g * (2 * g) + i[-1] % g
        gate, up = acc[(*i[:-1], col)], acc[(*i[:-1], col + g)]
        gate = gate if gate_dtype == acc_dtype else gate.astype(gate_dtype)
        up = up if up_dtype == acc_dtype else up.astype(up_dtype)
        return gate * te.sigmoid(gate) * up

    return te.compute((*lead, n), product, name="gated")


@mutator
class _GatedProjections(PyExprMutator):
    """:func:`gated_projections`' rewrite: ``multiply(silu(gate), up)`` of two projections of
    one ``x`` as one :func:`gated_product`."""

    def __init__(self, mod=None, has_wgmma: bool = True):
        super().__init__(mod)
        self.has_wgmma = has_wgmma  # False: left alone (no template but wgmma's takes the pairs)

    def silu_of(self, expr):
        value = bound_value(self, expr)
        if (silu := call_to(value, "relax.nn.silu")) is not None:
            return silu.args[0]
        mul = call_to(value, "relax.multiply")
        if mul is None:
            return None
        for t, s in (mul.args, mul.args[::-1]):
            sig = call_to(bound_value(self, s), "relax.sigmoid")
            if sig is not None and sig.args[0].same_as(t):
                return t
        return None

    def projection(self, expr):
        """``(matmul call, dtype after its cast)`` of ``[astype](matmul(x, W))``, else None."""
        value = bound_value(self, expr)
        cast = call_to(value, "relax.astype")
        mm = call_to(bound_value(self, cast.args[0]) if cast is not None else value, "relax.matmul")
        return None if mm is None else (mm, str((mm if cast is None else cast).ty.dtype))

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not self.has_wgmma or getattr(call.op, "name", "") != "relax.multiply":
            return call
        for a, b in (call.args, call.args[::-1]):
            t = self.silu_of(a)
            gate, up = (None, None) if t is None else (self.projection(t), self.projection(b))
            if gate is None or up is None:
                continue
            rewritten = self.rewrite(gate, up)
            if rewritten is not None:
                return rewritten
        return call

    def rewrite(self, gate, up):
        (g_mm, g_dtype), (u_mm, u_dtype) = gate, up
        x = g_mm.args[0]
        if not x.same_as(u_mm.args[0]) or str(g_mm.ty.dtype) != str(u_mm.ty.dtype):
            return None
        wg, wu = constant_value(self, g_mm.args[1]), constant_value(self, u_mm.args[1])
        in_dtype = str(x.ty.dtype)
        if wg is None or wu is None or wg.ndim != 2 or wg.shape != wu.shape or in_dtype not in ("float16", "bfloat16"):
            return None
        kdim, n = wg.shape
        sx = static_shape(x)
        if sx is not None and math.prod(sx[:-1]) <= DECODE_ROWS:
            # decode: two GEMVs (the weights read once each, at the bandwidth limit); the
            # pair's one GEMM has no GEMV template, and on CUDA cores it ran a LLaMA MLP
            # step (1 token, 4096 -> 2x11008 -> 4096) at 0.42 ms against torch's 0.08 (H200)
            return None
        if n % PAIR_COLUMNS or kdim * 2 % 16 or str(wg.dtype) != in_dtype or str(wu.dtype) != in_dtype:
            return None
        weight = relax.const(interleave(np.ascontiguousarray(wg.T), np.ascontiguousarray(wu.T)), in_dtype)
        return self.builder_.call_te(gated_product, x, weight, str(g_mm.ty.dtype), g_dtype, u_dtype,
                                     primfunc_name_hint="gated_silu")


def gated_projections(target=None) -> tvm.transform.Pass:
    """``multiply(silu(t_g), t_u)`` with ``t = [astype](matmul(x, W))``, both ``W`` bound
    constants ``[K, N]`` read by the same ``x``, as one :func:`gated_product` over their
    :func:`interleave` (see the module docstring). ``silu`` is ``nn.silu(t)`` or
    ``t * sigmoid(t)``. Not applied where ``target`` has no wgmma: no other template takes the
    pairs."""
    has_wgmma = target is None or CUDA(target).has_wgmma
    return mutator_pass("fastdlight.GatedProjections", lambda mod: _GatedProjections(mod, has_wgmma),
                        relax.transform.DeadCodeElimination())
