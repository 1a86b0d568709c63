"""Tensor-core matmul template: ldmatrix + mma.sync (m16n8k16 fp16, m16n8k32 int8).

Kernel structure for a ``matmul_tc`` config (block (bm, bn), warp (wm, wn), rstep (bk,)):

* grid: one thread block per (bm × bn) output tile and batch index; block order optionally
  swizzled in panels of ``rasterization`` tile-rows so concurrently running blocks share L2.
* main loop over K in steps of bk: A/B tiles copied global → shared (``shared.dyn``) with 128-bit
  ``cp.async`` by all threads, ``pipeline_stages`` deep (multi-buffered software pipeline);
  shared tiles XOR-swizzled (TVM's ``permuted_layout``) or padded to avoid bank conflicts.
* inner loop over bk in MMA-k steps: ldmatrix into warp fragments (the whole K-step at once when
  they fit 64 registers, else per MMA-k step; unrolled by nvcc, which overlaps the loads with
  the previous mma), then (wm/16)·(wn/16) × 2 mma.sync per warp.
* epilogue: accumulators → shared (padded rows) → global with vector stores, with the
  elementwise blocks that follow the matmul (bias, activation, cast) inlined into that copy.
  The staging tile reuses the pipeline's shared memory (TVM merges ``shared.dyn`` buffers).

Builds need ``fastdlight.compiler.compile``'s PASS_CONFIG (cp.async, no TIR CSE) and its
LowerWarpMemory fix (TVM 0.27 lowers only the first warp buffer of a scope): otherwise the
fragments end up in local memory (``bytes stack frame`` in the ptxas report).

Non-divisible shapes are padded with ``pad_einsum`` (predicated, zero-filled loads; predicated
stores), so every tile size works for every shape.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import (
    IterKind,
    auto_inline_consumer_chain,
    auto_inline_consumers,
    auto_inline_producers,
    detect_iter_traits,
    make_iter_fusion_index_map,
)

from fastdlight.config import Config
from fastdlight.analysis.dtypes import NBYTES
from fastdlight.policies.tensorcore import (
    SUPPORTED_MMA,
    MatmulMatch,
    intrin_group,
    match_matmul,
    smem_layout,
    whole_step_fragments,
)

from fastdlight.schedules import intrinsics
from fastdlight.schedules.base import MAX_VECTOR_BITS, ScheduleTemplate, expr_bits
from fastdlight.schedules.split_k import schedule_partial_sum, split_axis, split_reduction

WARP = 32
VECTOR_BYTES = 16  # cp.async / LDG.128 / STS.128
C_ROW_PAD = 8  # elements of padding per row of the shared accumulator tile


@functools.lru_cache(maxsize=None)
def register_intrinsics(in_dtype: str | None = None) -> None:
    """Import TVM's CUDA tensor intrinsics (seconds, once per process) and register the ones
    fastdlight needs for ``in_dtype`` (None: every dtype) that TVM lacks, built with TVM's own
    intrinsic generators: int8 ldmatrix from ``shared.dyn`` and an int32 accumulator store to
    ``shared.dyn``; the bf16 ldmatrix and mma.sync intrinsics (:func:`bf16_intrinsic`). fp16
    needs none: its 38 extra parses (1.3 s) are paid only by the dtypes that use them."""
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import cuda

    missing = {}
    if in_dtype in (None, "int8"):
        missing.update({
            "mma_store_16x16_i32_shared_dyn_simple_":
                lambda: cuda.get_mma_store_intrin("int32", 8, "shared.dyn", False),
            "mma_ldmatrix_i8_a_dyn": lambda: cuda.get_ldmatrix_intrin(32, "int8", "A", False, "shared.dyn"),
            "mma_ldmatrix_i8_b_trans_dyn": lambda: cuda.get_ldmatrix_intrin(32, "int8", "B", True, "shared.dyn"),
        })
    if in_dtype in (None, "bfloat16"):
        for operand, trans in itertools.product("AB", (False, True)):
            name = f"mma_ldmatrix_bf16_{operand.lower()}{'_trans' if trans else ''}_dyn"
            missing[name] = functools.partial(
                bf16_intrinsic, cuda.get_ldmatrix_intrin, 16, "float16", operand, trans, "shared.dyn")
        for trans_a, trans_b in itertools.product((False, True), repeat=2):
            name = f"mma_bf16bf16f32{'_trans_a' if trans_a else ''}{'_trans_b' if trans_b else ''}"
            missing[name] = functools.partial(
                bf16_intrinsic, cuda.get_mma_intrin, 16, "float16", "float16", "float32", trans_a, trans_b)
    for name, make in missing.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *make())


def bf16_intrinsic(make, *args):
    """TVM's fp16 generator's (desc, impl) with bf16 operands. TVM 0.27's generators assert
    fp16 for the 16-bit shapes, though ldmatrix moves any 16-bit type (``.b16``) and mma.sync
    has the same m16n8k16 shape for bf16 (``.bf16``, fp32 accumulator): the fp16 functions are
    re-read with the operand type renamed. Only the non-transposing ldmatrix compiles to the
    instruction for bf16 (the template takes bf16 in the NT layout only)."""

    def renamed(func):
        text = func.script().replace('"float16"', '"bfloat16"').replace('"fp16"', '"bf16"')
        return tvm.script.from_source(text)

    return tuple(renamed(f) for f in make(*args))


def config_fits(match: MatmulMatch, config: Config) -> bool:
    """Structural legality of a config for this template (sizes; not resources)."""
    if config.kind != "matmul_tc" or len(config.block) != 2 or len(config.warp) != 2 or len(config.rstep) != 1:
        return False
    (bm, bn), (wm, wn), (bk,) = config.block, config.warp, config.rstep
    mma_k = 32 if match.in_dtype == "int8" else 16
    warps = (bm // wm) * (bn // wn)
    return (
        wm % 16 == 0 and wn % 16 == 0 and bm % wm == 0 and bn % wn == 0
        and bk % mma_k == 0 and 1 <= warps <= 32 and config.pipeline_stages >= 1
    )  # fmt: skip


def fragment_layout(rows: int, cols: int):
    """(row, col) inside an ldmatrix tile -> (lane, element) of the warp fragment."""
    from tvm.s_tir.tensor_intrin import cuda

    if (rows, cols) == (16, 16):
        return cuda.shared_16x16_to_ldmatrix_32x8_layout
    if (rows, cols) == (16, 32):
        return cuda.shared_16x32_to_ldmatrix_32x16_layout
    if (rows, cols) == (32, 16):
        return cuda.shared_32x16_to_ldmatrix_32x16_layout
    raise ValueError(f"no ldmatrix layout for a {rows}x{cols} tile")


class TensorCoreMatmulTemplate(ScheduleTemplate):
    kinds = ("matmul_tc",)
    name = "matmul_tensorcore"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        match, _reason = match_matmul(func)
        if match is None or (match.in_dtype, match.acc_dtype) not in SUPPORTED_MMA:
            return None
        if match.in_dtype in ("int8", "bfloat16") and match.layout != "NT":
            return None  # int8 and bf16 ldmatrix need K-inner A and B (see tensorcore._mma_sync_refusal)
        if not config_fits(match, config):
            return None
        register_intrinsics(match.in_dtype)
        if config.split_k > 1:
            axis = split_axis(func, match.block)
            if axis is None or axis[1] % config.split_k:
                return None
            total = match.block
            func, match = split_reduction(func, match, config.split_k)
            sch = _schedule(func, match, config)
            schedule_partial_sum(sch, total)
            return sch
        return _schedule(func, match, config)


@dataclass(frozen=True)
class _Shape:
    """A config's tile sizes and what follows from them and the operands."""

    bm: int
    bn: int
    wm: int
    wn: int
    bk: int
    mma_k: int  # the MMA's K: 32 for int8, 16 for 16-bit operands
    in_bytes: int

    @classmethod
    def of(cls, match: MatmulMatch, config: Config) -> _Shape:
        (bm, bn), (wm, wn), (bk,) = config.block, config.warp, config.rstep
        return cls(bm, bn, wm, wn, bk, 32 if match.in_dtype == "int8" else 16, NBYTES[match.in_dtype])

    @property
    def warps(self) -> tuple[int, int]:
        return self.bm // self.wm, self.bn // self.wn


@dataclass(frozen=True)
class _Loops:
    """The tiled main block's handles that the later phases attach to."""

    outer: object  # the blockized 16 x 16 x mma_k MMA tile (what the caches read and write)
    inner: object  # the MMA itself (tensorized)
    k0: object  # the K-step loop (shared-memory copies, software pipeline)
    k1: object  # the MMA-k steps inside a K-step
    ty: object  # the warp loop (threadIdx.y)


def _schedule(func: tirx.PrimFunc, match: MatmulMatch, config: Config) -> s_tir.Schedule:
    shape = _Shape.of(match, config)
    a_k_inner, b_k_inner = smem_layout(match)
    intrins = intrin_group(match, a_k_inner, b_k_inner)
    intrinsics.ensure(intrins.values())
    sch = s_tir.Schedule(func)
    main = sch.get_sblock(match.block)
    _normalize(sch, main, a_k_inner, b_k_inner)
    # Pad every axis to the tile (no-op when it divides): zero-filled reads, predicated writes.
    sch.pad_einsum(main, [1, shape.bm, shape.bn, shape.bk])
    loops = _tile(sch, main, shape, config.rasterization)

    # Create both cache stages first: the fragment stage must be `compute_at` k0 while it is
    # not yet nested under k0 (where a cache_read of the shared copy would put it).
    a_copy = sch.cache_read(loops.outer, 0, "shared.dyn")
    b_copy = sch.cache_read(loops.outer, 1, "shared.dyn")
    a_frag = sch.cache_read(loops.outer, 0, "warp")
    b_frag = sch.cache_read(loops.outer, 1, "warp")
    # Fragments are not multi-buffered by a k1 software pipeline (see the unrolling note).
    # Small ones hold the whole K-step: every ldmatrix of the step issues back to back, then
    # every mma.sync. Larger ones are loaded per MMA-k sub-step (nvcc unrolls k1 and ptxas
    # overlaps the next sub-step's ldmatrix with the current mma), which frees the registers
    # for longer K-steps (fewer barriers).
    frag_loop = loops.k0 if whole_step_fragments(shape.wm, shape.wn, shape.bk, shape.in_bytes) else loops.k1
    sch.compute_at(a_frag, frag_loop, preserve_unit_loops=True)
    sch.compute_at(b_frag, frag_loop, preserve_unit_loops=True)
    a_smem = _fetch_to_shared(sch, a_copy, loops.k0, match, shape, a_k_inner, shape.bm)
    b_smem = _fetch_to_shared(sch, b_copy, loops.k0, match, shape, b_k_inner, shape.bn)
    a_tile = _fetch_to_fragment(sch, a_frag, a_k_inner, use_swizzle(match, shape.bk if a_k_inner else shape.bm),
                                shape.mma_k)
    b_tile = _fetch_to_fragment(sch, b_frag, b_k_inner, use_swizzle(match, shape.bk if b_k_inner else shape.bn),
                                shape.mma_k)
    c_smem, c_frag = _accumulators(sch, loops)

    init = sch.decompose_reduction(loops.outer, loops.k0)
    init_inner = sch.get_child_blocks(init)[0]
    sch.tensorize(a_tile, intrins["load_a"])
    sch.tensorize(b_tile, intrins["load_b"])
    sch.tensorize(sch.get_loops(loops.inner)[-3], intrins["compute"])
    sch.tensorize(sch.get_loops(init_inner)[-2], intrins["init"])
    sch.tensorize(sch.get_loops(c_frag)[-2], intrins["store"])

    _store_output(sch, c_smem, match, shape, split=config.split_k > 1)
    _pipeline(sch, loops.k0, (a_smem, b_smem), config)
    return sch


def _normalize(sch: s_tir.Schedule, main, a_k_inner: bool, b_k_inner: bool) -> None:
    """The main block as C[S, I, J] += A[S, I|K, K|I] * B[S, J|K, K|J]: the operands keep the
    layout they will have in shared memory, so every global load stays contiguous. Reindexed
    first, the traits read off the reindexed accesses (as Dlight does): a convolution's input
    (h + r) becomes a plain [n, h, w, r, s, c] view, and unit axes (a batch of 1, a 1x1 kernel)
    are counted the way the reindexed buffers have them."""
    S, I, J, K = IterKind.kIter_S, IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K
    a_re = sch.reindex(main, ("read", 0))
    b_re = sch.reindex(main, ("read", 1))
    c_re = sch.reindex(main, ("write", 0))
    a_traits, b_traits, c_traits, block_traits = detect_iter_traits(sch.get(main))
    sch.transform_layout(a_re, ("write", 0), make_iter_fusion_index_map(a_traits, [S, I, K] if a_k_inner else [S, K, I]))
    sch.transform_layout(b_re, ("write", 0), make_iter_fusion_index_map(b_traits, [S, J, K] if b_k_inner else [S, K, J]))
    sch.transform_layout(c_re, ("read", 0), make_iter_fusion_index_map(c_traits, [S, I, J]))
    sch.transform_block_layout(main, make_iter_fusion_index_map(block_traits, [S, I, J, K]))


def _tile(sch: s_tir.Schedule, main, shape: _Shape, panel: int) -> _Loops:
    """Grid (bm x bn) / warps (wm x wn) / 16 x 16 x mma_k tensor-core micro tiles, bound to
    blocks and warps."""
    warps_m, warps_n = shape.warps
    batch, i, j, k = sch.get_loops(main)
    i, i_mma = sch.split(i, [None, 16])
    j, j_mma = sch.split(j, [None, 16])
    k, k_mma = sch.split(k, [None, shape.mma_k])
    sch.reorder(i, j, k, i_mma, j_mma, k_mma)
    outer = sch.blockize(i_mma)
    i0, i1, i2 = sch.split(i, [None, warps_m, shape.wm // 16])
    j0, j1, j2 = sch.split(j, [None, warps_n, shape.wn // 16])
    k0, k1 = sch.split(k, [None, shape.bk // shape.mma_k])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    grid_m = int(sch.get(i0).extent)
    if 1 < panel < grid_m and grid_m % panel == 0 and int(sch.get(j0).extent) > 1:
        # Launch order: `panel` tile-rows advance across N together, so the blocks of one wave
        # reuse the same A rows and B columns from L2.
        i0o, i0i = sch.split(i0, [None, panel])
        sch.reorder(i0o, j0, i0i)
        bx = sch.fuse(i0o, j0, i0i)
    else:
        bx = sch.fuse(i0, j0)
    sch.bind(bx, "blockIdx.x")
    sch.bind(batch, "blockIdx.y")
    ty = sch.fuse(i1, j1)
    sch.bind(ty, "threadIdx.y")
    # Unrolled by nvcc, not by TVM: TVM-unrolled constant offsets such as ``8 * tx + 260`` defeat
    # LowerWarpMemory's index simplification (truncdiv), leaving fragments in local memory.
    for loop in (k1, i2, j2):
        unroll_in_nvcc(sch, loop)
    return _Loops(outer, main, k0, k1, ty)


def _fetch_to_shared(sch: s_tir.Schedule, copy, k0, match: MatmulMatch, shape: _Shape, k_inner: bool, rows: int):
    """A global -> shared copy at the K-step by all threads, 128-bit vectors, swizzled or padded."""
    sch.compute_at(copy, k0, preserve_unit_loops=True)
    # producers (a dequantize step) first, so the vector width sees every value the copy
    # computes: lanes x the widest of them must stay <= 128 bits (uint32x8 has no CUDA type)
    auto_inline_producers(sch, copy)
    inner_extent = shape.bk if k_inner else rows
    vec = min(VECTOR_BYTES // shape.in_bytes, max(1, MAX_VECTOR_BITS // expr_bits(sch.get(copy))))
    while vec > 1 and inner_extent % vec:  # (tiles are multiples of 16: a safety net)
        vec //= 2
    fused = sch.fuse(*sch.get_loops(copy)[-len(sch.get(copy).iter_vars) :])
    serial, t_y, t_x, lane = sch.split(fused, [None, math.prod(shape.warps), WARP, vec])
    sch.bind(t_y, "threadIdx.y")
    sch.bind(t_x, "threadIdx.x")
    sch.vectorize(lane)
    sch.unroll(serial)
    if use_swizzle(match, inner_extent):
        sch.annotate(copy, "permuted_layout", 1)
    else:
        sch.storage_align(copy, 0, axis=-2, factor=32, offset=VECTOR_BYTES // shape.in_bytes)
    return copy


def _fetch_to_fragment(sch: s_tir.Schedule, frag, k_inner: bool, swizzled: bool, mma_k: int):
    """Shared -> warp fragments (ldmatrix), one 16 x mma_k tile per instruction. Returns the
    loop to tensorize."""
    r, c = sch.get_loops(frag)[-2:]
    tile = (16, mma_k) if k_inner else (mma_k, 16)
    r0, r1 = sch.split(r, [None, tile[0]])
    c0, c1 = sch.split(c, [None, tile[1]])
    sch.reorder(r0, c0, r1, c1)
    unroll_in_nvcc(sch, r0)
    unroll_in_nvcc(sch, c0)
    layout = fragment_layout(*tile)
    sch.transform_layout(
        frag,
        ("write", 0),
        lambda s, a, b: (s, a // tile[0], b // tile[1], *layout(a % tile[0], b % tile[1])),
    )
    if swizzled:
        # the ldmatrix addresses must be swizzled like the shared stores: mark the block
        wrapper = sch.blockize(r0)
        sch.annotate(wrapper, "permuted_layout", 1)
    return r1


def _accumulators(sch: s_tir.Schedule, loops: _Loops):
    """Accumulators: warp fragments -> shared (per warp tile) -> global. Returns the shared
    and the fragment stage."""
    c_smem = sch.cache_write(loops.outer, 0, "shared.dyn")
    c_frag = sch.cache_write(loops.outer, 0, "warp")
    sch.reverse_compute_at(c_frag, loops.ty, preserve_unit_loops=True)
    sch.reverse_compute_at(c_smem, loops.ty, preserve_unit_loops=True)
    # pad rows by 32 bytes: the 8 rows one fragment store touches land on distinct banks
    sch.storage_align(c_frag, 0, axis=-2, factor=32, offset=C_ROW_PAD)
    r, c = sch.get_loops(c_frag)[-2:]
    r0, r1 = sch.split(r, [None, 16])
    c0, c1 = sch.split(c, [None, 16])
    sch.reorder(r0, c0, r1, c1)
    c_layout = fragment_layout(16, 16)
    sch.transform_layout(c_frag, ("read", 0), lambda s, a, b: (s, a // 16, b // 16, *c_layout(a % 16, b % 16)))
    return c_smem, c_frag


def _store_output(sch: s_tir.Schedule, c_smem, match: MatmulMatch, shape: _Shape, split: bool) -> None:
    """The shared accumulator tile to global, the elementwise consumers (the epilogue) inlined,
    in vector stores; under split-K the partial sums' only consumer is the kernel that adds them."""
    if split:
        auto_inline_consumers(sch, c_smem)
    else:
        auto_inline_consumer_chain(sch, c_smem)
    out_bytes = max(NBYTES.get(str(sch.get(c_smem).writes[0].source.dtype), 4), 1)
    fused = sch.fuse(*sch.get_loops(c_smem)[-len(sch.get(c_smem).iter_vars) :])
    out_vec = VECTOR_BYTES // max(out_bytes, NBYTES[match.acc_dtype])
    while out_vec > 1 and shape.wn % out_vec:
        out_vec //= 2
    _, t_x, lane = sch.split(fused, [None, WARP, out_vec])
    sch.bind(t_x, "threadIdx.x")
    sch.vectorize(lane)


def _pipeline(sch: s_tir.Schedule, k0, copies, config: Config) -> None:
    """Software pipeline over K: the copies run ``stages - 1`` steps ahead (cp.async groups);
    the ldmatrix + mma of a step form the last stage."""
    stages = max(config.pipeline_stages, 1)
    if stages <= 1:
        return
    names = {sch.get(c).name_hint for c in copies}
    is_copy = [_names_under(child) & names != set() for child in _children(sch.get(k0))]
    sch.annotate(k0, "software_pipeline_stage", [0 if c else stages - 1 for c in is_copy])
    # copies first (in their order), then the fragment loads and the mma
    rank = sorted(range(len(is_copy)), key=lambda i: (not is_copy[i], i))
    sch.annotate(k0, "software_pipeline_order", [rank.index(i) for i in range(len(is_copy))])
    if config.use_async_copy:
        sch.annotate(k0, "software_pipeline_async_stages", [0])


def _children(loop: tirx.For) -> list:
    body = loop.body
    while isinstance(body, s_tir.SBlockRealize):  # a loop body may be wrapped in a block
        body = body.block.body
    return list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def _names_under(stmt) -> set[str]:
    names: set[str] = set()
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, lambda block: names.add(str(block.name_hint))), order="post")
    return names


def unroll_in_nvcc(sch: s_tir.Schedule, loop) -> None:
    """Emit ``#pragma unroll`` for ``loop`` instead of unrolling it in TIR."""
    sch.unroll(loop)
    sch.annotate(loop, "pragma_unroll_explicit", 0)


def use_swizzle(match: MatmulMatch, row_elems: int) -> bool:
    """TVM's permuted layout XORs 16-byte chunks of fp16 rows of >= 32 elements. It permutes
    8-element chunks, which splits int8's 16-element ldmatrix rows, so int8 is padded instead."""
    return match.in_dtype in ("float16", "bfloat16") and row_elems % 32 == 0


def apply_tensorcore(func: tirx.PrimFunc, config: Config) -> s_tir.Schedule:
    """Module-level (picklable) entry for build workers: this template only, no fallback."""
    sch = TensorCoreMatmulTemplate().apply_config(func, config)
    if sch is None:
        raise ValueError(f"TensorCoreMatmulTemplate cannot build {config} for this function")
    return sch
