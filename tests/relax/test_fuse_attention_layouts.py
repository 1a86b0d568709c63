"""Attention reads Q, K and V as the model holds them before splitting heads: a fused QKV
projection's output split in three is read whole (``packed``), heads split by reshape and
permute are read ``[B, T, heads, D]`` (``bthd``), and an input computed after the split keeps
``bhtd``; no copy kernel is left for them and the values stay the same (CPU)."""

import math
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import fastdlight
from fastdlight.compiler.compile import cuda_source
from fastdlight.relax.fuse_attention import fused_attention
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.relax import prepare
from test_fuse_attention import attention_calls, causal_keep, inputs, reference, run, tensor

H100 = "nvidia/nvidia-h100"
B, T, D = 1, 16, 64


def split_heads(bb, x, heads):
    """``[B, T, heads * D]`` -> ``[B, heads, T, D]`` as torch writes it: view, then transpose."""
    return bb.emit(relax.op.permute_dims(relax.op.reshape(x, (B, T, heads, D)), [0, 2, 1, 3]))


def attend(bb, q, k, v, heads):
    """Causal attention of ``[B, heads, T, D]`` tensors, scaled, masked with a constant."""
    keep = causal_keep(T, T)
    product = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]), "float32"))
    scores = bb.emit(relax.op.multiply(product, relax.const(1 / math.sqrt(D), "float32")))
    scores = bb.emit(relax.op.where(relax.const(keep), scores, relax.const(-np.inf, "float32")))
    probs = bb.emit(relax.op.astype(relax.op.nn.softmax(scores, axis=-1), "float16"))
    return bb.emit(relax.op.astype(relax.op.matmul(probs, v, "float32"), "float16"))


def model(form: str, heads: int = 2, kv_heads: int = 2) -> tvm.IRModule:
    """``form``: "packed" (Q, K, V split from one [B, T, (H + 2G) D] tensor), "separate"
    (three [B, T, heads D] tensors), "rotated_qk" (separate, Q and K computed after the
    split, as a rotary embedding computes them)."""
    bb = relax.BlockBuilder()
    widths = (heads * D, kv_heads * D, kv_heads * D)
    if form == "packed":
        params = [tensor("qkv", (B, T, sum(widths)))]
    else:
        params = [tensor(n, (B, T, w)) for n, w in zip("qkv", widths)]
    with bb.function("main", params):
        with bb.dataflow():
            if form == "packed":
                parts = bb.emit(relax.op.split(params[0], [widths[0], widths[0] + widths[1]], axis=-1))
                xs = [bb.emit(relax.TupleGetItem(parts, i)) for i in range(3)]
            else:
                xs = params
            q, k, v = (split_heads(bb, x, h) for x, h in zip(xs, (heads, kv_heads, kv_heads)))
            if form == "rotated_qk":
                q, k = (bb.emit(relax.op.negative(relax.op.negative(t))) for t in (q, k))
            out = bb.emit_output(attend(bb, q, k, v, heads))
        bb.emit_func_output(out)
    return bb.get()


def heads_of(x, heads):
    return x.reshape(B, T, heads, D).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("form, layout", [("packed", "packed"), ("separate", "bthd"),
                                          ("rotated_qk", "bhtd,bhtd,bthd")])
def test_the_heads_are_read_unsplit(form, layout):
    mod = model(form)
    fused = fused_attention(H100)(mod)
    (attr,) = attention_calls(fused)
    assert attr["layout"] == layout and attr["causal"]
    funcs = prim_funcs(prepare(H100)(mod))
    # reshapes run as views of their input: no kernel
    copies = [n for n, f in funcs.items() if n != "attention" and not relax.analysis.has_reshape_pattern(f)]
    assert (copies == []) == (form != "rotated_qk"), copies  # the rotated Q and K: their multiply
    args = inputs(*[(B, T, int(p.ty.shape[-1])) for p in mod["main"].params])
    want = run(mod, *args)
    np.testing.assert_allclose(run(fused, *args), want, atol=2e-3, rtol=1e-2)
    flat = np.concatenate(args, axis=-1) if form != "packed" else args[0]
    q, k, v = (heads_of(flat[..., i * 2 * D:(i + 1) * 2 * D], 2) for i in range(3))
    np.testing.assert_allclose(want, reference(q, k, v, causal_keep(T, T)), atol=2e-3, rtol=1e-2)


def test_a_split_in_other_parts_is_read_as_split_heads():
    """Q, K and V from a split whose sections are not Q's, K's and V's heads in order stay
    three tensors (each read [B, T, heads, D])."""
    bb = relax.BlockBuilder()
    x = tensor("x", (B, T, 6 * D))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, 3, axis=-1))
            q, v, k = (split_heads(bb, bb.emit(relax.TupleGetItem(parts, i)), 2) for i in range(3))
            out = bb.emit_output(attend(bb, q, k, v, 2))
        bb.emit_func_output(out)
    (attr,) = attention_calls(fused_attention(H100)(bb.get()))
    assert attr["layout"] == "bthd"


def test_attention_on_a_packed_input_builds():
    """The kernel reads one tensor, so TVM's reshape rewrite asks whether it is a reshape; a
    TIRx kernel has no root block, which that question required (the build failed)."""
    bb = relax.BlockBuilder()
    qkv = tensor("qkv", (B, T, 6 * D))
    with bb.function("main", [qkv]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(qkv, [2 * D, 4 * D], axis=-1))
            q, k, v = (split_heads(bb, bb.emit(relax.TupleGetItem(parts, i)), 2) for i in range(3))
            out = attend(bb, q, k, v, 2)  # a value inside the dataflow block, as in a model
            out = bb.emit_output(relax.op.negative(out))
        bb.emit_func_output(out)
    prepared = prepare(H100)(bb.get())
    tuning = fastdlight.ApplyFastTuning(topk=1, target=H100, measure=False, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(prepared)
    assert {e.function: e.status for e in tuning.report}.get("attention") == "tuned"
    src = cuda_source(fastdlight.build(tuned, H100))
    assert "attention_kernel" in src and "wgmma" in src
