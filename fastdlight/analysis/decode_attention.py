"""Decode attention (flash-decoding): a few query rows against a long KV cache as two PrimFuncs,
what they compute (:class:`DecodeAttentionShape`), their TIR, and how a template recognizes
the first again.

A decode step has one query token per sequence: with GQA, the ``R = heads // kv_heads`` query
heads that share a K/V head are ``R`` rows against one cache of ``L`` keys. ``B * G`` such
problems leave most SMs idle at batch 1 (LLaMA-3-8B: 8 K/V heads), so the keys are cut into
``splits`` chunks, each scored by a CTA of its own (:func:`decode_split_func`), and a second
function merges the chunks (:func:`decode_combine_func`):

- split: Q ``[B, G, R, D]``, K and V caches ``[B, G, L, D]`` (``L`` may be symbolic) and, where
  ``appended``, the new token's K and V ``[B, G, 1, D]`` (key ``L``: attention over the cache
  and the token without copying the cache to join them). Keys are ``n = L (+ 1)``; chunk ``s``
  holds keys ``s * c .. min((s + 1) * c, n)`` with ``c = ceil(n / splits)``. Per chunk and row:
  ``m`` the largest scaled score (``scale * q . k``; at least :data:`EMPTY_MAX`, which an empty
  chunk keeps), ``l = sum exp(score - m)`` and ``o = sum exp(score - m) v`` (fp32).
- combine: ``M = max_s m_s``, ``out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s``.

Both carry their shape as an attribute (:data:`SPLIT_ATTR`, :data:`COMBINE_ATTR`), the split's
template reads it instead of re-deriving attention from the blocks.

``merged`` shapes fold the merge into the split: the function also takes a ticket counter per
(batch, K/V head) (``tickets``, int32, zero on entry and left zero: :data:`TICKETS`) and also
writes the merged output; its kernel has the last CTA of each (batch, K/V head) to finish its
chunk merge them, so that no second kernel waits for the first.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from tvm import te, tirx

from fastdlight.analysis.prepare import params_agree

SPLIT_ATTR = "fastdlight.decode_attention"
COMBINE_ATTR = "fastdlight.decode_combine"
DTYPES = ("float16", "bfloat16")
#: the floor of a chunk's max (an empty chunk's): exp(EMPTY_MAX - M) is 0 for any real M
EMPTY_MAX = -1.0e30
#: most query rows a CTA of the split template holds: a thread holds q and the output in fp32
#: for each row (16 registers a row at 8 values a lane). A K/V head serving more (MQA's 32-71
#: query heads, GQA with several query tokens) has its rows in blocks of at most this many, a
#: CTA a block (the blocks of a chunk read its keys once from HBM, the others from L2)
MAX_ROWS = 8
#: most query rows a K/V head serves (GQA group times query tokens) the split template takes
MAX_GROUP_ROWS = 128
#: the largest head dim the split template takes (any multiple of :data:`VECTOR` up to it)
MAX_HEAD_DIM = 256
#: tokens a page of a paged cache may hold (powers of two: a key's page and slot are shifts)
PAGE_SIZES = (8, 16, 32, 64, 128, 256)
#: elements of one vector load of the split template (16 bytes of fp16/bf16)
VECTOR = 8
#: shared memory a CTA of the split template may take (what every CUDA GPU gives without
#: opting in): its warps' partial results, and a staged step's ring of tiles beside them
MAX_SHARED_BYTES = 48 * 1024


@dataclass(frozen=True)
class DecodeAttentionShape:
    batch: int
    kv_heads: int
    rows: int  # query rows per K/V head
    head_dim: int
    splits: int
    appended: bool = True  # the new token's K and V come as inputs of their own
    scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    dtype: str = "float16"
    page_size: int = 0  # > 0: K and V in pages of a pool, a page table and a length per sequence
    merged: bool = False  # the split also merges (see the module docstring)

    def __post_init__(self):
        dims = (self.batch, self.kv_heads, self.rows, self.head_dim, self.splits)
        if any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in dims):
            raise ValueError(f"decode attention dimensions must be positive integers, got {dims}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unsupported decode attention dtype {self.dtype!r}; supported: {', '.join(DTYPES)}")
        if self.page_size and (self.page_size not in PAGE_SIZES or self.appended):
            raise ValueError(f"a paged cache has pages of {', '.join(map(str, PAGE_SIZES))} tokens and no appended "
                             f"token (its token is in its page), got page_size={self.page_size}, "
                             f"appended={self.appended}")
        if self.scale == 0.0:
            object.__setattr__(self, "scale", 1.0 / math.sqrt(self.head_dim))

    def paged_input_shapes(self, pages, width) -> tuple[tuple, ...]:
        """Q, the K and V page pools (``pages`` pages), the page table (``width`` pages a
        sequence, int32) and the lengths (int32)."""
        b, g, d = self.batch, self.kv_heads, self.head_dim
        pool = (pages, g, self.page_size, d)
        return ((b, g, self.rows, d), pool, pool, (b, width), (b,))

    def input_shapes(self, seq_kv) -> tuple[tuple, ...]:
        """Q, the K and V caches of ``seq_kv`` keys (an int or a shape variable) and, where
        appended, the new token's K and V."""
        b, g, d = self.batch, self.kv_heads, self.head_dim
        cache = (b, g, seq_kv, d)
        return ((b, g, self.rows, d), cache, cache) + (((b, g, 1, d),) * 2 if self.appended else ())

    @property
    def partial_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The split's outputs, the combine's inputs: ``o``, ``m`` and ``l`` per chunk."""
        b, g, s, r = self.batch, self.kv_heads, self.splits, self.rows
        return ((b, g, s, r, self.head_dim), (b, g, s, r), (b, g, s, r))

    @property
    def tickets_shape(self) -> tuple[int]:
        return (self.batch * self.kv_heads,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.batch, self.kv_heads, self.rows, self.head_dim)

    def cache_bytes(self, seq_kv: int) -> int:
        """Bytes of K and V a step reads (the caches and the token)."""
        return 2 * self.batch * self.kv_heads * (seq_kv + int(self.appended)) * self.head_dim * 2


#: the name of a merged split's ticket counters (zero on entry: the inputs a tuning run makes
#: for it must be zeros, not random)
TICKETS = "tickets"
#: most chunks a (batch, K/V head) is cut into
MAX_SPLITS = 128
#: CTAs an SM gets over all chunks: a CTA streams its chunk a tile at a time at about 11 GB/s
#: (H200, one tile's loads in flight while the last is scored), so HBM needs several an SM
CTAS_PER_SM = 4


#: (batch, K/V head) pairs an SM from which each takes one chunk, the whole cache: then every
#: CTA streams long enough to keep its loads in flight, and the step needs no merge (H200,
#: 2026-11-30, B16 H32 L4096: one chunk 1.007x torch SDPA, two chunks 0.974x at best)
ONE_CHUNK_PAIRS_PER_SM = 2


def row_blocks(rows: int) -> int:
    """CTAs the rows of a (batch, K/V head, chunk) take: blocks of at most :data:`MAX_ROWS`."""
    return -(-rows // MAX_ROWS)


def block_rows(rows: int) -> int:
    """Rows a CTA holds: ``rows`` over :func:`row_blocks` evenly (the last block may be short)."""
    return -(-rows // row_blocks(rows))


def default_splits(batch: int, kv_heads: int, sm_count: int, rows: int = 1) -> int:
    """Chunks per (batch, K/V head): at most :data:`CTAS_PER_SM` CTAs an SM over all of them
    (each of a chunk's row blocks a CTA; rounded down, so that CTAs whose registers allow no more
    an SM, as the tensor-core step's, fit in one wave), or one where the pairs alone are
    :data:`ONE_CHUNK_PAIRS_PER_SM` an SM (a short cache leaves chunks of a few keys, which cost
    little: the step is launch-bound there)."""
    pairs = batch * kv_heads * row_blocks(rows)
    if pairs >= ONE_CHUNK_PAIRS_PER_SM * sm_count:
        return 1
    return max(1, min(MAX_SPLITS, CTAS_PER_SM * sm_count // pairs))


def keys(seq_kv, appended: bool):
    """Keys scored: the cache's and the appended token's."""
    return seq_kv + 1 if appended else seq_kv


def chunk_of(seq_kv, splits: int, appended: bool):
    """Keys a chunk holds (the last may hold fewer, trailing chunks none)."""
    return (keys(seq_kv, appended) + splits - 1) // splits


def decode_split_func(shape: DecodeAttentionShape, seq_kv, name: str = "decode_attention") -> tirx.PrimFunc:
    """The naive TIR of the per-chunk step (see the module docstring); ``seq_kv`` an int or a
    ``tirx.Var`` (int64 for a model's symbolic length)."""
    s = shape
    ins = [te.placeholder(dims, s.dtype, name=n) for dims, n in zip(s.input_shapes(seq_kv), ("Q", "K", "V", "KN", "VN"))]
    last = tirx.max(seq_kv - 1, 0)

    def at(cache, new):
        """Key ``j``'s vector element: the cache's, the appended token's at ``j = L`` (past the
        keys: a valid element never used)."""
        def element(b, g, j, e):
            cached = cache[b, g, tirx.min(j, last), e]
            return tirx.if_then_else(j < seq_kv, cached, new[b, g, 0, e]) if s.appended else cached
        return element

    kn, vn = (ins[3], ins[4]) if s.appended else (None, None)
    n, c = keys(seq_kv, s.appended), chunk_of(seq_kv, s.splits, s.appended)
    outs = _chunk_step(s, ins[0], at(ins[1], kn), at(ins[2], vn), lambda b: n, lambda b: c, c)
    return _finished(s, ins, outs, name)


def decode_paged_func(shape: DecodeAttentionShape, pages, width, name: str = "decode_attention") -> tirx.PrimFunc:
    """The per-chunk step over a paged cache: key ``j`` of sequence ``b`` is slot ``j % page`` of
    page ``table[b, j // page]`` of the pools; the sequence's ``lengths[b]`` keys are cut into
    ``splits`` chunks of ``ceil(lengths[b] / splits)``."""
    s, page = shape, shape.page_size
    ins = [te.placeholder(dims, dt, name=n) for dims, dt, n in zip(
        s.paged_input_shapes(pages, width), [s.dtype] * 3 + ["int32"] * 2, ("Q", "K", "V", "pages", "lengths"))]
    table, lengths = ins[3], ins[4]

    def at(pool):
        def element(b, g, j, e):  # (a key past the sequence reads a valid element, never used)
            slot = tirx.min(j // page, width - 1)
            return pool[tirx.min(tirx.max(table[b, slot], 0), pages - 1), g, j % page, e]
        return element

    def n_of(b):
        return lengths[b].astype("int64")

    def c_of(b):
        return (n_of(b) + s.splits - 1) // s.splits

    extent = (width * page + s.splits - 1) // s.splits
    outs = _chunk_step(s, ins[0], at(ins[1]), at(ins[2]), n_of, c_of, extent)
    return _finished(s, ins, outs, name)


def _finished(s: DecodeAttentionShape, ins: list, outs, name: str) -> tirx.PrimFunc:
    """The split's PrimFunc: inputs, (merged: the tickets), ``o, m, l``, (merged: the output)."""
    if s.merged:
        ins = [*ins, te.placeholder(s.tickets_shape, "int32", name=TICKETS)]
        outs = [*outs, _combined(s, *outs)]
    return _with_attrs(te.create_prim_func([*ins, *outs]), s, name)


def _chunk_step(s: DecodeAttentionShape, q, k_at, v_at, n_of, c_of, extent):
    """``(o, m, l)`` per chunk: key ``t`` of chunk ``p`` of sequence ``b`` is ``p * c_of(b) + t``,
    scored where ``t < c_of(b)`` and the key is below ``n_of(b)``; ``extent`` bounds ``c_of``."""
    d = te.reduce_axis((0, s.head_dim), name="d")
    scale = tirx.const(s.scale, "float32")
    lead = (s.batch, s.kv_heads, s.splits, s.rows)

    def valid(b, p, t):
        return tirx.all(t < c_of(b), p * c_of(b) + t < n_of(b))

    dot = te.compute(lead + (extent,), lambda b, g, p, r, t: te.sum(
        q[b, g, r, d].astype("float32") * k_at(b, g, p * c_of(b) + t, d).astype("float32"), axis=d), name="dots")
    sc = te.compute(dot.shape, lambda b, g, p, r, t: tirx.Select(
        valid(b, p, t), dot[b, g, p, r, t] * scale, tirx.const(EMPTY_MAX, "float32")), name="scores")
    t1, t2, t3 = (te.reduce_axis((0, extent), name=f"t{i}") for i in (1, 2, 3))
    mx = te.compute(lead, lambda b, g, p, r: te.max(sc[b, g, p, r, t1], axis=t1), name="chunk_max")

    def weight(b, g, p, r, t):
        return tirx.Select(valid(b, p, t), te.exp(sc[b, g, p, r, t] - mx[b, g, p, r]), tirx.const(0.0, "float32"))

    ex = te.compute(lead + (extent,), weight, name="chunk_exp")
    total = te.compute(lead, lambda b, g, p, r: te.sum(ex[b, g, p, r, t2], axis=t2), name="chunk_sum")
    acc = te.compute(lead + (s.head_dim,), lambda b, g, p, r, e: te.sum(
        ex[b, g, p, r, t3] * v_at(b, g, p * c_of(b) + t3, e).astype("float32"), axis=t3), name="chunk_out")
    return acc, mx, total


def _with_attrs(func: tirx.PrimFunc, s: DecodeAttentionShape, name: str) -> tirx.PrimFunc:
    return func.with_attr("global_symbol", name).with_attr(SPLIT_ATTR, {k: v for k, v in asdict(s).items()})


def chunk_reference(shape: DecodeAttentionShape, q, k, v):
    """``(o, m, l)`` of the chunk step in numpy (float64): ``q`` over each sequence's contiguous
    ``k``, ``v`` (``[B, G, T, D]``, the token already joined), cut as the TIR cuts them."""
    chunk = chunk_of(k.shape[2], shape.splits, False)
    o = np.zeros(shape.partial_shapes[0])
    m, l = np.full(shape.partial_shapes[1], EMPTY_MAX), np.zeros(shape.partial_shapes[2])
    for p in range(shape.splits):
        keys = slice(p * chunk, min((p + 1) * chunk, k.shape[2]))
        if keys.start >= keys.stop:
            continue
        sc = q @ np.swapaxes(k[:, :, keys], -1, -2) * shape.scale
        m[:, :, p] = sc.max(axis=-1)
        e = np.exp(sc - m[:, :, p][..., None])
        l[:, :, p], o[:, :, p] = e.sum(axis=-1), e @ v[:, :, keys]
    return o, m, l


def combine_reference(o, m, l):
    """The merged output of the chunks' ``o, m, l`` (numpy, float64)."""
    w = np.exp(m - m.max(axis=2, keepdims=True))  # [B, G, S, R]
    return (w[..., None] * o).sum(axis=2) / (w * l).sum(axis=2)[..., None]


def decode_combine_func(shape: DecodeAttentionShape, name: str = "decode_combine") -> tirx.PrimFunc:
    """The naive TIR that merges the chunks (see the module docstring), out in ``shape.dtype``."""
    o, m, l = (te.placeholder(dims, "float32", name=n) for dims, n in zip(shape.partial_shapes, ("O", "M", "L")))
    func = te.create_prim_func([o, m, l, _combined(shape, o, m, l)])
    return func.with_attr("global_symbol", name).with_attr(COMBINE_ATTR, {k: v for k, v in asdict(shape).items()})


def _combined(shape: DecodeAttentionShape, o, m, l) -> te.Tensor:
    """The merged output of the chunks' ``o, m, l`` (in ``shape.dtype``)."""
    s1, s2, s3 = (te.reduce_axis((0, shape.splits), name=f"s{i}") for i in (1, 2, 3))
    lead = (shape.batch, shape.kv_heads, shape.rows)
    top = te.compute(lead, lambda b, g, r: te.max(m[b, g, s1, r], axis=s1), name="top")
    den = te.compute(lead, lambda b, g, r: te.sum(te.exp(m[b, g, s2, r] - top[b, g, r]) * l[b, g, s2, r], axis=s2),
                     name="denominator")
    num = te.compute(shape.out_shape, lambda b, g, r, e: te.sum(
        te.exp(m[b, g, s3, r] - top[b, g, r]) * o[b, g, s3, r, e], axis=s3), name="numerator")
    return te.compute(shape.out_shape, lambda b, g, r, e: (num[b, g, r, e] / den[b, g, r]).astype(shape.dtype),
                      name="out")


def match_decode_split(func: tirx.PrimFunc) -> tuple[DecodeAttentionShape, object] | None:
    """``(shape, seq_kv)`` if ``func`` is a :func:`decode_split_func` (or a
    :func:`decode_paged_func`) whose buffers still agree with its attribute, else None.
    ``seq_kv``: the cache length (an int or the function's variable); paged, the keys a page
    table holds at most."""
    shape = _attribute(func, SPLIT_ATTR)
    if shape is None:
        return None
    params = list(func.params)
    inputs = 5 if shape.page_size else 3 + 2 * shape.appended
    if len(params) != inputs + 3 + 2 * shape.merged or any(getattr(p, "shape", None) is None for p in params) \
            or len(params[1].shape) != 4 or (shape.page_size and len(params[3].shape) != 2):
        return None
    dims = [int(x) if isinstance(x, tirx.IntImm) else x for x in (params[1].shape[0], params[1].shape[2])]
    if shape.page_size:
        width = params[3].shape[1]
        width = int(width) if isinstance(width, tirx.IntImm) else width
        wanted, seq_kv = shape.paged_input_shapes(dims[0], width), width * shape.page_size
        dtypes = [shape.dtype] * 3 + ["int32"] * 2
    else:
        wanted, seq_kv = shape.input_shapes(dims[1]), dims[1]
        dtypes = [shape.dtype] * inputs
    want = list(zip((*wanted, *shape.partial_shapes), dtypes + ["float32"] * 3))
    if shape.merged:
        want[inputs:inputs] = [(shape.tickets_shape, "int32")]
        want.append((shape.out_shape, shape.dtype))
    return (shape, seq_kv) if params_agree(func, want) else None


def match_decode_combine(func: tirx.PrimFunc) -> DecodeAttentionShape | None:
    """The shape whose chunks ``func`` merges if it is a :func:`decode_combine_func` whose
    buffers still agree with its attribute, else None."""
    shape = _attribute(func, COMBINE_ATTR)
    if shape is None:
        return None
    want = [(dims, "float32") for dims in shape.partial_shapes] + [(shape.out_shape, shape.dtype)]
    return shape if params_agree(func, want) else None


def _attribute(func: tirx.PrimFunc, key: str) -> DecodeAttentionShape | None:
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return None
    raw = attrs[key]
    try:
        return DecodeAttentionShape(
            batch=int(raw["batch"]), kv_heads=int(raw["kv_heads"]), rows=int(raw["rows"]),
            head_dim=int(raw["head_dim"]), splits=int(raw["splits"]), appended=bool(raw["appended"]),
            scale=float(raw["scale"]), dtype=str(raw["dtype"]), page_size=int(raw.get("page_size", 0)),
            merged=bool(raw.get("merged", False)))
    except (KeyError, TypeError, ValueError):
        return None


def split_fits(shape: DecodeAttentionShape) -> bool:
    """Whether the split template takes ``shape``: at most :data:`MAX_GROUP_ROWS` rows, whole
    16-byte loads of a key (Phi-2's 80 and Phi-3's 96 as well as the powers of two)."""
    return shape.rows <= MAX_GROUP_ROWS and shape.head_dim % VECTOR == 0 and shape.head_dim <= MAX_HEAD_DIM


def decode_of(batch: int, kv_heads: int, group: int, seq_q: int, head_dim: int, causal: bool, scale: float,
              dtype: str, sm_count: int) -> DecodeAttentionShape | None:
    """The split-KV step of an attention of ``seq_q`` query tokens on each of ``group`` query
    heads a K/V head, where it is decode-sized: one query token (it sees every key, causal or
    not), or a few non-causal ones (at most :data:`MAX_ROWS` rows a K/V head; more, or causal
    ones, are a short prefill, the fused template's tensor cores'); its chunks
    :func:`default_splits`. None where the split template does not take it. The rule by which
    the Relax rewrite and ``fastdlight tune attention`` pick the split-KV step (H200, B16 H32
    TKV4096: 4.49 against the fused template's 4.24 TB/s)."""
    rows = group * seq_q
    if seq_q > 1 and (causal or rows > MAX_ROWS):
        return None
    try:
        shape = DecodeAttentionShape(batch, kv_heads, rows, head_dim, default_splits(batch, kv_heads, sm_count, rows),
                                     False, scale, dtype)
    except ValueError:
        return None
    return shape if split_fits(shape) else None


def key_lanes(head_dim: int, dims_per_lane: int) -> int:
    """Lanes a key's values span, ``dims_per_lane`` each: ``head_dim / dims_per_lane`` rounded
    up to a power of two, so that a warp holds whole keys and a key's lanes add their partial
    dot products with shuffles (96 at 8 a lane: 12 lanes of 16 hold values, 4 zeros)."""
    return 1 << (head_dim // dims_per_lane - 1).bit_length()


def lane_width(head_dim: int) -> int:
    """Values a key's lanes hold, the zeros past ``head_dim`` included (the same at 8 and 16 a
    lane): what a staged tile holds a key."""
    return VECTOR * key_lanes(head_dim, VECTOR)


def layout_fits(shape: DecodeAttentionShape, tile: int, dims_per_lane: int, warps: int) -> bool:
    """Whether ``(tile, dims_per_lane, warps)`` lays out: whole 16-byte loads, a key's lanes
    within a warp, the tile a whole number of loads a thread, the merge in shared memory."""
    if dims_per_lane % VECTOR or shape.head_dim % dims_per_lane:
        return False
    lanes = key_lanes(shape.head_dim, dims_per_lane)
    if lanes > 32 or not 1 <= warps <= 8:
        return False
    slots = warps * (32 // lanes)
    rows = block_rows(shape.rows)
    return tile % slots == 0 and warps * rows * shape.head_dim * 4 <= MAX_SHARED_BYTES


def staged_fits(shape: DecodeAttentionShape, tile: int, warps: int, stages: int) -> bool:
    """Whether a ring of ``stages`` tiles (K and V of ``tile`` keys each) fits in shared memory
    beside the warps' partial results, within what every CTA gets without opting in: ``stages`` >= 3
    (two stages are what the register sets already give)."""
    ring = stages * tile * lane_width(shape.head_dim) * 2 * 2
    rows = block_rows(shape.rows)
    return stages >= 3 and ring + warps * rows * shape.head_dim * 4 + 2 * warps * rows * 4 + 16 <= MAX_SHARED_BYTES


#: head dims the tensor-core chunk step takes (a lane's loads of a key: D / 32 for K, D / 64 for V)
MMA_HEAD_DIMS = (64, 128)


def mma_step_fits(shape: DecodeAttentionShape, warps: int) -> bool:
    """Whether the tensor-core chunk step (``decode_attention_mma``) takes ``shape`` in CTAs of
    ``warps`` warps: a contiguous cache, head dim 64 or 128, fp16 or bf16, the merge in shared memory."""
    return (not shape.page_size and shape.head_dim in MMA_HEAD_DIMS and shape.dtype in ("float16", "bfloat16")
            and 1 <= warps <= 8 and split_fits(shape)
            and warps * block_rows(shape.rows) * shape.head_dim * 4 <= MAX_SHARED_BYTES)


def combine_fits(shape: DecodeAttentionShape, warps: int) -> bool:
    """Whether the merge kernel lays out: at most 8 warps (the head dim over a warp's lanes)."""
    return 1 <= warps <= 8
