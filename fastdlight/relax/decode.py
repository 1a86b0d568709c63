"""Decode steps' projections read their bound weights as ``[N, K]``, K contiguous.

A model's linear layer reaches Relax as ``matmul(x, permute_dims(W))`` with ``W`` stored
``[N, K]`` (torch's ``nn.Linear``); ``prepare``'s FoldConstant then stores the transpose,
``[K, N]``. For prefill that is a matmul like any other. For a decode step (a few rows of
``x``) it turns the GEMV into a column sum over ``[K, N]``, which the GEMV template does not
take: the matmul template's configs leave most SMs idle there, and in a batch-1 decode MLP
stock Dlight's schedules won both GEMVs (0.58x of torch in a CUDA graph, H200). Read ``[N, K]``,
the product is a GEMV the GEMV template streams at the bandwidth limit (1x11008x4096 alone:
1.09x torch, H200). :func:`decode_weight_layout` makes that product ``x @ W^T`` over the weight
stored ``[N, K]``, for matmuls with at most :data:`DECODE_ROWS` rows of ``x`` and a bound 2-D
weight.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from fastdlight.policies.select import DECODE_ROWS
from fastdlight.relax.aligned import matmul_nt
from fastdlight.relax.rewrites import calls_pass, constant_value, static_shape


def decode_weight_layout() -> tvm.transform.Pass:
    """``matmul(x, W)`` with at most :data:`DECODE_ROWS` rows of ``x`` and ``W`` a bound
    ``[K, N]`` constant (or a cast or transpose of one) as ``x @ W^T`` over ``W`` stored
    ``[N, K]`` (:func:`~fastdlight.relax.aligned.matmul_nt`)."""

    def rewrite(mutator, call):
        x, w = call.args
        sx, sw = static_shape(x), static_shape(w)
        if sx is None or sw is None or len(sx) < 2 or len(sw) != 2 or math.prod(sx[:-1]) > DECODE_ROWS:
            return call
        weight = constant_value(mutator, w)
        if weight is None or weight.shape != tuple(sw):
            return call
        rows_k = relax.const(np.ascontiguousarray(weight.T), str(w.ty.dtype))
        return mutator.builder_.call_te(matmul_nt, x, rows_k, str(call.ty.dtype), primfunc_name_hint="matmul_nt")

    return calls_pass("fastdlight.DecodeWeightLayout", "relax.matmul", rewrite)
