"""Decode attention with a symbolic cache length as the split-KV pair (CPU): the form a decode
step's export and ``for_inference`` leave (the cache and the new token joined by a concat, GQA
rows, ToMixedPrecision's casts) becomes one chunk step and one merge, the caches read where
they lie; the values agree with the unfused graph on LLVM at several lengths, chunks left empty
included; attention whose scores something else reads is left alone."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from fastdlight.analysis.decode_attention import COMBINE_ATTR, SPLIT_ATTR, TICKETS, default_splits, match_decode_split
from fastdlight.measure.inputs import known_input_values
from fastdlight.relax import prepare
from fastdlight.relax.decode_attention import decode_attention

B, G, R, D = 1, 2, 4, 32


def decode_module(appended: bool = True, scores_out: bool = False, rows: int = R,
                  dtype: str = "float16", kv_heads: int = G) -> tvm.IRModule:
    """``softmax(q Kᵀ * scale) V`` over ``concat(cache, new)`` (or the cache alone), as
    ``for_inference`` leaves a decode step's attention; ``rows`` query rows a K/V head."""
    G = kv_heads  # noqa: N806 - the module's name for it
    n = tirx.Var("n", "int64")
    q = relax.Var("q", relax.TensorType((B, G, rows, D), dtype))
    kc, vc = (relax.Var(x, relax.TensorType((B, G, n, D), dtype)) for x in ("k_cache", "v_cache"))
    kn, vn = (relax.Var(x, relax.TensorType((B, G, 1, D), dtype)) for x in ("k_new", "v_new"))
    keys = n + 1 if appended else n
    bb = relax.BlockBuilder()
    params = [q, kc, vc, kn, vn] if appended else [q, kc, vc]
    with bb.function("main", params):
        with bb.dataflow():
            k = bb.emit(relax.op.concat([kc, kn], axis=2)) if appended else kc
            v = bb.emit(relax.op.concat([vc, vn], axis=2)) if appended else vc
            kt = bb.emit(relax.op.reshape(relax.op.permute_dims(k, [0, 1, 3, 2]), (B * G, D, keys)))
            q3 = bb.emit(relax.op.reshape(q, (B * G, rows, D)))
            product = bb.emit(relax.op.matmul(q3, kt, "float32"))
            scaled = bb.emit(relax.op.multiply(relax.op.astype(product, dtype),
                                               relax.const(1 / math.sqrt(D), dtype)))
            probs = bb.emit(relax.op.nn.softmax(relax.op.astype(scaled, "float32"), axis=-1))
            out = bb.emit(relax.op.matmul(relax.op.astype(probs, dtype), relax.op.reshape(v, (B * G, keys, D)),
                                          "float32"))
            out = bb.emit(relax.op.astype(out, dtype))
            result = bb.emit_output(relax.Tuple([out, scaled]) if scores_out else out)
        bb.emit_func_output(result)
    return bb.get()


def calls(mod: tvm.IRModule) -> list[str]:
    names = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: names.append(
                e.args[0].name_hint if isinstance(e, relax.Call) and e.op.name == "relax.call_tir"
                else e.op.name if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None))
    return [n for n in names if n]


def run(mod, *arrays):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy().astype("float32")


@pytest.mark.parametrize("appended", [True, False])
def test_the_decode_form_becomes_the_split_pair_with_the_same_values(appended):
    mod = decode_module(appended)
    fused = decode_attention("nvidia/nvidia-h100")(mod)
    names = calls(fused)
    assert names.count("decode_attention") == 1 and names.count("decode_combine") == 1
    assert not {"relax.concat", "relax.nn.softmax", "relax.matmul"} & set(names)
    rng = np.random.default_rng(0)
    for n in (3, 70):  # 3: most chunks get no key
        arrays = [rng.standard_normal(s).astype("float16") for s in
                  [(B, G, R, D), (B, G, n, D), (B, G, n, D)] + [(B, G, 1, D)] * (2 * appended)]
        np.testing.assert_allclose(run(fused, *arrays), run(mod, *arrays), rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("kwargs", [{"scores_out": True}, {"rows": 136}])
def test_scores_read_elsewhere_or_too_many_rows_are_left_alone(kwargs):
    """Scores another value reads must stay; more query rows a K/V head than the split template
    takes (past 128: it holds them in blocks of 8, each block's CTA reading the chunk's keys)
    stay matmuls."""
    mod = decode_module(**kwargs)
    assert "decode_attention" not in calls(decode_attention("nvidia/nvidia-h100")(mod))


def test_bf16_becomes_the_pair_in_bf16():
    fused = decode_attention("nvidia/nvidia-h100")(decode_module(dtype="bfloat16"))
    split = next(f for gv, f in fused.functions_items() if gv.name_hint == "decode_attention")
    assert dict(split.attrs[SPLIT_ATTR])["dtype"] == "bfloat16"


def test_prepare_keeps_the_pair_whole_with_their_attributes():
    mod = prepare("nvidia/nvidia-h100")(decode_module())
    attrs = [dict(f.attrs) for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and f.attrs is not None]
    assert sum(SPLIT_ATTR in a for a in attrs) == 1 and sum(COMBINE_ATTR in a for a in attrs) == 1


@pytest.mark.parametrize("appended", [True, False])
def test_merged_in_the_step_it_is_one_call_with_zero_tickets_and_the_same_values(appended, monkeypatch):
    """``FASTDLIGHT_DECODE_MERGE=step``: the chunk step also merges (its last CTA, on a GPU);
    its ticket counters are a constant of zeros, and a tuning run's inputs hold zeros too."""
    monkeypatch.setenv("FASTDLIGHT_DECODE_MERGE", "step")
    mod = decode_module(appended)
    fused = decode_attention("nvidia/nvidia-h100")(mod)
    names = calls(fused)
    assert names.count("decode_attention") == 1 and "decode_combine" not in names
    step = next(f for gv, f in fused.functions_items() if gv.name_hint == "decode_attention")
    assert match_decode_split(step)[0].merged and known_input_values(step) == {TICKETS: 0.0}
    rng = np.random.default_rng(1)
    for n in (3, 70):
        arrays = [rng.standard_normal(s).astype("float16") for s in
                  [(B, G, R, D), (B, G, n, D), (B, G, n, D)] + [(B, G, 1, D)] * (2 * appended)]
        np.testing.assert_allclose(run(fused, *arrays), run(mod, *arrays), rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("kv_heads, rows, form, one_call", [
    (32, 1, "", True),  # 16 chunks of one row on 132 SMs: merged in the step by default
    (2, 1, "", False),  # 128 chunks: the pair
    (32, 4, "", False),  # 16 chunks of 4 rows (64 rows for the last CTA to fold): the pair
    (64, 2, "", True),  # 8 chunks of 2 rows
    (32, 1, "kernel", False),
    (32, 4, "step", True),
])  # fmt: skip
def test_the_merge_form_follows_the_rows_the_last_cta_folds_unless_asked(kv_heads, rows, form, one_call, monkeypatch):
    monkeypatch.setenv("FASTDLIGHT_DECODE_MERGE", form)
    fused = decode_attention("nvidia/nvidia-h100")(decode_module(False, rows=rows, kv_heads=kv_heads))
    assert calls(fused).count("decode_combine") == (0 if one_call else 1)
    step = next(f for gv, f in fused.functions_items() if gv.name_hint == "decode_attention")
    shape = match_decode_split(step)[0]
    assert shape.merged == one_call and shape.splits == default_splits(B, kv_heads, 132, rows)
    assert shape.splits == {32: 16, 2: 128, 64: 8}[kv_heads]


def test_a_merge_place_it_does_not_know_is_one_line(monkeypatch):
    monkeypatch.setenv("FASTDLIGHT_DECODE_MERGE", "elsewhere")
    expected = "FASTDLIGHT_DECODE_MERGE='elsewhere': expected one of 'auto', 'kernel', 'step'"
    with pytest.raises(ValueError, match=expected):
        decode_attention("nvidia/nvidia-h100")(decode_module())


def test_an_mqa_group_of_many_rows_becomes_the_pair_too():
    """32 query heads on one K/V head (MQA): the rows go to the chunk step in blocks of 8."""
    fused = decode_attention("nvidia/nvidia-h100")(decode_module(rows=32, kv_heads=1))
    names = calls(fused)
    assert names.count("decode_attention") == 1 and not {"relax.softmax", "relax.matmul"} & set(names)
    split = next(f for gv, f in fused.functions_items() if gv.name_hint == "decode_attention")
    assert dict(split.attrs[SPLIT_ATTR])["rows"] == 32
