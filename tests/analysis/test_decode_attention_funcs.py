"""Split-KV decode attention's PrimFuncs (CPU): the chunk step's TIR against the numpy
reference (caches with and without the appended token, chunks left empty by a short cache), the
merge giving attention over every key, and the attribute that marks the step."""

import numpy as np
import pytest
import tvm
from tvm import tirx

from fastdlight import ops
from fastdlight.analysis.decode_attention import (
    EMPTY_MAX,
    TICKETS,
    DecodeAttentionShape,
    decode_combine_func,
    decode_of,
    decode_split_func,
    default_splits,
    match_decode_split,
)
from fastdlight.measure.inputs import known_input_values


def run(func, *arrays, outs, dtype="float32"):
    """``func`` on LLVM; ``outs`` the outputs' shapes (in ``dtype``) or ``(shape, dtype)`` pairs."""
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    dev = tvm.cpu()
    outs = [o if isinstance(o[-1], str) else (o, dtype) for o in outs]
    args = [tvm.runtime.tensor(a, dev) for a in arrays] + [tvm.runtime.tensor(np.zeros(s, dt), dev)
                                                          for s, dt in outs]
    lib["main"](*args)
    return [a.numpy() for a in args[len(arrays):]]


def attention(q, k, v, scale):
    sc = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) * scale
    e = np.exp(sc - sc.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v.astype(np.float64)


@pytest.mark.parametrize("seq_kv, splits, appended", [(37, 4, True), (37, 4, False), (3, 8, True)])
def test_the_chunk_step_and_the_merge_compute_attention(seq_kv, splits, appended):
    op = ops.decode_attention(2, 2, 3, seq_kv, 32, splits=splits, appended=appended)
    shape = match_decode_split(op.func)[0]
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal([int(x) for x in p.shape]).astype("float16") for p in op.func.params[:-3]]
    o, m, l = run(op.func, *ins, outs=shape.partial_shapes)
    ref = op.reference(*(a.astype(np.float64) for a in ins))
    for got, want in zip((o, m, l), ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if seq_kv + appended < splits:
        assert (m == np.float32(EMPTY_MAX)).any()  # a chunk without keys keeps the floor
    (out,) = run(decode_combine_func(shape), o, m, l, outs=[shape.out_shape], dtype="float16")
    k, v = ins[1], ins[2]
    if appended:
        k, v = np.concatenate([k, ins[3]], axis=2), np.concatenate([v, ins[4]], axis=2)
    np.testing.assert_allclose(out, attention(ins[0], k, v, shape.scale), rtol=2e-3, atol=2e-3)


def test_the_attribute_marks_the_step_static_or_symbolic():
    shape = DecodeAttentionShape(1, 8, 4, 128, 33)
    assert match_decode_split(decode_split_func(shape, 512)) == (shape, 512)
    length = tirx.Var("n", "int64")
    found = match_decode_split(decode_split_func(shape, length))
    assert found[0] == shape and found[1].same_as(length)
    other = decode_split_func(DecodeAttentionShape(1, 8, 2, 128, 33), 512)
    assert match_decode_split(other.with_attr("fastdlight.decode_attention", {**dict(
        decode_split_func(shape, 512).attrs["fastdlight.decode_attention"])})) is None  # its buffers disagree
    assert match_decode_split(decode_combine_func(shape)) is None


def test_bad_shapes_are_refused_and_splits_fill_the_sms():
    with pytest.raises(ValueError, match="positive integers"):
        DecodeAttentionShape(1, 8, 0, 128, 4)
    with pytest.raises(ValueError, match="dtype"):
        DecodeAttentionShape(1, 8, 4, 128, 4, dtype="float32")
    assert default_splits(1, 8, 132) == 66 and default_splits(1, 1, 132) == 128
    assert default_splits(16, 32, 132) == 1 and default_splits(8, 32, 132) == 2  # pairs alone two an SM: one chunk


def test_decode_sizes_get_the_split_step_and_short_prefills_do_not():
    one = decode_of(1, 8, 4, 1, 128, True, 0.0, "float16", 132)  # one token sees every key: causal or not
    assert (one.rows, one.splits, one.appended, one.merged) == (4, 66, False, False)
    assert one.scale == pytest.approx(128 ** -0.5)
    assert decode_of(1, 8, 4, 2, 128, False, 0.0, "float16", 132).rows == 8  # a few tokens, non-causal
    assert decode_of(1, 8, 4, 2, 128, True, 0.0, "float16", 132) is None  # causal tokens: a short prefill
    assert decode_of(1, 8, 4, 3, 128, False, 0.0, "float16", 132) is None  # 12 rows of several tokens
    assert decode_of(1, 1, 32, 1, 128, False, 0.0, "bfloat16", 132).rows == 32  # MQA's one token: blocks of rows
    assert decode_of(1, 1, 129, 1, 128, False, 0.0, "float16", 132) is None
    assert decode_of(1, 8, 4, 1, 100, False, 0.0, "float16", 132) is None  # no whole 16-byte loads of a key
    assert decode_of(1, 8, 4, 1, 128, False, 0.0, "float32", 132) is None


@pytest.mark.parametrize("seq_kv, page_size, splits", [(70, 16, 4), (5, 8, 8)])
def test_the_paged_step_reads_each_sequence_through_its_page_table(seq_kv, page_size, splits):
    op = ops.decode_attention(2, 2, 3, seq_kv, 32, splits=splits, page_size=page_size)
    shape, _ = match_decode_split(op.func)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal([int(x) for x in p.shape]).astype("float16") for p in op.func.params[:3])
    width, pages = int(op.func.params[3].shape[1]), int(op.func.params[1].shape[0])
    table = rng.permutation(pages)[:2 * width].reshape(2, width).astype("int32")  # pages in any order
    lengths = np.full(2, seq_kv, "int32")
    got = run(op.func, q, k, v, table, lengths, outs=shape.partial_shapes)
    for out, want in zip(got, op.reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), table)):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="paged cache"):
        DecodeAttentionShape(1, 8, 4, 128, 4, appended=False, page_size=24)


@pytest.mark.parametrize("page_size", [0, 16])
def test_the_merged_step_also_writes_attention_over_every_key(page_size):
    """A merged step takes the ticket counters (zeros) and writes the chunks and their merge."""
    op = ops.decode_attention(2, 2, 3, 37, 32, splits=4, page_size=page_size, merged=True)
    shape = match_decode_split(op.func)[0]
    assert shape.merged and known_input_values(op.func)[TICKETS] == 0.0
    rng = np.random.default_rng(2)
    params = op.func.params
    floats = 3 if page_size else len(params) - 5  # Q, K, V (and the appended token's K, V)
    ins = [rng.standard_normal([int(x) for x in p.shape]).astype("float16") for p in params[:floats]]
    if page_size:
        width = int(params[3].shape[1])
        pages = int(params[1].shape[0])
        ins += [rng.permutation(pages)[:2 * width].reshape(2, width).astype("int32"), np.full(2, 37, "int32")]
    ins.append(np.zeros(shape.tickets_shape, "int32"))
    *parts, out = run(op.func, *ins, outs=[*shape.partial_shapes, (shape.out_shape, "float16")])
    want = op.reference(*(a.astype(np.float64) for a in ins[:floats]), *ins[floats:-1])
    for got, expected in zip(parts, want[:3]):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, want[3], rtol=1e-3, atol=1e-3)
    if not page_size:
        k, v = (np.concatenate([ins[i], ins[i + 2]], axis=2) for i in (1, 2))
        np.testing.assert_allclose(want[3], attention(ins[0], k, v, shape.scale), rtol=1e-6, atol=1e-9)
