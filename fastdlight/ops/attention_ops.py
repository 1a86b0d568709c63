"""The attention ops: scaled dot-product attention (causal, GQA/MQA) and the chunk step of
split-KV decode attention (contiguous or paged cache), with their float64 references."""

from __future__ import annotations

import numpy as np

from fastdlight.analysis.attention import AttentionShape, attention_func
from fastdlight.analysis.decode_attention import (
    TICKETS,
    DecodeAttentionShape,
    chunk_reference,
    combine_reference,
    decode_paged_func,
    decode_split_func,
)
from fastdlight.analysis.dtypes import NBYTES
from fastdlight.measure.inputs import DISTINCT_INDICES, INPUT_VALUES
from fastdlight.ops.core import Op, check_dtype, check_shape


def attention(batch, heads, seq_q, seq_kv, head_dim, kv_heads=None, causal=False, dtype="float16") -> Op:
    """Scaled dot-product attention per head, ``softmax(Q Kᵀ / sqrt(D)) V``: Q ``[B, H, TQ, D]``,
    K and V ``[B, G, TKV, D]``, out ``[B, H, TQ, D]`` in ``dtype``; scores, softmax and sums in
    fp32. ``kv_heads`` G (default H) divides H: query head h reads K/V head ``h // (H // G)``
    (GQA; MQA at G = 1). ``causal``: query i sees keys j <= i + TKV - TQ, the mask aligned to
    the bottom right (torch's ``causal_lower_right``; the same as ``is_causal=True`` when TQ =
    TKV), which a decode step (one query against the whole cache) needs; TQ <= TKV then."""
    check_shape(batch, heads, seq_q, seq_kv, head_dim, *(() if kv_heads is None else (kv_heads,)))
    check_dtype(dtype, ("float16", "bfloat16", "float32"))
    shape = AttentionShape(batch, heads, seq_q, seq_kv, head_dim, heads if kv_heads is None else kv_heads,
                           causal=causal, dtype=dtype)
    group, offset, scale = shape.group, shape.offset, shape.scale

    def ref(qa, ka, va):
        qa, ka, va = (x.astype(np.float64) for x in (qa, ka, va))
        ka, va = np.repeat(ka, group, axis=1), np.repeat(va, group, axis=1)
        sc = qa @ np.swapaxes(ka, -1, -2) * scale
        if causal:
            sc = np.where(np.arange(seq_kv)[None, :] <= np.arange(seq_q)[:, None] + offset, sc, -np.inf)
        e = np.exp(sc - sc.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ va

    nbytes = (2 * batch * heads * seq_q + 2 * batch * shape.kv_heads * seq_kv) * head_dim * NBYTES[dtype]
    return Op("attention", attention_func(shape), ref, shape.flops, nbytes)


def decode_attention(batch, kv_heads, rows, seq_kv, head_dim, splits=32, appended=True, dtype="float16",
                     page_size=0, merged=False) -> Op:
    """The chunk step of split-KV decode attention
    (:func:`~fastdlight.analysis.decode_attention.decode_split_func`): ``rows`` query rows per
    K/V head against a cache of ``seq_kv`` keys (and, ``appended``, the new token's key and
    value), cut into ``splits`` chunks. ``page_size``: the cache in pages of a pool
    (:func:`~fastdlight.analysis.decode_attention.decode_paged_func`), ``ceil(seq_kv /
    page_size)`` pages a sequence, every sequence ``seq_kv`` long (the page table random).
    ``merged``: the step also merges the chunks (its ticket counters zero)."""
    check_shape(batch, kv_heads, rows, seq_kv, head_dim, splits)
    check_dtype(dtype, ("float16", "bfloat16"))
    paged = page_size > 0
    shape = DecodeAttentionShape(batch, kv_heads, rows, head_dim, splits, appended and not paged, dtype=dtype,
                                 page_size=page_size, merged=merged)
    width = -(-seq_kv // page_size) if paged else 0

    def ref(q, k, v, *rest):
        if paged:  # gather each sequence's pages, in order, cut at its length
            table = rest[0].astype(np.int64)
            k, v = (pool[table].transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, -1, head_dim)[:, :, :seq_kv]
                    for pool in (k, v))
        elif appended:
            k, v = np.concatenate([k, rest[0]], axis=2), np.concatenate([v, rest[1]], axis=2)
        parts = chunk_reference(shape, q, k, v)
        return (*parts, combine_reference(*parts)) if merged else parts

    keys = seq_kv + int(shape.appended)
    flops = 4.0 * batch * kv_heads * rows * keys * head_dim
    known = ({"lengths": float(seq_kv)} if paged else {}) | ({TICKETS: 0.0} if merged else {})
    func = decode_paged_func(shape, batch * width + 3, width) if paged else decode_split_func(shape, seq_kv)
    if paged:
        func = func.with_attr(DISTINCT_INDICES, ["pages"])
    return Op("decode_attention", func.with_attr(INPUT_VALUES, known) if known else func, ref, flops,
              shape.cache_bytes(seq_kv))
