"""Values a model computes without its inputs (CPU): evaluated once when it is compiled."""

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.relax import for_inference
from fastdlight.relax.constants import fold_weight_layouts, input_independent_values


def masked(n: int = 8, table=None):
    """``x + mask``, the mask built from positions as Hugging Face builds a causal one (a cumsum,
    comparisons of positions and of bools, a where); ``table``: a constant the mask also reads."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(relax.op.arange(0, n, 1, "int64"))
            seen = bb.emit(relax.op.cumsum(relax.op.astype(relax.op.not_equal(pos, relax.const(3, "int64")), "int32"),
                                           axis=0, dtype="int32"))
            causal = bb.emit(relax.op.less_equal(relax.op.expand_dims(pos, [0]), relax.op.expand_dims(pos, [1])))
            same = bb.emit(relax.op.equal(causal, causal))  # bools compared: LLVM's fcmp refuses i1
            keep = bb.emit(relax.op.logical_and(causal, same))
            bias = bb.emit(relax.op.where(keep, relax.const(0.0, "float32"), relax.const(-1e4, "float32")))
            bias = bb.emit(relax.op.add(bias, relax.op.astype(seen, "float32")))
            if table is not None:
                bias = bb.emit(relax.op.add(bias, relax.op.sum(relax.const(table), axis=[0, 1])))
            out = bb.emit_output(relax.op.add(x, bias))
        bb.emit_func_output(out)
    return bb.get()


def ops_of(mod) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return names


def expected_mask(n: int = 8):
    pos = np.arange(n)
    return np.where(pos[None, :] <= pos[:, None], 0.0, -1e4) + np.cumsum(pos != 3)


def test_a_mask_built_from_positions_becomes_a_constant():
    folded = input_independent_values()(masked())
    assert ops_of(folded) == ["relax.add"], ops_of(folded)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(folded, target="llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x + expected_mask(), rtol=1e-6)


def test_values_made_from_a_weight_are_left_to_prepare():
    table = np.ones((1024, 512), "float32")  # 2 MB: a weight
    ops = ops_of(input_independent_values()(masked(table=table)))
    assert "relax.sum" in ops and "relax.cumsum" not in ops, ops  # the mask before it is still folded


def test_values_beyond_the_byte_budget_are_left_alone():
    assert "relax.cumsum" in ops_of(input_independent_values(max_bytes=16)(masked()))


def test_for_inference_folds_the_mask():
    assert "relax.cumsum" not in ops_of(for_inference(masked(), [], fp16=False))


def weight_chain_module(cast_to: str):
    """``x @ permute_dims(astype(reshape(W)))``: a weight as the exporter and ToMixedPrecision
    leave a linear layer's."""
    w = np.random.default_rng(0).standard_normal((4, 8, 16)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 32), cast_to))
    with bb.function("main", [x]):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(relax.const(w), (16, 32)))
            cast = bb.emit(relax.op.astype(flat, cast_to))
            t = bb.emit(relax.op.permute_dims(cast))
            out = bb.emit_output(relax.op.matmul(x, t))
        bb.emit_func_output(out)
    return bb.get(), w


def matmul_weight(mod):
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) and e.op.name == "relax.matmul" else None)
    weight = found[0].args[1]
    bindings = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    return bindings.get(weight, weight)


def test_a_weight_s_reshape_cast_and_transpose_are_folded_on_the_host():
    mod, w = weight_chain_module("float16")
    folded = matmul_weight(fold_weight_layouts()(mod))
    assert isinstance(folded, tvm.ir.expr.Constant)
    expected = np.transpose(w.reshape(16, 32).astype("float16"))
    got = folded.value.numpy()
    assert got.dtype == np.float16 and np.array_equal(got, expected)


def constants_after_folding(mod) -> list[bytes]:
    found = []
    folded = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(mod))
    relax.analysis.post_order_visit(folded["main"], lambda e: found.append(e.value.numpy().tobytes())
                                    if isinstance(e, tvm.ir.expr.Constant) and hasattr(e.value, "numpy") else None)
    return sorted(found)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_host_folds_the_values_tvm_s_own_folding_computes(dtype):
    """numpy rounds a cast as LLVM does (to nearest even): the module keeps the same bytes."""
    mod, _ = weight_chain_module(dtype)
    folded = fold_weight_layouts()(mod)
    if dtype == "bfloat16":
        assert isinstance(matmul_weight(folded), tvm.ir.expr.Constant)
    assert constants_after_folding(folded) == constants_after_folding(mod)
