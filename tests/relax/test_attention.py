"""Attention's forms (CPU): SDPA's guard against rows masked whole goes where no row can be."""

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.relax.attention import unguarded_softmax


def guarded(mask: np.ndarray | None, t: int = 8, d: int = 4):
    """torch.export's SDPA math: softmax(q k^T + mask), guarded as torch guards it; ``mask``
    None: an input."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, 2, t, d), "float32"))
    k = relax.Var("k", relax.TensorType((1, 2, d, t), "float32"))
    params = [q, k]
    if mask is None:
        m = relax.Var("mask", relax.TensorType((t, t), "float32"))
        params.append(m)
    else:
        m = relax.const(mask)
    with bb.function("main", params):
        with bb.dataflow():
            scores = bb.emit(relax.op.add(relax.op.matmul(q, k), m))
            probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            live = bb.emit(relax.op.astype(relax.op.logical_not(relax.op.equal(scores, relax.const(-np.inf, "float32"))), "int8"))
            dead = bb.emit(relax.op.logical_not(relax.op.astype(relax.op.max(live, axis=[-1], keepdims=True), "bool")))
            out = bb.emit_output(relax.op.where(dead, relax.op.full_like(probs, relax.const(0.0, "float32")), probs))
        bb.emit_func_output(out)
    return bb.get()


def causal(t: int = 8) -> np.ndarray:
    return np.where(np.tril(np.ones((t, t), bool)), 0.0, -np.inf).astype("float32")


def op_names(mod) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return names


def run(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


def test_a_causal_mask_leaves_the_softmax_unguarded_with_the_same_values():
    mod = guarded(causal())
    rewritten = unguarded_softmax()(mod)
    assert "relax.where" not in op_names(rewritten) and "relax.equal" not in op_names(rewritten)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 8, 4)).astype("float32"), rng.standard_normal((1, 2, 4, 8)).astype("float32")
    np.testing.assert_allclose(run(rewritten, q, k), run(mod, q, k), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mask", [None, "a row masked whole"])
def test_the_guard_stays_where_a_row_may_be_masked_whole(mask):
    if mask is not None:
        mask = causal()
        mask[3] = -np.inf
    assert "relax.where" in op_names(unguarded_softmax()(guarded(mask)))
