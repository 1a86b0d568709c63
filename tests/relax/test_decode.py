"""Decode steps' projections (CPU): read their bound weights [N, K], as GEMVs, with the same values."""

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.policies.select import candidate_sets
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.decode import DECODE_ROWS, decode_weight_layout
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.schedules import dispatch_config

H100 = CUDA("nvidia/nvidia-h100")


def mlp(rows: int, d: int = 256, hidden: int = 688):
    """A GELU MLP as torch.export gives it: ``x @ W.T`` with torch's [N, K] weights passed in."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, d), "float32"))
    w1 = relax.Var("w1", relax.TensorType((hidden, d), "float32"))
    w2 = relax.Var("w2", relax.TensorType((d, hidden), "float32"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.gelu(relax.op.matmul(x, relax.op.permute_dims(w1))))
            out = bb.emit_output(relax.op.matmul(h, relax.op.permute_dims(w2)))
        bb.emit_func_output(out)
    return bb.get()


def weights(d: int = 256, hidden: int = 688):
    rng = np.random.default_rng(0)
    return [rng.uniform(-0.1, 0.1, (hidden, d)).astype("float32"), rng.uniform(-0.1, 0.1, (d, hidden)).astype("float32")]


def run_cpu(mod, args):
    out = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


@pytest.mark.parametrize("rows", [1, DECODE_ROWS])
def test_a_decode_steps_projections_become_gemvs_over_nk_weights(rows):
    mod = for_inference(mlp(rows), [tvm.runtime.tensor(w) for w in weights()], fp16=True)
    kinds = [analyze(f).kind for f in prim_funcs(prepare(H100.target)(mod)).values()]
    assert kinds.count("gemv") == 2, kinds
    x = np.random.default_rng(1).uniform(-1, 1, (rows, 256)).astype("float32")
    np.testing.assert_allclose(run_cpu(decode_weight_layout()(mod), [x]), run_cpu(mod, [x]), rtol=1e-3, atol=1e-3)


def test_a_prefill_keeps_its_matmuls():
    mod = for_inference(mlp(DECODE_ROWS + 1), [tvm.runtime.tensor(w) for w in weights()], fp16=True)
    kinds = [analyze(f).kind for f in prim_funcs(prepare(H100.target)(mod)).values()]
    assert "gemv" not in kinds and kinds.count("matmul") == 2, kinds


def decode_layer(d: int = 256, heads: int = 4, head_dim: int = 64, ffn: int = 512):
    """One token through a LLaMA-style layer, as ``torch.export`` writes it (the RMSNorms
    decomposed, weights ``[N, K]`` passed in, the rotary's halves swapped by concatenation);
    attention left out: a decode step's other functions."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, d), "float32"))
    cos = relax.Var("cos", relax.TensorType((1, 1, head_dim), "float32"))
    sin = relax.Var("sin", relax.TensorType((1, 1, head_dim), "float32"))
    shapes = {"n1": (d,), "n2": (d,), "qkv": (3 * heads * head_dim, d), "o": (d, heads * head_dim),
              "gate_up": (2 * ffn, d), "down": (d, ffn)}
    w = {k: relax.Var(k, relax.TensorType(s, "float32")) for k, s in shapes.items()}
    op = relax.op

    def norm(v, weight):
        mean = op.mean(op.power(v, relax.const(2.0)), axis=[-1], keepdims=True)
        return op.multiply(op.multiply(v, op.rsqrt(op.add(mean, relax.const(1e-5)))), weight)

    def linear(v, weight):
        return op.matmul(v, op.permute_dims(weight))

    with bb.function("main", [x, cos, sin, *w.values()]):
        with bb.dataflow():
            qkv = bb.emit(linear(norm(x, w["n1"]), w["qkv"]))
            q = op.reshape(op.split(qkv, 3, axis=-1)[0], (1, 1, heads, head_dim))
            q = bb.emit(op.permute_dims(q, [0, 2, 1, 3]))
            halves = bb.emit(op.split(q, 2, axis=-1))
            rotated = op.concat([op.negative(relax.TupleGetItem(halves, 1)), relax.TupleGetItem(halves, 0)], axis=-1)
            q = bb.emit(op.add(op.multiply(q, cos), op.multiply(rotated, sin)))
            attn = op.reshape(op.permute_dims(q, [0, 2, 1, 3]), (1, 1, heads * head_dim))
            h = bb.emit(op.add(x, linear(attn, w["o"])))
            both = bb.emit(op.split(linear(norm(h, w["n2"]), w["gate_up"]), 2, axis=-1))
            gate, up = relax.TupleGetItem(both, 0), relax.TupleGetItem(both, 1)
            out = bb.emit_output(op.add(h, linear(op.multiply(op.nn.silu(gate), up), w["down"])))
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    params = [tvm.runtime.tensor(rng.uniform(-0.1, 0.1, s).astype("float32")) for s in shapes.values()]
    return bb.get(), params


def test_every_function_of_a_decode_step_is_scheduled_by_its_own_template():
    """Each function's best-ranked config is scheduled by the template of its kind, not by the
    fallback, which would build, verify and lose to stock Dlight unseen (the one-row RMSNorm
    did: 44-59 us against 1.2 on an H200)."""
    mod, params = decode_layer()
    funcs = prim_funcs(prepare(H100.target)(for_inference(mod, params, fp16=True)))
    assert any("rms_norm" in name for name in funcs) and any("concatenate" in name for name in funcs), list(funcs)
    for name, func in funcs.items():
        sets = list(candidate_sets(func, H100, 4))
        top = next((c for s in sets for c in s.configs if not c.is_stock), None)
        assert top is not None, name
        with H100.target:
            dispatch_config(func, top, allow_fallback=False)
