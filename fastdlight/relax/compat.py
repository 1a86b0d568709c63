"""Exported graphs put in forms TVM 0.27's ``ToMixedPrecision`` and ``ConvertLayout`` take.

``ToMixedPrecision`` gives each op with no mixed-precision policy (``clip``, ``triu``, ``tril``,
``one_hot``...: fp32 only) its arguments back in their old dtypes where an argument became fp16,
and asks every argument for a tensor type there, a ``PrimValue`` bound included: ``Expected
TensorType, but got T.int64``. torch's ReLU6, hardtanh, hardswish, hardsigmoid and clamp are all
exported as ``clip(x, PrimValue, PrimValue)``, so MobileNets stopped there whenever ``x`` came
out of a convolution (which leaves it fp16). :func:`clips_as_bounds` writes such a clip as
``minimum(maximum(x, lo), hi)`` with constant bounds, which follow their input's dtype (the
values are the same: the bounds are exact in fp16 and clipping commutes with rounding). For the
other such ops, :func:`fp32_operands` casts their float operands to fp32 in front of them, as
the pass meant to, so that their arguments stay what they were; the casts left as no-ops go again
in :func:`identity_casts`.

TVM's GPU ``cumsum`` kernel moves four elements at a time as one vector, which for bool (the
importer keeps a bool ``cumsum``'s dtype, where torch counts in int64: Hugging Face's mask code
has one) is a misaligned access: :func:`bool_cumsums` counts in int32 and casts back to bool.

``ConvertLayout`` runs out of memory (``std::bad_alloc``) on a ``squeeze`` with a negative axis
(ViT's ``qkv.unsqueeze(0).transpose(0, -2).squeeze(-2)``): :func:`squeeze_axes` counts them from
the front.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.relax.rewrites import bound_value, call_to, mutator_pass, scalar_constant

#: the float dtypes ``ToMixedPrecision`` narrows (and keeps in fp32 for ops without a policy)
FP32 = "float32"
#: the dtypes of a ``clip`` written as ``maximum``/``minimum``
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def float_inputs(func: relax.Function, count: int) -> list[str]:
    """The names of ``func``'s first ``count`` parameters that are fp32 tensors: the inputs a
    ``.half()`` model takes in fp16. Integer ones (token ids, positions) and booleans (masks)
    keep their dtype: ``ToMixedPrecision`` makes every input it is named fp16, whatever its
    dtype."""
    return [str(p.name) for p in func.params[:count]
            if isinstance(p.ty, relax.TensorType) and str(p.ty.dtype) == FP32]


def _bound(value) -> float | None:
    """A ``clip`` bound's value (a constant ``PrimValue``), else None."""
    if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return float(value.value)
    return None


def clips_as_bounds() -> tvm.transform.Pass:
    """``clip(x, lo, hi)`` of a float ``x`` with constant bounds as ``minimum(maximum(x, lo),
    hi)`` (an infinite bound dropped); see the module docstring."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call_to(call, "relax.clip") is None or not isinstance(call.ty, relax.TensorType):
                return call
            dtype = str(call.ty.dtype)
            lo, hi = _bound(call.args[1]), _bound(call.args[2])
            if dtype not in FLOAT_DTYPES or lo is None or hi is None:
                return call
            out = call.args[0]
            if lo != -math.inf:
                out = relax.op.maximum(out, relax.const(lo, dtype))
            if hi != math.inf:
                out = relax.op.minimum(out, relax.const(hi, dtype))
            return out

    return mutator_pass("fastdlight.ClipsAsBounds", Rewriter)


def _policy_free(call) -> bool:
    """An op call ``ToMixedPrecision`` keeps in fp32 (no policy) that has an argument that is no
    tensor (a ``PrimValue``, a shape)."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    if call.op.get_attr("TMixedPrecisionPolicy") is not None or call.op.name.startswith(("relax.call_", "relax.builtin")):
        return False
    return any(not _is_tensor(a.ty) for a in call.args)


def _is_tensor(ty) -> bool:
    if isinstance(ty, relax.TupleType):
        return all(_is_tensor(f) for f in ty.fields)
    return isinstance(ty, relax.TensorType)


def fp32_operands() -> tvm.transform.Pass:
    """Before ``ToMixedPrecision``: each fp32 tensor operand of an op call with no mixed-precision
    policy and an argument that is no tensor read through ``astype(x, "float32")`` (a no-op
    here). ``ToMixedPrecision`` narrows the cast's input where it narrows ``x``; the op's own
    arguments stay as they were, which that pass then leaves alone (see the module docstring)."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not _policy_free(call):
                return call
            args = [relax.op.astype(a, FP32) if isinstance(a, relax.Var) and isinstance(a.ty, relax.TensorType)
                    and str(a.ty.dtype) == FP32 else a for a in call.args]
            if all(a.same_as(b) for a, b in zip(args, call.args)):
                return call
            return relax.Call(call.op, args, call.attrs, call.ty_args)

    return mutator_pass("fastdlight.Fp32Operands", Rewriter)


def identity_casts() -> tvm.transform.Pass:
    """``astype(x, dtype)`` where ``x`` already is ``dtype`` as ``x`` (what :func:`fp32_operands`
    leaves where ``ToMixedPrecision`` narrowed nothing)."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            cast = call_to(call, "relax.astype")
            if cast is not None and isinstance(cast.args[0].ty, relax.TensorType) \
                    and str(cast.args[0].ty.dtype) == str(cast.attrs.dtype):
                return cast.args[0]
            return call

    return mutator_pass("fastdlight.IdentityCasts", Rewriter, relax.transform.DeadCodeElimination())


def scalar_constant_casts() -> tvm.transform.Pass:
    """``astype(c, dtype)`` of a one-element constant as that constant in ``dtype``. Left to
    ``prepare``'s FoldConstant, which runs after LegalizeOps, the cast becomes a 0-d tensor the
    fused kernel loads (GPT-2's GELU had five); folded here, LegalizeOps writes it into the kernel
    as an immediate, the value the kernel is tuned and checked with."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            cast = call_to(call, "relax.astype")
            value = scalar_constant(bound_value(self, cast.args[0])) if cast is not None else None
            if value is None:
                return call
            shape = [int(d) for d in cast.args[0].ty.shape]
            return relax.const(np.full(shape, value, dtype=str(cast.attrs.dtype)))

    return mutator_pass("fastdlight.ScalarConstantCasts", Rewriter, tvm.transform.Sequential(
        [relax.transform.CanonicalizeBindings(), relax.transform.DeadCodeElimination()]))


def squeeze_axes() -> tvm.transform.Pass:
    """``squeeze`` with negative axes counted from the front (before ``ConvertLayout``, which
    fails on them)."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            squeeze = call_to(call, "relax.squeeze")
            if squeeze is None or squeeze.attrs.axis is None or not isinstance(squeeze.args[0].ty, relax.TensorType):
                return call
            ndim = squeeze.args[0].ty.ndim
            axes = [int(a) for a in squeeze.attrs.axis]
            if ndim < 0 or all(a >= 0 for a in axes):
                return call
            return relax.op.squeeze(squeeze.args[0], [a % ndim for a in axes])

    return mutator_pass("fastdlight.SqueezeAxes", Rewriter)


def bool_cumsums() -> tvm.transform.Pass:
    """``cumsum`` of bools as ``astype(cumsum(astype(x, int32)), bool)``: the same truth values
    (a bool sum is nonzero once any term is), through a kernel that runs."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            cumsum = call_to(call, "relax.cumsum")
            if cumsum is None or not _is_tensor(cumsum.args[0].ty) or str(cumsum.args[0].ty.dtype) != "bool":
                return call
            out_dtype = str(cumsum.attrs.dtype) if cumsum.attrs.dtype is not None else "bool"
            if out_dtype not in ("bool", ""):
                return call  # counted in its own integer dtype already
            counts = relax.op.cumsum(relax.op.astype(cumsum.args[0], "int32"), cumsum.attrs.axis, "int32",
                                     cumsum.attrs.exclusive)
            return relax.op.astype(counts, "bool")

    return mutator_pass("fastdlight.BoolCumsums", Rewriter)


def for_mixed_precision() -> tvm.transform.Pass:
    """What goes before ``ToMixedPrecision`` (:func:`clips_as_bounds`, :func:`fp32_operands`)."""
    return tvm.transform.Sequential([clips_as_bounds(), fp32_operands()], name="fastdlight.ForMixedPrecision")
