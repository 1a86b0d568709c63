"""The attention PrimFunc in each input layout computes softmax(scale Q Kᵀ [causal]) V (its
naive TIR, built for the CPU, against numpy), and its verification's magnitude run takes only
V's values as absolute (Q and K must give the function's own weights)."""

import numpy as np
import pytest
import tvm

from fastdlight.analysis.attention import LAYOUTS, AttentionShape, attention_func, match_attention
from fastdlight.measure.verify import magnitude_inputs


def reference(q, k, v, shape):
    """float64 attention of Q [B, H, TQ, D] and K, V [B, G, TKV, D]."""
    k, v = (np.repeat(x.astype(np.float64), shape.group, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * shape.scale
    if shape.causal:
        keep = np.arange(shape.seq_kv)[None, :] <= np.arange(shape.seq_q)[:, None] + shape.offset
        s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v


def inputs_of(shape, q, k, v):
    """Q, K, V ([B, heads, T, D]) as the function of ``shape.layout`` takes them."""
    if shape.layout == "packed":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        return [np.ascontiguousarray(np.concatenate([q, k, v], axis=2))]
    return [x if layout == "bhtd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3))
            for x, layout in zip((q, k, v), shape.operand_layouts)]


@pytest.mark.parametrize("layout", [*LAYOUTS, "bhtd,bhtd,bthd", "bthd,bhtd,bhtd"])
def test_every_layout_computes_attention(layout):
    shape = AttentionShape(2, 4, 24, 24, 16, 2, causal=True, layout=layout)
    func = attention_func(shape)
    assert match_attention(func) == shape
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 24, 16)).astype("float32")
    k, v = (rng.standard_normal((2, 2, 24, 16)).astype("float32") for _ in range(2))
    shape32 = AttentionShape(2, 4, 24, 24, 16, 2, causal=True, layout=layout, dtype="float32")
    lib = tvm.compile(tvm.IRModule({"main": attention_func(shape32)}), target="llvm")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in inputs_of(shape32, q, k, v)]
    out = tvm.runtime.empty(shape32.out_shape, "float32", dev)
    lib["main"](*args, out)
    np.testing.assert_allclose(out.numpy(), reference(q, k, v, shape32), rtol=1e-4, atol=1e-5)


def test_the_magnitude_run_takes_only_v_as_absolute():
    shape = AttentionShape(1, 4, 8, 8, 16, 2, layout="packed")
    qkv = -np.ones((1, 8, 8, 16), "float16")
    (mag,) = magnitude_inputs([qkv], attention_func(shape))
    first, last = shape.value_heads
    assert (mag[:, :, first:last] == 1).all() and (mag[:, :, :first] == -1).all()
    separate = attention_func(AttentionShape(1, 4, 8, 8, 16, 2))
    q, k, v = (-np.ones(s, "float16") for s in AttentionShape(1, 4, 8, 8, 16, 2).input_shapes)
    mq, mk, mv = magnitude_inputs([q, k, v], separate)
    assert (mq == -1).all() and (mk == -1).all() and (mv == 1).all()


def test_a_packed_tensor_needs_one_sequence_length():
    with pytest.raises(ValueError, match="seq_q must equal seq_kv"):
        AttentionShape(1, 4, 8, 16, 16, 2, layout="packed")
    for bad in ("tbhd", "bhtd,bthd", "bhtd,bhtd,packed"):
        with pytest.raises(ValueError, match="unknown attention layout"):
            AttentionShape(1, 4, 8, 8, 16, 2, layout=bad)
