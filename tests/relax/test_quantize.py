"""quantize_weights: a model's linear weights become 4-bit packed weights and group scales,
read by one 4-bit matmul kernel; the values are the dequantized weights' (CPU)."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import fastdlight
from fastdlight import ops
from fastdlight.analysis.weight_only import WeightOnlyShape, match_weight_only
from fastdlight.compiler.compile import cuda_source
from fastdlight.relax import prepare
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.relax.quantize import quantize_packed, quantize_weights

H100 = "nvidia/nvidia-h100"
T, K, N = 4, 256, 64


def linear_model(weight: np.ndarray, bias: np.ndarray) -> tvm.IRModule:
    """``x @ W^T + b`` as the exporter writes ``nn.Linear`` (W bound ``[N, K]``), fp16."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, T, K), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(relax.const(weight, "float16")))
            y = bb.emit(relax.op.add(relax.op.matmul(x, wt), relax.const(bias, "float16")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def run_llvm(mod, x):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_point", [False, True])
def test_quantized_weights_round_trip_within_half_a_step(zero_point, bits):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, size=(N, K)).astype(np.float32)
    w[3, :64] += 0.3  # one group offset: the zero point's case
    q, s, z = quantize_packed(w, 64, zero_point, bits)
    assert q.shape == (N, K * bits // 32) and q.dtype == np.uint32 and s.shape == (N, K // 64)
    back = ops.dequantize_weights(q, s.astype(np.float16), None if z is None else z.astype(np.float16), 64,
                                  bits=bits)
    step = np.repeat(s, 64, axis=1)
    assert np.all(np.abs(back - w) <= 0.5 * step + 2e-3 * np.abs(w) + 1e-4)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_point", [False, True])
def test_a_linear_layer_runs_on_its_dequantized_weights(zero_point, bits):
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.05, size=(N, K)).astype(np.float16)
    b = rng.normal(0, 0.1, size=(N,)).astype(np.float16)
    mod = linear_model(w, b)
    quantized = quantize_weights(bits=bits, group_size=64, zero_point=zero_point)(mod)
    calls = [f for f in prim_funcs(quantized) if f.startswith(f"matmul_int{bits}")]
    assert len(calls) == 1
    # the function says what it is, for the dequantizing GEMV template
    func = quantized[calls[0]]
    assert match_weight_only(func) == WeightOnlyShape((1, T), N, K, 64, "float16", "float16", zero_point, bits)
    consts = _tensor_constants(quantized["main"])
    assert [a.shape for a in consts if a.dtype == np.uint32] == [(N, K * bits // 32)]  # the packed weight
    assert not any(a.shape in ((N, K), (K, N)) for a in consts)  # and no copy of W
    x = rng.normal(0, 1, size=(1, T, K)).astype(np.float16)
    q, s, z = quantize_packed(w.astype(np.float32), 64, zero_point, bits)
    deq = ops.dequantize_weights(q, s.astype(np.float16), None if z is None else z.astype(np.float16), 64, bits=bits)
    want = x.astype(np.float64) @ deq.T + b
    np.testing.assert_allclose(run_llvm(quantized, x), want, atol=2e-2, rtol=2e-2)


def _tensor_constants(func) -> list[np.ndarray]:
    found = []

    def visit(e):
        if isinstance(e, tvm.ir.expr.Constant) and hasattr(e.value, "numpy"):
            found.append(e.value.numpy())

    relax.analysis.post_order_visit(func, visit)
    return found


def test_weights_that_do_not_fit_the_groups_and_other_bits_are_left_or_refused():
    mod = linear_model(np.zeros((N, K), np.float16), np.zeros((N,), np.float16))
    kept = quantize_weights(group_size=96)(mod)  # 256 is not a multiple of 96
    assert not [f for f in prim_funcs(kept) if f.startswith("matmul_int4")]
    with pytest.raises(ValueError, match="bits=3 is not supported"):
        quantize_weights(bits=3)
    with pytest.raises(ValueError, match="positive multiple of 8"):
        quantize_weights(group_size=12)


@pytest.mark.parametrize("bits", [4, 8])
def test_the_quantized_model_tunes_and_builds_for_hopper(bits):
    rng = np.random.default_rng(2)
    mod = linear_model(rng.normal(0, 0.05, (N, K)).astype(np.float16), np.zeros((N,), np.float16))
    prepared = prepare(H100)(quantize_weights(bits=bits, group_size=128)(mod))
    tuning = fastdlight.ApplyFastTuning(topk=1, target=H100, measure=False, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(prepared)
    assert all(e.status in ("tuned", "view") for e in tuning.report), tuning.report
    # decode rows (4): the product kept out of fusion with the bias, for the dequantizing GEMV
    kinds = {e.function: e.config.kind for e in tuning.report if e.config is not None}
    assert kinds[f"matmul_int{bits}"] == "gemv_dequant" and len(kinds) == 2, kinds
    src = cuda_source(fastdlight.build(tuned, H100))
    assert "uint" in src and ">>" in src and ("fdl_w8_dot16" if bits == 8 else "fdl_w4_dot32") in src
