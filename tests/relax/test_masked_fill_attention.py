"""Attention masked with ``masked_fill(~tril(ones(T, T)), -inf)`` (CPU): the scalar ``-inf`` the
export binds to a variable survives :func:`input_independent_values`, the module stays well
formed through ``for_inference``, and the attention fuses to one call per layer with the
unfused module's values. Torch-free in TVMScript; with torch, a GPT-2 style block exported."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from fastdlight.relax import for_inference, prepare
from fastdlight.relax.constants import input_independent_values
from fastdlight.relax.fuse_attention import fused_attention
from test_fuse_attention import attention_calls, causal_keep, reference, run

H100 = "nvidia/nvidia-h100"
T, D = 16, 64


@I.ir_module
class MaskedFill:
    """The graph ``from_exported_program`` makes of ``softmax(masked_fill(q @ kᵀ / 8,
    ~tril(ones(T, T, bool)), -inf)) @ v``: the tril from ``arange``'d positions, the fill value
    a scalar constant bound to a variable of its own."""

    @R.function
    def main(q: R.Tensor((1, 2, 16, 64), "float32"), k: R.Tensor((1, 2, 16, 64), "float32"),
             v: R.Tensor((1, 2, 16, 64), "float32")) -> R.Tensor((1, 2, 16, 64), "float32"):
        with R.dataflow():
            ones = R.full(R.shape([16, 16]), R.const(True, "bool"), dtype="bool")
            rows = R.expand_dims(R.arange(0, 16, 1, dtype="int64"), axis=[1])
            cols = R.expand_dims(R.arange(0, 16, 1, dtype="int64"), axis=[0])
            tril = R.logical_and(R.less_equal(R.subtract(cols, rows), R.const(0, "int64")), ones)
            masked = R.bitwise_not(tril)
            kt = R.permute_dims(k, axes=[0, 1, 3, 2])
            scores = R.divide(R.matmul(q, kt, out_dtype="float32"), R.const(8.0, "float32"))
            ninf = R.const(float("-inf"), "float32")
            filled = R.where(masked, ninf, scores)
            probs = R.nn.softmax(filled, axis=-1)
            out = R.matmul(probs, v, out_dtype="float32")
            R.output(out)
        return out


def test_a_bound_scalar_constant_the_mask_fills_with_is_kept():
    folded = input_independent_values()(MaskedFill)
    relax.analysis.well_formed(folded)  # raises on a variable read but not bound
    ops = set()
    relax.analysis.post_order_visit(folded["main"], lambda e: ops.add(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    assert not {"relax.arange", "relax.logical_and", "relax.bitwise_not"} & ops, ops
    q, k, v = (np.random.default_rng(i).standard_normal((1, 2, T, D)).astype("float32") for i in range(3))
    np.testing.assert_allclose(run(folded, q, k, v), reference(q, k, v, causal_keep(T, T)), atol=1e-5, rtol=1e-5)


def test_masked_fill_fuses_causal_with_the_unfused_values():
    mod = for_inference(MaskedFill, fp16_io=True)
    relax.analysis.well_formed(mod)
    fused = fused_attention(H100)(mod)
    (attr,) = attention_calls(fused)
    assert attr["causal"] and attr["scale"] == pytest.approx(1 / math.sqrt(D))
    q, k, v = (np.random.default_rng(i).standard_normal((1, 2, T, D)).astype("float16") for i in range(3))
    unfused = run(mod, q, k, v)
    np.testing.assert_allclose(run(fused, q, k, v), unfused, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(unfused, reference(q, k, v, causal_keep(T, T)), atol=2e-3, rtol=1e-2)


# ---- torch: a GPT-2 style block, exported ------------------------------------------------------

def gpt2_style(layers: int = 2, d: int = 128, heads: int = 2, seq: int = 32):
    # torch is optional (the callers skip without it)
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=-1)
            q, k, v = (y.view(b, t, heads, c // heads).transpose(1, 2) for y in (q, k, v))
            scores = q @ k.transpose(-1, -2) / math.sqrt(c // heads)
            scores = scores.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
            return x + self.out(y.transpose(1, 2).reshape(b, t, c))

    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block() for _ in range(layers))).eval(), torch.randn(1, seq, d)


def test_an_exported_masked_fill_block_fuses_one_attention_per_layer():
    torch = pytest.importorskip("torch")
    # TVM's torch frontend imports torch, which is optional
    from tvm.relax.frontend.torch import from_exported_program

    model, x = gpt2_style()
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=True)
        want = model(x).numpy()
    mod, params = relax.frontend.detach_params(mod)
    mod = for_inference(mod, params["main"], fp16_io=True)
    relax.analysis.well_formed(mod)
    calls = attention_calls(prepare(H100)(mod))
    assert len(calls) == 2 and all(c["causal"] and c["scale"] == pytest.approx(0.125) for c in calls), calls
    fused = fused_attention(H100)(mod)
    assert len(attention_calls(fused)) == 2
    x16 = x.numpy().astype("float16")
    unfused = run(mod, x16)
    np.testing.assert_allclose(run(fused, x16), unfused, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(unfused, want, atol=2e-2, rtol=2e-2)
