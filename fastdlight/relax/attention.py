"""Attention as models reach Relax: rewrites of the forms ``torch.export`` gives.

torch's SDPA, decomposed, guards its softmax against rows that are masked whole: it computes
``where(all(scores == -inf, axis=-1), 0, softmax(scores))``, two more passes over the
``B*H*TQ*TKV`` scores (GPT-2 at 1x512: an ``equal``/``max`` kernel and a ``where`` kernel per
layer). Where the scores are ``x + mask`` with ``mask`` a constant that leaves every row at
least one finite entry (a causal mask from positions, computed at compile time by
:mod:`.constants`) and ``x`` a finite product, no row is masked whole and the guard is the
softmax itself. :func:`unguarded_softmax` drops it there.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from fastdlight.relax.rewrites import bound_value, call_to, constant_value, mutator_pass

#: ops a guard's condition passes through on its way to ``equal(scores, -inf)``
GUARD_STEPS = ("relax.logical_not", "relax.astype", "relax.max", "relax.reshape", "relax.broadcast_to")


@mutator
class _UnguardedSoftmax(PyExprMutator):
    """:func:`unguarded_softmax`'s rewrite: a guarded softmax whose rows all keep an entry, unguarded."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        where = call_to(call, "relax.where")
        if where is None:
            return call
        cond, zeros, probs = where.args
        scores = self.softmax_input(probs)
        if scores is None or not self.is_zero(zeros) or not self.guards(cond, scores) \
                or not self.rows_keep_an_entry(scores):
            return call
        return probs

    def through(self, expr, ops):
        """``expr`` with the calls of ``ops`` around it peeled (each bound value looked up)."""
        value = bound_value(self, expr)
        while call_to(value, *ops) is not None:
            expr = value.args[0]
            value = bound_value(self, expr)
        return expr

    def softmax_input(self, probs):
        softmax = call_to(bound_value(self, self.through(probs, ("relax.reshape",))), "relax.nn.softmax")
        return None if softmax is None else self.through(softmax.args[0], ("relax.reshape",))

    def is_zero(self, expr):
        value = bound_value(self, expr)
        fill = call_to(value, "relax.full_like", "relax.full")
        if fill is not None:
            constant = constant_value(self, fill.args[1])
            return constant is not None and not np.any(constant)
        if call_to(value, "relax.zeros_like", "relax.zeros") is not None:
            return True
        constant = constant_value(self, expr)
        return constant is not None and not np.any(constant)

    def guards(self, cond, scores) -> bool:
        """``cond`` reduces ``equal(s, -inf)`` of the scores ``s`` (up to reshapes)."""
        inner = bound_value(self, self.through(cond, GUARD_STEPS))
        equal = call_to(inner, "relax.equal")
        if equal is None:
            return False
        bound = constant_value(self, equal.args[1])
        return bound is not None and bound.size == 1 and float(bound) == -math.inf \
            and self.through(equal.args[0], ("relax.reshape",)).same_as(scores)

    def rows_keep_an_entry(self, scores) -> bool:
        add = call_to(bound_value(self, scores), "relax.add")
        if add is None:
            return False
        for x, mask in (add.args, add.args[::-1]):
            values = constant_value(self, mask)
            product = call_to(bound_value(self, x), "relax.matmul", "relax.reshape", "relax.multiply")
            if values is not None and values.ndim >= 1 and product is not None:
                return bool(np.all(np.any(np.isfinite(values), axis=-1)))
        return False


def unguarded_softmax() -> tvm.transform.Pass:
    """``where(guard, zeros, softmax(x + mask))`` as ``softmax(x + mask)`` (see the module
    docstring for when)."""
    return mutator_pass("fastdlight.UnguardedSoftmax", _UnguardedSoftmax, relax.transform.DeadCodeElimination())
