"""fastdlight.ops (CPU): the attention operator, its float64 reference and what it refuses.
(Every other operator is exercised by the templates' and the CLI's tests.)"""

import numpy as np
import pytest
import tvm

import fastdlight
from fastdlight import ops
from fastdlight.arch import auto_arch


def loop_attention(q, k, v, causal):
    """Attention one query row at a time, written out: the reference's independent twin."""
    b_, h_, tq, d = q.shape
    g_, tkv = k.shape[1], k.shape[2]
    out = np.zeros(q.shape)
    for b in range(b_):
        for h in range(h_):
            g = h // (h_ // g_)
            for i in range(tq):
                keys = range(min(tkv, i + tkv - tq + 1)) if causal else range(tkv)
                s = np.array([q[b, h, i].astype(np.float64) @ k[b, g, j].astype(np.float64) / np.sqrt(d) for j in keys])
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ v[b, g, : len(s)].astype(np.float64)
    return out


def inputs(b, h, g, tq, tkv, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (b, h, tq, d)).astype(dtype), rng.uniform(-1, 1, (b, g, tkv, d)).astype(dtype),
            rng.uniform(-1, 1, (b, g, tkv, d)).astype(dtype))


@pytest.mark.parametrize("b, h, g, tq, tkv, d, causal", [
    (2, 4, 4, 8, 8, 16, False), (1, 8, 2, 5, 13, 8, True), (1, 4, 1, 1, 9, 32, True), (1, 2, 2, 7, 7, 4, True),
])  # fmt: skip
def test_the_reference_is_attention_with_gqa_and_a_bottom_right_causal_mask(b, h, g, tq, tkv, d, causal):
    op = ops.attention(b, h, tq, tkv, d, kv_heads=g, causal=causal)
    q, k, v = inputs(b, h, g, tq, tkv, d, "float16")
    np.testing.assert_allclose(op.reference(q, k, v), loop_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_the_primfunc_computes_the_reference_on_the_cpu(causal):
    op = ops.attention(1, 4, 6, 10, 16, kv_heads=2, causal=causal, dtype="float32")
    q, k, v = inputs(1, 4, 2, 6, 10, 16, "float32", seed=1)
    out = tvm.runtime.empty((1, 4, 6, 16), "float32")
    tvm.compile(op.func, target="llvm")(*(tvm.runtime.tensor(a) for a in (q, k, v)), out)
    np.testing.assert_allclose(out.numpy(), op.reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_flops_count_the_pairs_the_mask_keeps():
    full = ops.attention(2, 4, 16, 16, 8)
    assert full.flops == 4 * 2 * 4 * 16 * 16 * 8
    causal = ops.attention(2, 4, 4, 10, 8, causal=True)  # query i sees keys 0 .. i + 6
    assert causal.flops == 4 * 2 * 4 * sum(i + 7 for i in range(4)) * 8
    assert full.bytes == 4 * 2 * 4 * 16 * 8 * 2


@pytest.mark.parametrize("kwargs, says", [
    ({"kv_heads": 3}, r"kv_heads \(3\) must divide heads \(8\)"),
    ({"causal": True, "seq_q": 32}, "seq_q <= seq_kv"),
    ({"dtype": "int8"}, "unsupported dtype"),
    ({"head_dim": 0}, "positive integers"),
])  # fmt: skip
def test_bad_attention_shapes_are_refused(kwargs, says):
    shape = {"batch": 1, "heads": 8, "seq_q": 16, "seq_kv": 16, "head_dim": 64}
    shape.update({k: v for k, v in kwargs.items() if k in shape})
    rest = {k: v for k, v in kwargs.items() if k not in shape}
    with pytest.raises(ValueError, match=says):
        ops.attention(**shape, **rest)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_tunes_to_a_verified_kernel(causal):
    op = ops.attention(2, 8, 100, 100, 64, kv_heads=2, causal=causal)
    _, best = fastdlight.tune(op.func, auto_arch(), topk=8, ref=op.reference)
    assert best.verified and best.latency_ms > 0
