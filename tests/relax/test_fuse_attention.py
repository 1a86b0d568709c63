"""Attention's forms as one call of the attention PrimFunc (CPU): the forms built as the export
and ``for_inference`` leave them, their values checked against numpy on LLVM; where nothing
fuses; the function kept whole, with its attribute, through ``prepare``. With torch: the zoo's
real exports."""

import math
import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.analysis.attention import ATTR, match_attention
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.fuse_attention import fused_attention
from fastdlight.relax.pipeline import prim_funcs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100, A100, T4 = "nvidia/nvidia-h100", "nvidia/nvidia-a100", "nvidia/nvidia-t4"
S, D = 16, 64


def tensor(name: str, shape, dtype: str = "float16") -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, dtype))


def causal_keep(tq: int, tkv: int) -> np.ndarray:
    return np.tril(np.ones((tq, tkv), bool), tkv - tq)


def additive(keep: np.ndarray, masked: float = -np.inf) -> np.ndarray:
    return np.where(keep, 0.0, masked).astype("float32")[None, None]


def repeat_kv(bb: relax.BlockBuilder, x, heads: int):
    """Hugging Face's ``repeat_kv``: ``[B, G, T, D]`` as ``[B, heads, T, D]``."""
    b, g, t, d = (int(v) for v in x.ty.shape)
    if g == heads:
        return x
    wide = bb.emit(relax.op.broadcast_to(relax.op.expand_dims(x, [2]), (b, g, heads // g, t, d)))
    return bb.emit(relax.op.reshape(wide, (b, heads, t, d)))


def guarded(bb: relax.BlockBuilder, scores, probs):
    """SDPA's guard: ``where(all(scores == -inf), 0, probs)``."""
    live = relax.op.logical_not(relax.op.equal(scores, relax.const(-np.inf, "float32")))
    dead = relax.op.logical_not(relax.op.astype(relax.op.max(relax.op.astype(live, "int8"), axis=[-1], keepdims=True),
                                                "bool"))
    return bb.emit(relax.op.where(dead, relax.op.full_like(probs, relax.const(0.0, "float32")), probs))


def emit_sdpa(bb: relax.BlockBuilder, q, k, v, mask: np.ndarray | None = None, guard: bool = False):
    """SDPA as ``torch.export`` and ``for_inference`` leave it: Q and Kᵀ each scaled by
    ``sqrt(scale)`` in fp16, 3-D matmuls, fp32 scores (a constant mask added) and softmax,
    casts around them; K and V repeated over the heads (GQA). Returns (output, scores)."""
    _, heads, tq, d = (int(x) for x in q.ty.shape)
    tkv = int(k.ty.shape[2])
    half = relax.const(math.sqrt(1 / math.sqrt(d)), "float16")
    k, v = repeat_kv(bb, k, heads), repeat_kv(bb, v, heads)
    q3 = bb.emit(relax.op.reshape(relax.op.multiply(q, half), (heads, tq, d)))
    kt = bb.emit(relax.op.multiply(relax.op.permute_dims(k, [0, 1, 3, 2]), half))
    product = bb.emit(relax.op.matmul(q3, bb.emit(relax.op.reshape(kt, (heads, d, tkv))), "float32"))
    scores = bb.emit(relax.op.astype(relax.op.astype(product, "float16"), "float32"))
    if mask is not None:
        scores = bb.emit(relax.op.add(scores, relax.op.reshape(relax.const(mask), (tq, tkv))))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if guard:
        probs = guarded(bb, scores, probs)
    out = bb.emit(relax.op.matmul(relax.op.astype(probs, "float16"), relax.op.reshape(v, (heads, tkv, d)), "float32"))
    return bb.emit(relax.op.reshape(relax.op.astype(out, "float16"), (1, heads, tq, d))), scores


def sdpa(heads: int = 2, kv_heads: int = 2, tq: int = S, tkv: int = S, mask: np.ndarray | None = None,
         guard: bool = False, scores_out: bool = False, d: int = D) -> tvm.IRModule:
    """:func:`emit_sdpa` as a module of Q, K and V (``scores_out``: the scores a result too)."""
    bb = relax.BlockBuilder()
    q, k, v = tensor("q", (1, heads, tq, d)), tensor("k", (1, kv_heads, tkv, d)), tensor("v", (1, kv_heads, tkv, d))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out, scores = emit_sdpa(bb, q, k, v, mask, guard)
            result = bb.emit_output(relax.Tuple([out, scores]) if scores_out else out)
        bb.emit_func_output(result)
    return bb.get()


def hand_written(inverted: bool = False) -> tvm.IRModule:
    """``softmax(masked_fill(q @ k.transpose(-1, -2) / sqrt(D), ~tril, -inf)) @ v`` in fp16, as
    ``ToMixedPrecision`` casts it: ``where`` on the bool ``tril`` (``inverted``: on ``~tril``)."""
    bb = relax.BlockBuilder()
    q, k, v = (tensor(n, (1, 2, S, D)) for n in "qkv")
    keep = causal_keep(S, S)
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            product = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]), "float32"))
            scores = bb.emit(relax.op.divide(relax.op.astype(relax.op.astype(product, "float16"), "float32"),
                                             relax.const(math.sqrt(D), "float32")))
            ninf = relax.const(-np.inf, "float32")
            where = relax.op.where(relax.const(~keep), ninf, scores) if inverted else \
                relax.op.where(relax.const(keep), scores, ninf)
            probs = bb.emit(relax.op.astype(relax.op.nn.softmax(bb.emit(where), axis=-1), "float16"))
            out = bb.emit_output(relax.op.astype(relax.op.matmul(probs, v, "float32"), "float16"))
        bb.emit_func_output(out)
    return bb.get()


def nn_attention(causal_mask: str | None = "BottomRight", tq: int = S, tkv: int = S) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    q, k, v = tensor("q", (1, tq, 2, D)), tensor("k", (1, tkv, 2, D)), tensor("v", (1, tkv, 2, D))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(q, k, v, causal_mask=causal_mask))
        bb.emit_func_output(out)
    return bb.get()


def runtime_mask() -> tvm.IRModule:
    """BERT given its ``attention_mask``: the additive mask an input of the model."""
    bb = relax.BlockBuilder()
    q, k, v, m = tensor("q", (2, S, D)), tensor("k", (2, D, S)), tensor("v", (2, S, D)), tensor("m", (1, S, S), "float32")
    with bb.function("main", [q, k, v, m]):
        with bb.dataflow():
            scores = bb.emit(relax.op.add(relax.op.matmul(q, k, "float32"), m))
            probs = bb.emit(relax.op.astype(relax.op.nn.softmax(scores, axis=-1), "float16"))
            out = bb.emit_output(relax.op.astype(relax.op.matmul(probs, v, "float32"), "float16"))
        bb.emit_func_output(out)
    return bb.get()


def attention_calls(mod: tvm.IRModule) -> list[dict]:
    """The attribute of each PrimFunc ``main`` calls that carries one."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            func = mod[expr.args[0]]
            if func.attrs is not None and ATTR in func.attrs:
                found.append(dict(func.attrs[ATTR]))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def op_names(mod: tvm.IRModule) -> set[str]:
    names = set()
    relax.analysis.post_order_visit(mod["main"], lambda e: names.add(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return names


def reference(q, k, v, keep: np.ndarray | None, scale: float | None = None) -> np.ndarray:
    """Attention in fp32 numpy, Q ``[B, H, TQ, D]``, K and V ``[B, G, TKV, D]``."""
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(x.astype("float32"), group, axis=1) for x in (k, v))
    scores = q.astype("float32") @ k.transpose(0, 1, 3, 2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if keep is not None:
        scores = np.where(keep, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)) @ v


def run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    """``mod``'s result on the CPU (the first, where an exported graph returns a tuple)."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in args))
    return (out if hasattr(out, "numpy") else out[0]).numpy().astype("float32")


def inputs(*shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype("float16") for s in shapes]


@pytest.mark.parametrize("heads, kv_heads, tq, mask, guard, causal", [
    (2, 2, S, additive(causal_keep(S, S)), False, True),  # GPT-2, LLaMA: the causal mask computed
    (4, 2, S, additive(causal_keep(S, S), np.finfo("float32").min), False, True),  # GQA, HF's finfo.min
    (2, 1, 8, additive(causal_keep(8, S), -1e4), False, True),  # MQA, fewer queries, bottom right
    (2, 2, S, additive(np.ones((S, S), bool)), False, False),  # BERT without a mask: zeros
    (2, 2, S, None, True, False),  # ViT: no mask, SDPA's guard kept
])
def test_sdpa_as_one_attention_call_with_the_same_values(heads, kv_heads, tq, mask, guard, causal):
    mod = sdpa(heads, kv_heads, tq, S, mask, guard)
    fused = fused_attention(H100)(mod)
    (attr,) = attention_calls(fused)
    assert attr["heads"] == heads and attr["kv_heads"] == kv_heads and attr["causal"] == causal
    assert attr["scale"] == pytest.approx(1 / math.sqrt(D))
    assert not {"relax.nn.softmax", "relax.matmul", "relax.where"} & op_names(fused)
    q, k, v = inputs((1, heads, tq, D), (1, kv_heads, S, D), (1, kv_heads, S, D))
    want = reference(q, k, v, causal_keep(tq, S) if causal else None)
    np.testing.assert_allclose(run(fused, q, k, v), want, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("heads, kv_heads, tq, mask", [
    (4, 2, 1, additive(causal_keep(1, S))),  # a decode step's one query: causal keeps every key
    (8, 2, 2, None),  # two queries of a 4-head group: 8 rows a K/V head
])
def test_decode_sized_attention_becomes_the_split_kv_pair(heads, kv_heads, tq, mask):
    fused = fused_attention(H100)(sdpa(heads, kv_heads, tq, S, mask))
    assert not attention_calls(fused)
    calls = set()
    relax.analysis.post_order_visit(fused["main"], lambda e: calls.add(e.args[0].name_hint) if isinstance(
        e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir" else None)
    assert calls == {"decode_attention", "decode_combine"}
    assert not {"relax.nn.softmax", "relax.matmul"} & op_names(fused)
    q, k, v = inputs((1, heads, tq, D), (1, kv_heads, S, D), (1, kv_heads, S, D))
    np.testing.assert_allclose(run(fused, q, k, v), reference(q, k, v, None), atol=2e-3, rtol=1e-2)
    # the heads' flattening reshapes around the replaced matmuls: no chain of them left as a copy kernel
    prepared = prim_funcs(prepare(H100)(sdpa(heads, kv_heads, tq, S, mask)))
    assert not [name for name in prepared if name.startswith("fused_reshape")], list(prepared)


def test_the_unfused_form_computes_the_reference():
    q, k, v = inputs((1, 4, S, D), (1, 2, S, D), (1, 2, S, D))
    got = run(sdpa(4, 2, mask=additive(causal_keep(S, S))), q, k, v)
    np.testing.assert_allclose(got, reference(q, k, v, causal_keep(S, S)), atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("inverted", [False, True])
def test_a_hand_written_masked_fill_fuses_causal(inverted):
    fused = fused_attention(H100)(hand_written(inverted))
    (attr,) = attention_calls(fused)
    assert attr["causal"] and attr["scale"] == pytest.approx(1 / math.sqrt(D))
    q, k, v = inputs((1, 2, S, D), (1, 2, S, D), (1, 2, S, D))
    np.testing.assert_allclose(run(fused, q, k, v), reference(q, k, v, causal_keep(S, S)), atol=2e-3, rtol=1e-2)


def test_nn_attention_is_permuted_around_the_call():
    fused = fused_attention(H100)(nn_attention("BottomRight", tq=8))
    (attr,) = attention_calls(fused)
    assert attr["causal"] and attr["seq_q"] == 8 and "relax.nn.attention" not in op_names(fused)
    q, k, v = inputs((1, 8, 2, D), (1, S, 2, D), (1, S, 2, D))
    heads_first = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]
    want = reference(*heads_first, causal_keep(8, S)).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(run(fused, q, k, v), want, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("mod", [
    pytest.param(lambda: sdpa(mask=additive(np.random.default_rng(0).random((S, S)) > 0.5)), id="a mask of data"),
    pytest.param(lambda: sdpa(tq=8, mask=additive(np.tril(np.ones((8, S), bool)))), id="top-left, TQ < TKV"),
    pytest.param(lambda: sdpa(mask=additive(causal_keep(S, S)) + 0.5), id="a bias, not a mask"),
    pytest.param(lambda: sdpa(mask=additive(causal_keep(S, S)), scores_out=True), id="scores read elsewhere"),
    pytest.param(lambda: sdpa(mask=additive(causal_keep(S, S)), d=20), id="a head dim no template takes"),
    pytest.param(lambda: nn_attention("TopLeft", tq=8), id="nn.attention top-left, TQ < TKV"),
    pytest.param(runtime_mask, id="a mask from an input"),
])
def test_what_the_template_does_not_take_stays_as_it_is(mod):
    mod = mod()
    assert fused_attention(H100)(mod).same_as(mod)


def test_an_sm80_target_fuses_and_an_sm75_one_leaves_the_graph_unchanged():
    """sm_80 has the mma.sync template; sm_75 no fused template at all."""
    for mod in (sdpa(mask=additive(causal_keep(S, S))), hand_written(), nn_attention()):
        assert len(attention_calls(prepare(A100)(mod))) == 1
        assert fused_attention(T4)(mod).same_as(mod)
        assert not any(match_attention(f) for f in prepare(T4)(mod).functions.values()
                       if isinstance(f, tvm.tirx.PrimFunc))


def test_prepare_keeps_the_attention_function_whole_with_its_attribute():
    prepared = prepare(H100)(sdpa(4, 2, mask=additive(causal_keep(S, S))))
    prim = {gv.name_hint: f for gv, f in prepared.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    matched = {name: match_attention(f) for name, f in prim.items() if match_attention(f) is not None}
    assert list(matched) == ["attention"] and matched["attention"].kv_heads == 2
    assert int(prim["attention"].attrs["op_pattern"]) == 8
    assert len(attention_calls(prepared)) == 1 and not any("softmax" in name for name in prim)


def test_one_function_per_shape_each_its_own_symbol():
    bb = relax.BlockBuilder()
    q, k, v, q8 = tensor("q", (1, 2, S, D)), tensor("k", (1, 2, S, D)), tensor("v", (1, 2, S, D)), tensor("q8", (1, 2, 8, D))
    with bb.function("main", [q, k, v, q8]):
        with bb.dataflow():
            first, _ = emit_sdpa(bb, q, k, v, additive(causal_keep(S, S)))
            second, _ = emit_sdpa(bb, first, k, v, additive(causal_keep(S, S)))
            third, _ = emit_sdpa(bb, q8, k, v, additive(causal_keep(8, S)))
            out = bb.emit_output(relax.Tuple([second, third]))
        bb.emit_func_output(out)
    fused = fused_attention(H100)(bb.get())
    names = sorted(gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
                   and match_attention(f) is not None)
    assert names == ["attention", "attention1"] and len(attention_calls(fused)) == 3
    assert all(str(fused[n].attrs["global_symbol"]) == n for n in names)


# ---- the zoo's real exports (torch) --------------------------------------------------------

def zoo_prepared(name: str, model=None) -> tvm.IRModule:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    # benchmarks/ is on sys.path only from here (and zoo_models needs torch)
    import zoo_models

    mod, params = zoo_models.to_relax(zoo_models.export(name, model=model))
    return prepare(H100)(for_inference(mod, params, fp16_io=True))


def llama_like(name: str):
    """``name``'s model with heads of 64 (the zoo's have 32): 4 query heads reading 2 K/V
    heads."""
    # transformers is optional; the callers put benchmarks/ on sys.path
    import transformers
    import zoo_models

    config = {**zoo_models._SMALL_LM, "num_attention_heads": 4}
    family = {"llama_gqa_2l": "Llama", "qwen2_gqa_2l": "Qwen2", "mistral_gqa_2l": "Mistral"}[name]
    if family == "Mistral":
        config["sliding_window"] = None
    cfg = getattr(transformers, f"{family}Config")(**config)
    return zoo_models._last_hidden_state(getattr(transformers, f"{family}Model")(cfg))


def assert_one_attention_per_layer(prepared: tvm.IRModule, layers: int, **expected):
    calls = attention_calls(prepared)
    assert len(calls) == layers and all(all(c[k] == v for k, v in expected.items()) for c in calls), calls
    prim = [gv.name_hint for gv, f in prepared.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert not any("softmax" in name for name in prim), prim


@pytest.mark.parametrize("name, causal", [("gpt2_2l", True), ("bert_base_2l", False)])
def test_zoo_attention_fuses_one_function_per_layer(name, causal):
    assert_one_attention_per_layer(zoo_prepared(name), 2, causal=causal, kv_heads=12)


@pytest.mark.parametrize("name", ["llama_gqa_2l", "qwen2_gqa_2l", "mistral_gqa_2l"])
def test_zoo_gqa_attention_reads_the_kv_heads_unrepeated(name):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    assert_one_attention_per_layer(zoo_prepared(name, llama_like(name)), 2, causal=True, heads=4, kv_heads=2)


def hand_written_block(form: str, d: int = 128, heads: int = 2, seq: int = 32):
    """A GPT-2 style attention block: ``scaled_dot_product_attention`` (``is_causal`` or no mask),
    or :mod:`torch_models`' matmul + softmax + matmul with its additive causal mask."""
    # torch is optional (the callers skip without it)
    import torch
    import torch.nn.functional as F
    import torch_models

    if form.startswith("matmul"):
        return torch_models.Attention(d, heads, form == "matmul_causal", seq).eval()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=form == "sdpa_causal")
            return self.o(y.transpose(1, 2).reshape(b, s, d))

    return Block().eval()


@pytest.mark.parametrize("form", ["sdpa_causal", "sdpa", "matmul_causal", "matmul"])
def test_hand_written_blocks_fuse_with_torch_s_values(form):
    torch = pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    # TVM's torch frontend imports torch, which is optional
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    model, x = hand_written_block(form), torch.randn(1, 32, 128)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=True)
        want = model(x).numpy()
    mod, params = relax.frontend.detach_params(mod)
    fused = fused_attention(H100)(for_inference(mod, params["main"], fp16_io=True))
    (attr,) = attention_calls(fused)
    assert attr["causal"] == form.endswith("causal") and attr["scale"] == pytest.approx(0.125)
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy().astype("float16")))[0].numpy().astype("float32")
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-2)
