"""Graph rewrites before fusion that keep the values and give FuseOps better kernels to make:
integer powers as products, decomposed RMSNorms as one ``rms_norm``, attention's softmax reading
fp16 scores, causal masks computed from the indices; fp16 model outputs. (Reshapes around
matmuls: :mod:`.reshapes`.)"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx, topi
from tvm.ir import IRModule
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard
from tvm.relax.expr_functor import PyExprMutator, mutator

#: relax's OpPatternKind.kOpaque: AnnotateTIROpPattern keeps it, FuseOps fuses nothing with it
OPAQUE = 8


def add_opaque_func(builder: relax.BlockBuilder, func: tirx.PrimFunc, name: str) -> relax.GlobalVar:
    """``func`` added to ``builder``'s module as :data:`OPAQUE` (kept whole: a template finds its
    shape attribute), with the name the module gives it (``name1``, ...) as its symbol, so that no
    two share one."""
    func = func.with_attr("op_pattern", OPAQUE)
    gvar = builder.add_func(func, name)
    builder.update_func(gvar, func.with_attr("global_symbol", gvar.name_hint))
    return gvar


def call_to(value, *ops):
    """``value`` when it is a call of one of the operators ``ops``, else None."""
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ops:
        return value
    return None


def bound_value(mutator: PyExprMutator, expr):
    """What ``expr`` is bound to in the function ``mutator`` visits (``expr`` itself when it is
    no variable)."""
    return mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else expr


def constant_value(mutator: PyExprMutator, expr) -> np.ndarray | None:
    """``expr``'s value as numpy when it is a constant, or a cast (to fp16/bf16/fp32) or
    ``permute_dims`` of one (a bound weight as ``ToMixedPrecision`` and the exporter leave it),
    else None."""
    value = bound_value(mutator, expr)
    if isinstance(value, tvm.ir.expr.Constant):
        try:
            return value.value.numpy()
        except Exception:  # noqa: BLE001 - a dtype numpy cannot hold here (bf16 without ml_dtypes)
            return None
    call = call_to(value, "relax.astype", "relax.permute_dims")
    inner = None if call is None else constant_value(mutator, call.args[0])
    if inner is None:
        return None
    if call.op.name == "relax.permute_dims":
        axes = call.attrs.axes
        return np.transpose(inner, None if axes is None else [int(a) for a in axes])
    dtype = str(call.ty.dtype)
    return inner.astype(dtype) if dtype in ("float16", "bfloat16", "float32") else None


def scalar_constant(expr) -> float | None:
    """The value of a one-element constant, else None."""
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    try:
        value = expr.value.numpy()
    except Exception:  # noqa: BLE001 - a dtype numpy cannot hold here (bf16 without ml_dtypes)
        return None
    return float(value.reshape(())) if value.size == 1 else None


def static_shape(expr) -> list[int] | None:
    """``expr``'s shape when it is a tensor of static shape, else None."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    shape = ty.shape
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(v, tvm.tirx.IntImm) for v in shape.values):
        return None
    return [int(v) for v in shape.values]


def pattern_pass(name: str, pattern, rewrite) -> tvm.transform.Pass:
    """A module pass applying ``rewrite_call(pattern, rewrite)`` to every Relax function."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod: IRModule, _ctx) -> IRModule:
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gvar] = rewrite_call(pattern, rewrite, func)
        return out

    return run


def calls_pass(name: str, op: str, rewrite, finish=lambda mod: mod) -> tvm.transform.Pass:
    """A module pass giving every call of Relax op ``op`` (its arguments visited first) to
    ``rewrite(mutator, call)``, which returns the call or what replaces it (the mutator's block
    builder can add PrimFuncs: ``mutator.builder_.call_te``); ``finish`` as :func:`mutator_pass`."""

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            return rewrite(self, call) if getattr(call.op, "name", "") == op else call

    return mutator_pass(name, Rewriter, finish)


def mutator_pass(name: str, mutator_class, finish=lambda mod: mod) -> tvm.transform.Pass:
    """A module pass visiting every Relax function with a ``PyExprMutator`` subclass (made with
    the module, so its block builder can add PrimFuncs); ``finish`` gets the resulting module."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod: IRModule, _ctx) -> IRModule:
        rewriter = mutator_class(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return finish(rewriter.builder_.get())

    return run


#: constant exponents turned into multiplications by :func:`exact_integer_powers`
INTEGER_POWERS = (2, 3, 4)


def matches_pass(name: str, find, rewriter_class) -> tvm.transform.Pass:
    """A module pass replacing what ``find(function)`` (``{call: match}``) finds in each Relax
    function with ``rewriter_class(mod, matches)`` (a mutator that knows each match's
    replacement); a module with nothing found is returned as it is."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod: IRModule, _ctx) -> IRModule:
        found = {gvar: find(func) for gvar, func in mod.functions_items() if isinstance(func, relax.Function)}
        if not any(found.values()):
            return mod
        rewriter = rewriter_class(mod, {call: m for matches in found.values() for call, m in matches.items()})
        for gvar, matches in found.items():
            if matches:
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(mod[gvar]))
        return relax.transform.DeadCodeElimination()(rewriter.builder_.get())

    return run


def exact_integer_powers() -> tvm.transform.Pass:
    """``power(x, 2.0)`` (RMSNorm's ``x.pow(2)``, GELU's ``x**3``) as ``x * x [* x ...]``: the
    CUDA build uses fast math, whose ``powf`` is ``exp2(y * log2(x))``, NaN for every negative
    ``x``; the product is exact for any sign and cheaper."""
    base, exponent = wildcard(), is_const()
    pattern = is_op("relax.power")(base, exponent)

    def rewrite(expr, matches):
        value = matches[exponent].value.numpy()
        if value.size != 1 or float(value) not in INTEGER_POWERS:
            return expr
        x = matches[base]
        product = x
        for _ in range(int(float(value)) - 1):
            product = relax.op.multiply(product, x)
        return product

    return pattern_pass("fastdlight.ExactIntegerPowers", pattern, rewrite)


def softmax_of_fp16() -> tvm.transform.Pass:
    """``softmax(astype(x_fp16, "float32") [+ mask])`` (what ``ToMixedPrecision`` leaves of
    attention's fp16 scores) as one function that reads ``x`` in fp16 and computes in fp32, the
    same values. Otherwise FuseOps puts the cast (and the mask) into the kernel that produces
    ``x`` (the scores' matmul), which then writes fp32 scores that the softmax reads back: twice
    the bytes both ways."""

    def softmax_fp32(x, mask=None):
        wide = te.compute(x.shape, lambda *i: x(*i).astype("float32"), name="widen")
        return topi.nn.softmax(wide if mask is None else topi.add(wide, mask), axis=len(x.shape) - 1)

    @mutator
    class Rewriter(PyExprMutator):
        def bound(self, expr, op):
            return call_to(bound_value(self, expr), op)

        def widened(self, expr):
            cast = self.bound(expr, "relax.astype")
            if cast is not None and str(cast.ty.dtype) == "float32" and str(cast.args[0].ty.dtype) == "float16":
                return cast.args[0]
            return None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if getattr(call.op, "name", "") != "relax.nn.softmax" or int(call.attrs.axis) not in (-1, call.ty.ndim - 1):
                return call
            arg = call.args[0]
            if (x := self.widened(arg)) is not None:
                return self.builder_.call_te(softmax_fp32, x, primfunc_name_hint="softmax_fp16_in")
            add = self.bound(arg, "relax.add")
            if add is None:
                return call
            for scores, mask in (add.args, add.args[::-1]):
                x = self.widened(scores)
                if x is not None and str(mask.ty.dtype) == "float32" and mask.ty.ndim <= x.ty.ndim:
                    return self.builder_.call_te(softmax_fp32, x, mask, primfunc_name_hint="softmax_fp16_in")
            return call

    return mutator_pass("fastdlight.SoftmaxOfFp16", Rewriter, relax.transform.DeadCodeElimination())


def causal_masks() -> tvm.transform.Pass:
    """``x + M`` where ``M`` is a constant ``[S, S]`` (as a bound weight, or its cast) holding one
    value ``v`` above the diagonal and zeros elsewhere (a causal attention mask) as one function
    computing ``x + v`` where ``j > i`` and ``x`` elsewhere: the same values, from the indices
    instead of a read of ``M``. Fused into the scores' matmul, its epilogue then loads nothing
    but the accumulators."""

    def masked(x, value, dtype):
        v = tirx.const(value, dtype)
        return te.compute(x.shape, lambda *i: tirx.if_then_else(i[-1] > i[-2], x(*i) + v, x(*i)), name="causal")

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if getattr(call.op, "name", "") != "relax.add":
                return call
            for x, mask in (call.args, call.args[::-1]):
                shape, m = static_shape(x), constant_value(self, mask)
                if shape is None or m is None or m.ndim != 2 or list(m.shape) != shape[-2:] or m.shape[0] < 2:
                    continue
                if str(m.dtype) != str(x.ty.dtype) or str(x.ty.dtype) not in ("float16", "float32"):
                    continue
                value = m[0, 1]
                if value != 0 and np.array_equal(m, np.triu(np.full(m.shape, value, m.dtype), 1)):
                    return self.builder_.call_te(masked, x, float(value), str(x.ty.dtype), primfunc_name_hint="causal")
            return call

    return mutator_pass("fastdlight.CausalMasks", Rewriter, relax.transform.DeadCodeElimination())


def rms_norms() -> tvm.transform.Pass:
    """``x * rsqrt(mean(x * x, axis=-1, keepdims) + eps) * w`` (RMSNorm as ``torch.export``
    decomposes it, ``x.pow(2)`` included) as ``nn.rms_norm(x, w, axes=[-1], eps)``: one reduction
    function. Decomposed, FuseOps leaves the square a kernel of its own (``x`` feeds both it and
    the scaling), writing and re-reading a tensor the size of the activation."""
    x_in, two, eps, weight = wildcard(), is_const(), is_const(), wildcard()
    # an fp16 input is widened for the scaling, and squared in fp16 then widened for the mean
    # (``ToMixedPrecision`` of a model whose input is fp16; the exponent a cast constant)
    x = is_op("relax.astype")(x_in) | x_in
    exponent = two | is_op("relax.astype")(two)
    square = (is_op("relax.power")(x, exponent) | is_op("relax.multiply")(x, x)
              | is_op("relax.astype")(is_op("relax.power")(x_in, exponent) | is_op("relax.multiply")(x_in, x_in)))
    mean_of_square = is_op("relax.mean")(square)
    inv = is_op("relax.rsqrt")(is_op("relax.add")(mean_of_square, eps))
    pattern = is_op("relax.multiply")(is_op("relax.multiply")(x, inv), weight)

    def rewrite(call, matches):
        mean, xs, w = matches[mean_of_square], matches[x], matches[weight]
        axis = [int(a) for a in mean.attrs.axis] if mean.attrs.axis is not None else []
        if two in matches and float(matches[two].value.numpy()) != 2.0:
            return call
        if axis not in ([-1], [xs.ty.ndim - 1]) or not mean.attrs.keepdims or w.ty.ndim != 1:
            return call
        epsilon = float(matches[eps].value.numpy())
        if matches[eps].value.numpy().size != 1 or str(xs.ty.dtype) != str(w.ty.dtype):
            return call
        narrow = matches[x_in]
        if not narrow.same_as(xs) and str(narrow.ty.dtype) == "float16":
            # the norm of the fp16 input itself: it computes in fp32 inside, and a separate
            # widening kernel (FuseOps puts no cast in front of a reduction) goes away
            w16 = relax.op.astype(w, "float16")
            return relax.op.astype(relax.op.nn.rms_norm(narrow, w16, axes=[-1], epsilon=epsilon), str(xs.ty.dtype))
        return relax.op.nn.rms_norm(xs, w, axes=[-1], epsilon=epsilon)

    return pattern_pass("fastdlight.RMSNorms", pattern, rewrite)


def fp16_outputs(func_name: str = "main") -> tvm.transform.Pass:
    """``func_name`` returns its float results in fp16, as a ``.half()`` torch model does: an
    output ``astype(y_fp16, "float32")`` (what ``ToMixedPrecision`` puts before each result of an
    fp32 model) becomes ``y``, and an output computed in fp32 (a reduction) is cast to fp16, a
    cast that fuses into its producer. The cast kernels and half of the output's bytes go away."""

    def narrowed(var, bindings, extra):
        if not isinstance(var.ty, relax.TensorType) or str(var.ty.dtype) != "float32":
            return var
        cast = call_to(bindings.get(var), "relax.astype")
        if cast is not None and str(cast.args[0].ty.dtype) == "float16":
            return cast.args[0]
        narrow = relax.DataflowVar(f"{var.name}_fp16", relax.TensorType(var.ty.shape, "float16"))
        extra.append(relax.VarBinding(narrow, relax.op.astype(var, "float16")))
        return narrow

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.Fp16Outputs")
    def run(mod: IRModule, _ctx) -> IRModule:
        func = mod[func_name] if func_name in [g.name_hint for g in mod.get_global_vars()] else None
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return mod
        ret, blocks = func.body.body, func.body.blocks
        bindings = {b.var: b.value for block in blocks for b in block.bindings}
        value = bindings.get(ret) if isinstance(ret, relax.Var) else None
        fields = value.fields if isinstance(value, relax.Tuple) else [value]
        extra = []
        if isinstance(value, relax.Call) and isinstance(ret.ty, relax.TensorType):
            # one result bound to its call (``y = astype(...)``): the call bound to a local first
            # (left unused where it is the cast that goes, and then removed)
            local = relax.DataflowVar(f"{ret.name}_local", ret.ty)
            extra.append(relax.VarBinding(local, value))
            bindings[local], fields = value, [local]
        if value is None or not blocks or not isinstance(blocks[-1], relax.DataflowBlock) \
                or not all(isinstance(f, relax.DataflowVar) for f in fields) \
                or not any(b.var.same_as(ret) for b in blocks[-1].bindings):
            return mod  # not the dataflow form ToMixedPrecision leaves
        new_fields = [narrowed(f, bindings, extra) for f in fields]
        if all(a.same_as(b) for a, b in zip(new_fields, fields)):
            return mod
        new_value = relax.Tuple(new_fields) if isinstance(value, relax.Tuple) else new_fields[0]
        ty = relax.TupleType([f.ty for f in new_fields]) if isinstance(value, relax.Tuple) else new_fields[0].ty
        new_ret = relax.Var(ret.name, ty)
        last = [b for b in blocks[-1].bindings if not b.var.same_as(ret)] + extra + [relax.VarBinding(new_ret, new_value)]
        out = mod.clone()
        body = relax.SeqExpr([*blocks[:-1], relax.DataflowBlock(last)], new_ret)
        out[func_name] = relax.Function(func.params, body, ty, func.is_pure, func.attrs)
        return relax.transform.DeadCodeElimination()(out)

    return run
