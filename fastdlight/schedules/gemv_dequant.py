"""Dequantizing GEMV for 4- and 8-bit weights (``kind == "gemv_dequant"``): the decode rows
(M <= 16) of a :func:`~fastdlight.analysis.weight_only.weight_only_func`, one TIRx kernel at the
bandwidth of the packed bytes.

A 4-bit weight costs a quarter of an fp16 weight's bytes, so decode runs 4x faster only if the
dequantization keeps up with HBM: converting each nibble to a float (an I2F and a few integer
operations per weight) leaves the kernel instruction-bound at about a third of the bandwidth
(stock Dlight's schedule ran 1x11008x4096 at 1.3 TB/s of packed bytes on an H200). Here a masked
OR makes two nibbles two fp16 values: ``w & 0x000F000F`` puts nibbles 0 and 4 in the low bits of
the two halves of a word, and OR-ing ``0x6400`` into each half makes the fp16 ``1024 + q``
exactly; ``w & 0x00F000F0`` gives nibbles 1 and 5 as ``1024 + 16 q``, scaled in the same f16x2
fma that subtracts the zero, so a word takes one shift (``w >> 8``) for its other four. Each
pair becomes ``(q - 8) / 8`` in one fma (a zero point: two, rounded as the reference rounds
``q - z``): the power of two is exact and keeps a lane step's 32 products below fp16's 65504 for
activations up to 2047 (unscaled, outliers of a few hundred would overflow). Products and the
step's sum are f16x2; the sum is added to an fp32 accumulator times 8 and the group scale
(groups are whole steps). bf16 activations (7 mantissa
bits) take each nibble shifted down into the mantissa of 128 and sum a word's products in bf16
before the fp32 add.

The layout that makes the pairs line up: X is copied once per CTA to shared memory with each
eight values stored as ``(x0, x4), (x1, x5), (x2, x6), (x3, x7)``, chunk-major so that the 32
lanes of a warp read consecutive 16 bytes (no bank conflicts). A warp owns ``rows_per_warp``
rows of the weight; per step every lane loads 16 bytes (4 words, 32 weights) of each row with one
128-bit load, a warp 512 contiguous bytes; steps are unrolled in groups so the loads of several
are in flight, and the first group's are issued before X is staged (its L2 reads overlap them).
Lanes' partial sums are combined with shuffles; the M activation rows share each weight.
A persistent config launches the CTAs the SMs hold at once, each walking row blocks.

Two other forms (``build_kernel``'s ``split`` and ``x_global``). Split-K: a thread-block cluster
of S CTAs (``split_k``) shares a row block, each CTA a slice of K, and stages only its slice of
X; after the warps' shuffles each CTA keeps its partial sums in shared memory, the cluster
synchronizes, and each CTA adds up every S-th sum of the block from all S CTAs (``mapa`` +
``ld.shared::cluster``, in rank order) and stores it; a second cluster barrier keeps every CTA
alive until its peers have read it. No workspace and no second kernel: the op's parameters stay
X, Q, S, (Z,) Y. Activations from global memory (``vectorize`` X 8; 4-bit weights, fp16): nothing
is staged and there is no barrier; each step reads its 32 activations with ``ld.global.nc``
(L1 keeps them for the SM's other CTAs) and pairs them with four byte permutes a word.

8-bit weights (fp16 activations) work the same way with bytes: ``w & 0x00FF00FF`` gives bytes 0
and 2 as ``1024 + b``, ``(w >> 8) & 0x00FF00FF`` bytes 1 and 3; a pair becomes ``(b - z) / 128``
in one fma; the activations are staged as the pairs ``(x0, x2), (x1, x3)`` of each word's four,
and a lane step is 16 weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.script import tirx as T

from fastdlight.analysis.weight_only import (X_GLOBAL_WIDTH, WeightOnlyShape, dequant_gemv_fits, match_weight_only,
                                             resident_ctas, x_global_fits)
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate, as_tirx_kernel
from fastdlight.schedules.gemv_dequant_device import cluster_load, dot
from fastdlight.schedules.stream_load import stream_load16

#: weight rows (of 512 bytes a warp) whose loads a warp has in flight
IN_FLIGHT_ROWS = 8
#: most CTAs of a split-K cluster (the portable cluster size)
MAX_SPLIT = 8


@dataclass(frozen=True)
class Layout:
    """What a kernel's shape and tiling fix when it is built (Python values): its loops' and
    buffers' sizes, and the index arithmetic its macros share."""

    shape: WeightOnlyShape
    M: int
    N: int
    K: int
    G: int  # weights a group (one scale)
    NG: int  # groups along K
    R: int  # weight rows a warp
    KS: int  # CTAs of a split-K cluster, each a slice of K (1: no cluster)
    x_global: bool  # activations read from global memory at each step: nothing staged
    threads: int
    rows: int  # weight rows a CTA: a row block
    ctas: int  # CTAs launched
    turns: int  # row blocks a CTA walks (persistent: more than one)
    C: int  # lane steps along K (chunks of 32 4-bit or 16 8-bit weights)
    Cs: int  # lane steps of a CTA's slice of K
    unroll: int  # steps unrolled together
    groups: int  # groups of ``unroll`` steps in a lane's share of the slice
    pairs: int  # activation pairs (uint32 words of X) a packed word meets
    x_words: int  # groups of a packed word's activations (8 or 4) staged: none where x_global
    loads: int  # of those, the most a thread stages
    partials: int  # a CTA's sums, shared with its cluster (split-K)
    combine: int  # of the cluster's sums, the most a thread adds up and stores
    # a CTA's group scales (and zero points) staged in shared memory with X, where each CTA owns
    # one row block and K whole: read in place, ptxas sank the scale loads past a CTA's last
    # weights, so that every CTA waited one more HBM round trip after its stream had ended
    staged: bool
    s_elems: int  # staged scales (and as many zero points)
    s_params: int  # 2 with zero points, else 1
    s_loads: int  # of the scales, the most a thread stages

    @classmethod
    def of(cls, shape: WeightOnlyShape, warps: int, rows_per_warp: int, ctas_launched: int | None = None,
           split: int = 1, x_global: bool = False) -> Layout:
        assert split >= 1 and (split == 1 or ctas_launched is None), "split-K CTAs are not persistent"
        assert not x_global or x_global_fits(shape)
        M, N, K, G = shape.m, shape.n, shape.k, shape.group_size
        C = K // shape.lane_weights
        Cs = -(-C // split)
        steps = -(-Cs // 32)
        threads, rows = warps * 32, warps * rows_per_warp
        blocks = -(-N // rows)
        ctas = min(blocks, ctas_launched or blocks) * split
        turns = -(-blocks // (ctas // split))
        # steps unrolled together: their loads are in flight at once (8 rows' 512 bytes a warp),
        # within the registers a thread has
        unroll = min(steps, max(1, IN_FLIGHT_ROWS // rows_per_warp))
        x_words = 0 if x_global else M * Cs * 4
        partials = rows * M
        staged = x_words > 0 and split == 1 and turns == 1
        s_elems = rows * (K // G) if staged else 0
        return cls(shape=shape, M=M, N=N, K=K, G=G, NG=K // G, R=rows_per_warp, KS=split, x_global=x_global,
                   threads=threads, rows=rows, ctas=ctas, turns=turns, C=C, Cs=Cs, unroll=unroll,
                   groups=-(-steps // unroll), pairs=shape.per_word // 2, x_words=x_words,
                   loads=-(-x_words // threads), partials=partials, combine=-(-partials // (split * threads)),
                   staged=staged, s_elems=s_elems, s_params=2 if shape.zero_point else 1,
                   s_loads=-(-s_elems // threads))

    def chunk(self, rank, cl):
        """The lane step of K at step ``cl`` of CTA ``rank``'s slice."""
        return cl if self.KS == 1 else rank * self.Cs + cl

    def in_k(self, rank, cl):
        """Whether step ``cl`` of CTA ``rank``'s slice is one of K (and of the slice)."""
        if self.KS == 1:
            return self.chunk(rank, cl) < self.C
        return tirx.all(cl < self.Cs, self.chunk(rank, cl) < self.C)

    def row_block(self, turn, bid):
        """CTA ``bid``'s row block at its ``turn``-th (split-K: its cluster's, the only one)."""
        return turn * self.ctas + bid if self.KS == 1 else bid // self.KS

    def zero(self, Z, ss, j, jr, g):
        """The group's zero point (staged: row ``jr`` of the block), or the middle of the range."""
        if Z is None:
            return tirx.const(1 << (self.shape.bits - 1), self.shape.dtype)
        return ss[self.s_elems + jr * self.NG + g] if self.staged else Z[j, g]

    def scale(self, S, ss, j, jr, g):
        """The group's scale, staged (row ``jr`` of the block) or in place."""
        return ss[jr * self.NG + g] if self.staged else S[j, g]

    def scale_slot(self, it, bid, tid):
        """Whether a thread has an ``it``-th staged scale: in the block and of a row of Y."""
        e = it * self.threads + tid
        return tirx.all(e < self.s_elems, bid * self.rows + e // self.NG < self.N)

    def x_at(self, Xw, xs, m, cl, c):
        """Row ``m``'s activations of the step, and the stride of its words' pairs."""
        if self.x_global:
            return T.address_of(Xw[m * (self.K // 2) + c * (self.shape.lane_weights // 2)]), self.C
        return T.address_of(xs[(m * 4 * self.Cs + cl) * self.pairs]), self.Cs


def _half_of(xv, i):
    """Activation ``i`` of a group (16 bits of its word ``i // 2``), in the low bits."""
    return T.bitwise_and(T.shift_right(xv[i // 2], T.Cast("uint32", (i % 2) * 16)), T.uint32(0xFFFF))


def _sum_ranks(ps, e, KS):
    """Sum ``e`` of each of the cluster's ``KS`` CTAs, added in rank order."""
    total = cluster_load(T.address_of(ps[e]), T.uint32(0))
    for p in range(1, KS):
        total = total + cluster_load(T.address_of(ps[e]), T.uint32(p))
    return total


def _dot_macros(L: Layout, dot_step):
    """``prefetch``: the weights of the first group of steps of the CTA's first row block, loaded
    into registers (in flight while X is staged); ``block_sums``: a row block's products over the
    CTA's slice of K (``dot_step`` a lane step's), each lane's sums, then the warp's."""
    M, N, R, rows = L.M, L.N, L.R, L.rows

    def load(Qv, at):
        # 4-bit weights skip L1 (H200, 2026-12-02, tuned: 2.72x -> 2.91x and 2.42x -> 2.61x our
        # fp16 GEMV); 8-bit ones at K = 11008 ran 10% slower so (0.0132 -> 0.0146 ms) and keep
        # plain loads
        return stream_load16(Qv, at) if L.shape.bits == 4 else Qv[at]

    def weights(pre, qpre, Qv, si, r, j, c):  # a lane step's four words: prefetched, or loaded now
        return qpre[si * R + r] if pre else load(Qv, j * L.C + c)

    @T.macro
    def prefetch(Qv, qpre, bid, rank, tid):
        for si in T.unroll(L.unroll):
            for r in T.unroll(R):
                j = T.meta_var(L.row_block(0, bid) * rows + (tid // 32) * R + r)
                cl = T.meta_var(si * 32 + tid % 32)
                if j < N and L.in_k(rank, cl):
                    qpre[si * R + r] = load(Qv, j * L.C + L.chunk(rank, cl))

    @T.macro
    def group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, so, tid, pre):
        """Steps ``so * unroll ..`` of ``block``'s rows, their loads unrolled together."""
        for si in T.unroll(L.unroll):
            cl = T.meta_var((so * L.unroll + si) * 32 + tid % 32)
            c = T.meta_var(L.chunk(rank, cl))
            for r in T.unroll(R):
                jr = T.meta_var((tid // 32) * R + r)
                j = T.meta_var(block * rows + jr)
                if j < N and L.in_k(rank, cl):
                    q4 = T.meta_var(weights(pre, qpre, Qv, si, r, j, c))
                    g = T.meta_var(c * L.shape.lane_weights // L.G)
                    for m in T.unroll(M):
                        acc[r * M + m] = acc[r * M + m] + dot_step(
                            q4, *L.x_at(Xw, xs, m, cl, c), L.zero(Z, ss, j, jr, g),
                        ) * T.Cast("float32", L.scale(S, ss, j, jr, g))

    @T.macro
    def block_sums(Qv, qpre, Xw, xs, ss, S, Z, acc, turn, block, rank, tid):
        for a in T.unroll(R * M):
            acc[a] = T.float32(0)
        if turn == 0:
            group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, 0, tid, True)
        else:
            group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, 0, tid, False)
        for so in T.serial(1, L.groups):
            group(Qv, qpre, Xw, xs, ss, S, Z, acc, block, rank, so, tid, False)
        for a in T.unroll(R * M):
            for o in T.unroll(5):
                acc[a] = acc[a] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), acc[a], 16 >> o, 32, 32)

    return prefetch, block_sums


def _staging_macros(L: Layout):
    """``read_scales``: the row block's scales (and zero points) into registers, read before X is
    staged; ``stage``: X into shared memory, those scales beside it, then the CTA's barrier."""
    threads, pairs, Cs, s_loads = L.threads, L.pairs, L.Cs, L.s_loads

    @T.macro
    def read_scales(Sf, Zf, Z, sv, bid, tid):
        for it in T.unroll(s_loads):
            if L.scale_slot(it, bid, tid):
                sv[it] = Sf[bid * L.rows * L.NG + it * threads + tid]
                if Z is not None:
                    sv[s_loads + it] = Zf[bid * L.rows * L.NG + it * threads + tid]

    @T.macro
    def stage(Xw, xs, xv, ss, sv, Z, bid, rank, tid):
        # X to shared memory: eight activations (four words) as the pairs (x_t, x_t+4), the
        # words of a lane step a chunk apart (lanes read consecutive 16 bytes); a CTA of a
        # split-K cluster, its slice of K only
        for it in T.serial(L.loads):
            e = T.meta_var(it * threads + tid)  # (m, chunk of the slice, word of the chunk)
            if e < L.x_words:
                m = T.meta_var(e // (Cs * 4))
                ci = T.meta_var(e % (Cs * 4))
                if L.chunk(rank, ci // 4) < L.C:
                    for w in T.vectorized(pairs):
                        xv[w] = Xw[(m * L.C * 4 + L.chunk(rank, 0) * 4 + ci) * pairs + w]
                    base = T.meta_var(((m * 4 + ci % 4) * Cs + ci // 4) * pairs)
                    for t in T.unroll(pairs):
                        xs[base + t] = T.bitwise_or(_half_of(xv, t),
                                                    T.shift_left(_half_of(xv, t + pairs), T.uint32(16)))
        for it in T.unroll(s_loads):
            if L.scale_slot(it, bid, tid):
                ss[it * threads + tid] = sv[it]
                if Z is not None:
                    ss[L.s_elems + it * threads + tid] = sv[s_loads + it]
        T.cuda.cta_sync()

    return read_scales, stage


def _store_macro(L: Layout):
    """The macro that stores a row block's sums: lane 0 of each warp its rows'; split-K, through
    the cluster: each CTA's sums in its shared memory, then every CTA adds up every KS-th (row,
    activation row) from all of them (in rank order) and stores it."""
    M, N, R, out_dtype = L.M, L.N, L.R, L.shape.out_dtype

    @T.macro
    def store(Yf, ps, acc, block, rank, tid):
        if tid % 32 == 0:
            for r in T.unroll(R):
                j = T.meta_var(block * L.rows + (tid // 32) * R + r)
                if j < N:
                    for m in T.unroll(M):
                        Yf[m * N + j] = T.Cast(out_dtype, acc[r * M + m])

    @T.macro
    def exchange(Yf, ps, acc, block, rank, tid):
        if tid % 32 == 0:
            for r in T.unroll(R):
                for m in T.unroll(M):
                    ps[((tid // 32) * R + r) * M + m] = acc[r * M + m]
        T.cuda.cluster_sync()
        for it in T.serial(L.combine):
            e = T.meta_var(rank + L.KS * (it * L.threads + tid))  # (row of the block, activation row)
            j = T.meta_var(block * L.rows + e // M)
            if e < L.partials and j < N:
                Yf[(e % M) * N + j] = T.Cast(out_dtype, _sum_ranks(ps, e, L.KS))
        # no CTA leaves while a peer may still read its partial sums
        T.cuda.cluster_sync()

    return store if L.KS == 1 else exchange


def build_kernel(func: tirx.PrimFunc, shape: WeightOnlyShape, warps: int, rows_per_warp: int,
                 ctas_launched: int | None = None, split: int = 1, x_global: bool = False) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` (a weight-only matmul of ``shape``): ``warps`` warps a CTA, each
    owning ``rows_per_warp`` weight rows; ``ctas_launched`` (persistent): that many CTAs walk
    the row blocks, staging X once each. ``split`` > 1: a thread-block cluster of that many CTAs
    shares a row block, each CTA a slice of K (and stages only its slice of X); their partial
    sums meet in distributed shared memory, each CTA adding up and storing a share of the rows.
    ``x_global`` (4-bit weights, fp16): nothing is staged, each step reads its activations from
    global memory (L1) and pairs them with byte permutes. Same parameters, same result."""
    L = Layout.of(shape, warps, rows_per_warp, ctas_launched, split, x_global)
    M, N, K, R, NG, s_dtype = L.M, L.N, L.K, L.R, L.NG, shape.dtype
    prefetch, block_sums = _dot_macros(L, dot(shape, x_global))
    read_scales, stage = _staging_macros(L)
    store = _store_macro(L)

    @T.macro
    def body(X, Q, S, Z, Y):
        T.device_entry()
        bid = T.cta_id([L.ctas])
        if L.KS > 1:
            rank = T.cta_id_in_cluster([L.KS])
        else:
            rank = T.meta_var(0)
        tid = T.thread_id([L.threads])
        if L.x_words > 0 or L.KS > 1:
            pool = T.SMEMPool()
            xs = pool.alloc((max(1, L.x_words * L.pairs),), "uint32", align=16)
            ps = pool.alloc((L.partials,), "float32", align=16)
            ss = pool.alloc((max(1, L.s_elems * L.s_params),), s_dtype, align=16)
            pool.commit()
        else:
            xs = T.meta_var(None)
            ps = T.meta_var(None)
            ss = T.meta_var(None)
        Xw = T.decl_buffer((M * K // 2,), "uint32", data=X.data)
        Qv = T.decl_buffer((N * L.C,), "uint32x4", data=Q.data)
        Yf = T.decl_buffer((M * N,), shape.out_dtype, data=Y.data)
        Sf = T.decl_buffer((N * NG,), s_dtype, data=S.data)
        Zf = T.meta_var(T.decl_buffer((N * NG,), s_dtype, data=Z.data) if Z is not None else None)
        xv = T.alloc_buffer((L.pairs,), "uint32", scope="local")
        acc = T.alloc_buffer((R * M,), "float32", scope="local")
        # the first group of steps' weights (the first block's), in flight while X is staged
        qpre = T.alloc_buffer((L.unroll * R,), "uint32x4", scope="local")
        prefetch(Qv, qpre, bid, rank, tid)
        # the row block's scales (and zero points) read now, stored beside X before the barrier
        sv = T.alloc_buffer((max(1, L.s_loads * L.s_params),), s_dtype, scope="local")
        read_scales(Sf, Zf, Z, sv, bid, tid)
        if L.x_words > 0:
            stage(Xw, xs, xv, ss, sv, Z, bid, rank, tid)
        for turn in T.serial(L.turns):
            block = T.meta_var(L.row_block(turn, bid))
            block_sums(Qv, qpre, Xw, xs, ss, S, Z, acc, turn, block, rank, tid)
            store(Yf, ps, acc, block, rank, tid)

    return weight_only_kernel(func, shape, body)


def weight_only_kernel(func: tirx.PrimFunc, shape: WeightOnlyShape, body) -> tirx.PrimFunc:
    """The kernel for ``func`` (a weight-only matmul of ``shape``) whose body is the macro
    ``body(X, Q, S, Z, Y)`` (``Z`` None without zero points), with the op's parameters."""
    (x_shape, x_dtype), (q_shape, _), (s_shape, s_dtype) = shape.param_shapes()[:3]
    y_shape, out_dtype = shape.lead + (shape.n,), shape.out_dtype
    if shape.zero_point:
        @T.prim_func
        def with_zeros(X: T.Buffer(x_shape, x_dtype), Q: T.Buffer(q_shape, "uint32"), S: T.Buffer(s_shape, s_dtype),
                       Z: T.Buffer(s_shape, s_dtype), Y: T.Buffer(y_shape, out_dtype)):
            body(X, Q, S, Z, Y)

        return as_tirx_kernel(with_zeros, func)

    @T.prim_func
    def symmetric(X: T.Buffer(x_shape, x_dtype), Q: T.Buffer(q_shape, "uint32"), S: T.Buffer(s_shape, s_dtype),
                  Y: T.Buffer(y_shape, out_dtype)):
        body(X, Q, S, None, Y)

    return as_tirx_kernel(symmetric, func)


class WeightOnlyGemvTemplate(ScheduleTemplate):
    """A dequantizing GEMV template: takes a weight-only matmul and a config of its kind with one
    size of the CTAs' row blocks (``block``) and one other (the config's field :attr:`inner`),
    and builds the kernel with :meth:`build`."""

    #: the config field that holds the template's second size
    inner = "thread"

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        shape = match_weight_only(func)
        inner = getattr(config, self.inner)
        if shape is None or config.kind not in self.kinds or len(config.block) != 1 or len(inner) != 1:
            return None
        return self.build(func, shape, config, config.block[0], inner[0])

    def build(self, func: tirx.PrimFunc, shape: WeightOnlyShape, config: Config, rows: int,
              inner: int) -> tirx.PrimFunc | None:
        """The kernel for ``config`` (CTAs of ``rows`` weight rows), or None where it does not fit."""
        raise NotImplementedError


class DequantGemvTemplate(WeightOnlyGemvTemplate):
    kinds = ("gemv_dequant",)
    name = "gemv_dequant"

    def build(self, func, shape, config, rows, per_warp):
        warps = rows // per_warp
        if not dequant_gemv_fits(shape) or rows % per_warp or not 1 <= warps <= 32:
            return None
        split, x_global = config.split_k, config.vector_width("X") == X_GLOBAL_WIDTH
        if split > 1 and (config.persistent or split > MAX_SPLIT) or x_global and not x_global_fits(shape):
            return None
        launched = None
        if config.persistent:
            target = tvm.target.Target.current(allow_none=True)
            arch = CUDA(target) if target is not None else None
            launched = resident_ctas(shape, warps, arch) * (arch.sm_count if arch is not None else 132)
        return build_kernel(func, shape, warps, per_warp, launched, split, x_global)
