"""Attention as one PrimFunc: what it computes (:class:`AttentionShape`), its TIR (the naive
seven-block form every GPU schedules), and how a template recognizes it again.

The TIR is ``softmax(scale * Q Kᵀ [+ causal mask]) V`` per head with Q ``[B, H, TQ, D]``, K and V
``[B, G, TKV, D]``, out ``[B, H, TQ, D]``; scores, softmax and sums in fp32. The inputs may
also come as models hold them before splitting heads (``layout``): ``"bthd"``, Q ``[B, TQ, H,
D]`` and K, V ``[B, TKV, G, D]``; one layout per input, ``"bhtd,bhtd,bthd"`` (LLaMA's Q and K
come out of the rotary embedding split, its V straight from the projection); or ``"packed"``,
one ``[B, T, H + 2G, D]`` tensor (a fused QKV projection's output) holding Q's heads, then K's,
then V's. The output is ``[B, H, TQ, D]``. Query head ``h``
reads K/V head ``h // (H // G)`` (GQA; MQA at G = 1). ``causal``: query ``i`` sees keys
``j <= i + TKV - TQ``, aligned to the bottom right as torch's ``causal_lower_right`` (the same as
``is_causal=True`` when TQ = TKV). The function carries its shape as the attribute
``fastdlight.attention``, so a fused template need not re-derive attention from seven blocks
(:func:`match_attention` checks that the buffers still agree with it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tvm import te, tirx

from fastdlight.analysis.prepare import params_agree

ATTR = "fastdlight.attention"
DTYPES = ("float16", "bfloat16", "float32")
LAYOUTS = ("bhtd", "bthd", "packed")
#: the layouts one input may have on its own
OPERAND_LAYOUTS = ("bhtd", "bthd")
INT32_ELEMENTS = 2**31 - 1


@dataclass(frozen=True)
class AttentionShape:
    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    kv_heads: int
    causal: bool = False
    scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    dtype: str = "float16"
    layout: str = "bhtd"  # of the inputs (see the module docstring)

    def __post_init__(self):
        dims = (self.batch, self.heads, self.seq_q, self.seq_kv, self.head_dim, self.kv_heads)
        if any(not isinstance(d, int) or d <= 0 for d in dims):
            raise ValueError(f"attention dimensions must be positive integers, got {dims}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.causal and self.seq_q > self.seq_kv:
            raise ValueError(f"causal attention needs seq_q <= seq_kv (got {self.seq_q} > {self.seq_kv}): "
                             "aligned to the bottom right, the first queries would see no key")
        if self.dtype not in DTYPES:
            raise ValueError(f"unsupported attention dtype {self.dtype!r}; supported: {', '.join(DTYPES)}")
        parts = self.layout.split(",")
        if self.layout not in LAYOUTS and (len(parts) != 3 or not set(parts) <= set(OPERAND_LAYOUTS)):
            raise ValueError(f"unknown attention layout {self.layout!r}: one of {', '.join(LAYOUTS)}, or one of "
                             f"{' and '.join(OPERAND_LAYOUTS)} for each of Q, K, V (comma-separated)")
        if self.layout == "packed" and self.seq_q != self.seq_kv:
            raise ValueError("a packed QKV tensor has one sequence length: seq_q must equal seq_kv")
        if self.scale == 0.0:
            object.__setattr__(self, "scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    @property
    def offset(self) -> int:
        """Query ``i`` of a causal mask sees keys up to ``i + offset``."""
        return self.seq_kv - self.seq_q

    @property
    def operand_layouts(self) -> tuple[str, str, str]:
        """The layouts of Q, K and V (each ``"packed"`` when they share one tensor)."""
        parts = self.layout.split(",")
        return tuple(parts) if len(parts) == 3 else (self.layout,) * 3

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of the function's inputs: Q, K, V, or the packed tensor alone."""
        b, h, g, d = self.batch, self.heads, self.kv_heads, self.head_dim
        if self.layout == "packed":
            return ((b, self.seq_q, h + 2 * g, d),)
        heads_and_tokens = ((h, self.seq_q), (g, self.seq_kv), (g, self.seq_kv))
        return tuple((b, x, t, d) if lay == "bhtd" else (b, t, x, d)
                     for lay, (x, t) in zip(self.operand_layouts, heads_and_tokens))

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.batch, self.heads, self.seq_q, self.head_dim)

    @property
    def value_heads(self) -> tuple[int, int]:
        """The head range of V in the packed tensor (the heads after Q's and K's)."""
        return (self.heads + self.kv_heads, self.heads + 2 * self.kv_heads)

    @property
    def pairs(self) -> int:
        """(query, key) pairs scored per head: all, or query i's first ``i + offset + 1`` keys."""
        if not self.causal:
            return self.seq_q * self.seq_kv
        return self.seq_q * (self.offset + 1) + self.seq_q * (self.seq_q - 1) // 2

    @property
    def flops(self) -> float:
        return 4.0 * self.batch * self.heads * self.pairs * self.head_dim


def attention_func(shape: AttentionShape, name: str = "attention") -> tirx.PrimFunc:
    """The naive TIR of ``shape`` (scores, scaled/masked, row max, exp, row sum, weighted sum,
    out), marked with :data:`ATTR`."""
    s = shape
    inputs = [te.placeholder(dims, s.dtype, name=name)
              for dims, name in zip(s.input_shapes, ("QKV",) if s.layout == "packed" else ("Q", "K", "V"))]
    q_at, k_at, v_at = _loaders(s, inputs)
    d, j1, j2, j3 = (te.reduce_axis((0, n), name=name) for n, name in
                     ((s.head_dim, "d"), (s.seq_kv, "j1"), (s.seq_kv, "j2"), (s.seq_kv, "j3")))
    neg_inf = tirx.const(-math.inf, "float32")
    group, offset, scale = s.group, s.offset, tirx.const(s.scale, "float32")

    def score(b, h, i, j):
        return te.sum(q_at(b, h, i, d).astype("float32") * k_at(b, h // group, j, d).astype("float32"), axis=d)

    sc = te.compute((s.batch, s.heads, s.seq_q, s.seq_kv), score, name="scores")
    masked = te.compute(sc.shape, lambda b, h, i, j: tirx.Select(j <= i + offset, sc[b, h, i, j] * scale, neg_inf)
                        if s.causal else sc[b, h, i, j] * scale, name="scaled")
    mx = te.compute(sc.shape[:3], lambda b, h, i: te.max(masked[b, h, i, j1], axis=j1), name="row_max")
    ex = te.compute(sc.shape, lambda b, h, i, j: te.exp(masked[b, h, i, j] - mx[b, h, i]), name="row_exp")
    total = te.compute(sc.shape[:3], lambda b, h, i: te.sum(ex[b, h, i, j2], axis=j2), name="row_sum")
    acc = te.compute(s.out_shape, lambda b, h, i, e: te.sum(ex[b, h, i, j3] * v_at(b, h // group, j3, e).astype(
        "float32"), axis=j3), name="weighted")
    out = te.compute(s.out_shape, lambda b, h, i, e: (acc[b, h, i, e] / total[b, h, i]).astype(s.dtype), name="out")
    # the scores of long sequences pass 2^31 elements: int32 offsets would overflow
    big = s.batch * s.heads * s.seq_q * s.seq_kv > INT32_ELEMENTS
    func = te.create_prim_func([*inputs, out], index_dtype_override="int64" if big else None)
    func = func.with_attr("global_symbol", name)
    return func.with_attr(ATTR, {k: v for k, v in asdict(s).items()})


def operand_indices(s: AttentionShape, which: int, b, head, token, d) -> list:
    """The indices of element ``[b, head, token, d]`` of operand ``which`` (0 Q, 1 K, 2 V; ``head``
    of K and V a K/V head) in its tensor as ``s`` lays them out."""
    layout = s.operand_layouts[which]
    if layout == "packed":  # Q's heads, then K's, then V's
        return [b, token, head + (0, s.heads, s.heads + s.kv_heads)[which], d]
    return [b, token, head, d] if layout == "bthd" else [b, head, token, d]


def _loaders(s: AttentionShape, inputs):
    """``(q_at, k_at, v_at)``: element ``[b, head, token, d]`` of Q, K and V as ``s`` lays them out."""
    def at(t, which):
        return lambda b, x, i, d: t[tuple(operand_indices(s, which, b, x, i, d))]

    return tuple(at(t, which) for which, t in enumerate(inputs * 3 if s.layout == "packed" else inputs))


def match_attention(func: tirx.PrimFunc) -> AttentionShape | None:
    """The shape ``func`` computes if it is an :func:`attention_func` whose buffers still agree
    with its attribute (static shapes), else None."""
    attrs = func.attrs
    if attrs is None or ATTR not in attrs:
        return None
    raw = attrs[ATTR]
    try:
        shape = AttentionShape(
            batch=int(raw["batch"]), heads=int(raw["heads"]), seq_q=int(raw["seq_q"]), seq_kv=int(raw["seq_kv"]),
            head_dim=int(raw["head_dim"]), kv_heads=int(raw["kv_heads"]), causal=bool(raw["causal"]),
            scale=float(raw["scale"]), dtype=str(raw["dtype"]), layout=str(raw.get("layout", "bhtd")))
    except (KeyError, TypeError, ValueError):
        return None
    want = [(dims, shape.dtype) for dims in (*shape.input_shapes, shape.out_shape)]
    return shape if params_agree(func, want) else None


def fused_fits(shape: AttentionShape, sm_version: int) -> bool:
    """Whether a fused attention template takes ``shape`` on a GPU of ``sm_version``: from sm_80
    the mma.sync one, on Hopper also the wgmma one (both at :func:`fused_head_dim`); elsewhere
    the naive TIR would run as several kernels, slower than the unfused model graph, so a model
    rewrite should leave attention as it found it."""
    return sm_version >= 80 and fused_head_dim(shape.head_dim) and shape.dtype in ("float16", "bfloat16")


def fused_head_dim(head_dim: int) -> bool:
    """Head dims both fused templates take: whole 16-byte chunks a row, O's fragments in
    registers (Stable Diffusion's 40, Phi-2's 80, Phi-3's 96, Gemma's 256). Each pads D to its
    own steps: :func:`mma_padded_dim`, :func:`wgmma_padded_dim`."""
    return head_dim % 8 == 0 and head_dim <= MMA_MAX_HEAD_DIM


def mma_padded_dim(head_dim: int) -> int:
    """The head dim the mma.sync template computes over: whole 16-column steps of its products
    (40 -> 48; the padding's columns are zeros in Q, K and V, and O's are not stored)."""
    return -(-head_dim // 16) * 16


def q_in_registers(head_dim: int, warp_rows: int) -> bool:
    """Whether the mma.sync template holds a warp's Q fragments for the whole tile (one m16 tile
    a warp, D / 4 registers) rather than re-reading them from shared memory at each step."""
    return warp_rows == 16 and mma_padded_dim(head_dim) <= MMA_HELD_Q_HEAD_DIM


def wgmma_padded_dim(head_dim: int) -> int:
    """The head dim the wgmma template computes O over: whole 64-column chunks (a 128-byte
    swizzled row of fp16). TMA fills the columns past D with zeros in Q, K and V tiles, so the
    scores are exact (their products step over D in 16s) and O's extra columns, zeros, are not
    stored; 96 computes P·V over 128."""
    return -(-head_dim // 64) * 64


#: the largest head dim whose O fragments (D / 2) fit beside a key tile's scores and P
MMA_MAX_HEAD_DIM = 256
#: the largest head dim whose Q fragments (D / 4) are held beside O's
MMA_HELD_Q_HEAD_DIM = 192
