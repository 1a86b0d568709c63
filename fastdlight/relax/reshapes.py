"""Reshapes moved out of the way of fusion: a matmul's elementwise consumers fuse into its kernel.

``torch.export`` writes ``x @ W`` on a ``[B, S, D]`` activation as ``reshape(x, [B*S, D])``,
a 2-D matmul and a reshape back to ``[B, S, N]``, and batched attention (``q @ k.T`` on
``[B, H, S, D]``) as ``reshape`` to ``[B*H, S, D]``, a 3-D matmul and a reshape back. FuseOps
fuses elementwise consumers into a matmul, but not across the reshape back: the bias, the
activation, the residual add and attention's scaling each became a kernel of their own, about a
third of a decoder layer's time on an H100.

:func:`sink_reshapes` moves each reshape below the ops that do not care about the shape
(elementwise ops, and norms and softmax over a last axis the reshape keeps), reshaping a
full-size second operand the other way, until it meets the next matmul's flattening reshape and
the two cancel. The matmuls keep the rank they were exported with (2-D rows, one batch axis),
which is what the tensor-core templates take. A slice of a permutation is also rewritten as the
permutation of a slice, so attention's ``qkv.permute(...)[i]`` becomes one copy kernel per head
tensor instead of a permuted copy of all of QKV that three more kernels slice.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import IRModule
from tvm.relax.dpl import CallPattern, ExprPattern, OrPattern, is_op, rewrite_call, wildcard

from fastdlight.relax.rewrites import call_to, mutator_pass, static_shape

#: elementwise ops a reshape moves below (``op(reshape(x)) == reshape(op(x))``)
UNARY = ("relax.astype", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.relu", "relax.sigmoid",
         "relax.tanh", "relax.exp", "relax.negative", "relax.sqrt", "relax.rsqrt")  # fmt: skip
BINARY = ("relax.add", "relax.multiply", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum")
#: ops over the last axis only (``attrs.axis`` / ``attrs.axes`` = the last axis), with the number
#: of their further arguments (gamma, beta: over that axis)
LAST_AXIS = {"relax.nn.softmax": 0, "relax.nn.log_softmax": 0, "relax.nn.layer_norm": 2, "relax.nn.rms_norm": 1}
#: rounds of rewriting (each moves a reshape one op further down)
MAX_ROUNDS = 16


class _Bindings:
    """The values of a function's bound variables: patterns see ``lv3``, the rules need to know
    that ``lv3 = reshape(lv2, ...)``."""

    def __init__(self):
        self.values = {}

    def update(self, func) -> None:
        self.values = relax.analysis.get_var2val(func)

    def call(self, expr, *ops):
        """The call ``expr`` is (or is bound to) when its op is one of ``ops``, else None."""
        return call_to(self.values.get(expr, expr) if isinstance(expr, relax.Var) else expr, *ops)

    def is_weight(self, expr) -> bool:
        """``expr`` is a constant or a cast of one (a bound weight after ``ToMixedPrecision``)."""
        while (cast := self.call(expr, "relax.astype")) is not None:
            expr = cast.args[0]
        return isinstance(self.values.get(expr, expr) if isinstance(expr, relax.Var) else expr, tvm.ir.expr.Constant)


def _any_of(patterns):
    out = patterns[0]
    for p in patterns[1:]:
        out = out | p
    return out


def _merge_rule(bindings: _Bindings):
    """``reshape(reshape(x))`` as one reshape; a reshape or ``broadcast_to`` to the shape the
    tensor already has dropped."""
    x, shape = wildcard(), wildcard()
    pattern = is_op("relax.reshape")(x, shape) | is_op("relax.broadcast_to")(x, shape)

    def rewrite(call, matches):
        if not isinstance(call, relax.Call):  # a variable the pattern matched through its binding
            return call
        inner = matches[x]
        if call.op.name == "relax.reshape":
            while (reshape := bindings.call(inner, "relax.reshape")) is not None:
                inner = reshape.args[0]
        s_in, s_out = static_shape(inner), static_shape(call)
        if s_in is None or s_out is None:
            return call
        if s_in == s_out:
            return inner
        if not inner.same_as(matches[x]):
            return relax.op.reshape(inner, s_out)
        return call

    return pattern, rewrite


def _unary_rule(bindings: _Bindings):
    x, shape = wildcard(), wildcard()
    pattern = _any_of([is_op(op)(is_op("relax.reshape")(x, shape)) for op in UNARY])

    def rewrite(call, matches):
        inner, s_out = matches[x], static_shape(call)
        if static_shape(inner) is None or s_out is None:
            return call
        return relax.op.reshape(relax.Call(call.op, [inner], call.attrs, call.ty_args), s_out)

    return pattern, rewrite


def _binary_rule(bindings: _Bindings):
    """``op(reshape(x), y)`` where ``reshape(x)`` has the result's shape: ``y`` a scalar or over
    trailing axes the reshape keeps (a bias, a scale, also as ``[1, 1, 1, C]``) broadcasts the
    same way against ``x``; ``y`` of the full shape is reshaped to ``x``'s. A reshaped weight or
    operand that broadcasts (``reshape(bias, [1, C, 1, 1])`` added to a convolution's output)
    stays."""
    x, shape, other = wildcard(), wildcard(), wildcard()
    reshaped = is_op("relax.reshape")(x, shape)
    pattern = _any_of([p for op in BINARY for p in (is_op(op)(reshaped, other), is_op(op)(other, reshaped))])

    def rewrite(call, matches):
        inner, y = matches[x], matches[other]
        s_in, s_out, s_y = static_shape(inner), static_shape(call), static_shape(y)
        if None in (s_in, s_out, s_y) or len(s_in) >= len(s_out):
            return call  # only un-flattening reshapes move: the flattened operand's reshape must stay
        if static_shape(matches[reshaped]) != s_out or bindings.is_weight(inner):
            # a bias reshaped to broadcast ([C] as [1, C, 1, 1]) is no result's reshape, also
            # where it has the result's shape (batch 1, 1x1 pixels): moved, it reshapes the result
            return call
        core = s_y[next((i for i, v in enumerate(s_y) if v != 1), len(s_y)):]  # [1, 1, 1, C] broadcasts as [C]
        if s_y == s_out and len(s_out) > 0:
            y = relax.op.reshape(y, s_in)
        elif len(core) > min(len(s_in), len(s_out)) or (core and s_in[-len(core):] != s_out[-len(core):]):
            return call
        elif core != s_y:
            y = relax.op.reshape(y, core)
        args = [y, inner] if call.args[0].same_as(matches[other]) else [inner, y]
        return relax.op.reshape(relax.Call(call.op, args, call.attrs, call.ty_args), s_out)

    return pattern, rewrite


def _last_axis_rule(bindings: _Bindings):
    x, shape = wildcard(), wildcard()
    reshaped = is_op("relax.reshape")(x, shape)
    pattern = _any_of([is_op(op)(reshaped, *[wildcard() for _ in range(n)]) for op, n in LAST_AXIS.items()])

    def rewrite(call, matches):
        inner = matches[x]
        s_in, s_out = static_shape(inner), static_shape(call)
        if s_in is None or s_out is None or not s_in or s_in[-1] != s_out[-1]:
            return call
        axes = getattr(call.attrs, "axes", None)
        axes = [int(a) for a in axes] if axes is not None else [int(call.attrs.axis)]
        if axes != [-1]:  # counted from the end, the axis means the same in x's rank
            return call
        moved = relax.Call(call.op, [inner, *call.args[1:]], call.attrs, call.ty_args)
        return relax.op.reshape(moved, s_out)

    return pattern, rewrite


def _slice_rule(bindings: _Bindings):
    """``strided_slice(permute_dims(y))`` as ``permute_dims(strided_slice(y))``: attention's
    ``qkv.permute(2, 0, 3, 1, 4)[i]`` then copies one third of the QKV projection per head tensor,
    instead of permuting all of it into a buffer that three more kernels slice."""
    y = wildcard()
    permuted = is_op("relax.permute_dims")(y)
    pattern = is_op("relax.strided_slice")(permuted, varg_default_wildcard=True)

    def rewrite(call, matches):
        perm = bindings.call(call.args[0], "relax.permute_dims")
        if perm is None or static_shape(matches[y]) is None:
            return call
        rank = len(static_shape(matches[y]))
        order = [int(a) for a in perm.attrs.axes] if perm.attrs.axes is not None else list(range(rank))[::-1]
        axes = [int(a) % rank for a in call.args[1]]
        strides = call.args[4] if len(call.args) > 4 else None
        sliced = relax.op.strided_slice(matches[y], [order[a] for a in axes], call.args[2], call.args[3], strides,
                                        call.attrs.assume_inbound)
        return relax.op.permute_dims(sliced, order)

    return pattern, rewrite


RULES = (_merge_rule, _unary_rule, _binary_rule, _last_axis_rule, _slice_rule)


def _rules_pass(name: str, rule_makers) -> tvm.transform.Pass:
    """A Relax pass applying the rules of ``rule_makers`` in rounds until none changes a function.

    Each round is one ``rewrite_call`` of all the rules' patterns at once, each match handed to
    its rule by the op it is a call of (the rules' ops do not overlap): a ``rewrite_call`` that
    changes anything costs a rebuild of the whole function, and a round used to be five of
    them, one a rule (Swin-T: 35 calls, 4.7 s of ``for_inference``'s 10.6 on two cores)."""
    bindings = _Bindings()
    rules = [rule(bindings) for rule in rule_makers]
    pattern = _any_of([p for p, _ in rules])
    by_op = {op: rewrite for p, rewrite in rules for op in _root_ops(p)}

    def rewrite(call, matches):
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        rule = by_op.get(call.op.name)
        return call if rule is None else rule(call, matches)

    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod: IRModule, _ctx) -> IRModule:
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            for _ in range(MAX_ROUNDS):
                before = func
                bindings.update(func)
                func = rewrite_call(pattern, rewrite, func)
                if before.same_as(func) or tvm_ffi.structural_equal(before, func):
                    break
            out[gvar] = relax.analysis.remove_all_unused(func)
        return out

    return run


def _root_ops(pattern) -> list[str]:
    """The ops whose calls ``pattern`` (a call pattern or alternatives of them) matches."""
    if isinstance(pattern, OrPattern):
        return _root_ops(pattern.left) + _root_ops(pattern.right)
    return [pattern.op.expr.name] if isinstance(pattern, CallPattern) and isinstance(pattern.op, ExprPattern) else []


def sink_reshapes() -> tvm.transform.Pass:
    """The Relax pass (before ``LegalizeOps``; see the module docstring)."""
    return _rules_pass("fastdlight.SinkReshapes", RULES)


def merge_reshapes() -> tvm.transform.Pass:
    """Reshape chains as one reshape, and reshapes to the shape a tensor has dropped. For after
    the attention rewrites: the matmuls they replace leave the batch-flattening reshape and its
    inverse around the fused call, which FuseOps made one copy kernel each side (two launches of
    ~1 us in a ~20 us decode step)."""
    return _rules_pass("fastdlight.MergeReshapes", (_merge_rule,))


def output_reshape_views() -> tvm.transform.Pass:
    """After ``LegalizeOps``: a reshape kernel whose result leaves its dataflow block (a model's
    output), bound to a block-local variable first, so that TVM's ``RewriteDataflowReshape``
    makes it a view as it does every local reshape.

    That pass leaves reshapes of a block's outputs as copy kernels: ResNet's 3-channel stem as a
    one-layer model is an im2col GEMM whose ``[N*P*Q, K]`` result the model returns reshaped to
    NHWC, and the copy took 47 us of its 108 on an H100 (2026-11-26). A view of the GEMM's
    output is safe to return: the memory planner gives no pooled storage to a tensor that a
    view of it carries out of the function. Only reshapes of block-local values are rewritten
    (a view of a parameter would alias the caller's input)."""
    from tvm.relax.analysis import has_reshape_pattern
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Rewriter(PyExprMutator):
        def __init__(self, mod: IRModule):
            super().__init__(mod)
            self.mod = mod

        def reshapes_local(self, value) -> bool:
            call = call_to(value, "relax.call_tir")
            if call is None or not isinstance(call.args[0], relax.GlobalVar):
                return False
            func = self.mod[call.args[0]]
            inputs = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
            # has_reshape_pattern reads a block's body (not a dispatcher's or a TIRx kernel's)
            return (isinstance(func, tvm.tirx.PrimFunc) and isinstance(func.body, tvm.s_tir.SBlockRealize)
                    and has_reshape_pattern(func) and all(isinstance(x, relax.DataflowVar) for x in inputs))

        def visit_var_binding_(self, binding):
            if isinstance(binding.var, relax.DataflowVar) or not self.reshapes_local(binding.value):
                return super().visit_var_binding_(binding)
            local = self.builder_.emit(self.visit_expr(binding.value), name_hint=f"{binding.var.name}_view")
            self.builder_.emit_normalized(relax.VarBinding(binding.var, local))
            return None

    return mutator_pass("fastdlight.OutputReshapeViews", Rewriter)
