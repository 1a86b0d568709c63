"""The two workloads of ``bench_course.py`` (the MLC course's "GPU acceleration" chapter) in
TVMScript, and the course's hand-written schedules of them (``tvm.s_tir.Schedule``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tvm import s_tir
from tvm.script import tirx as T

#: relative-norm tolerances of the float64 check
TOL = {"gemm": 1e-5, "window": 1e-6}


# -- the workloads, in TVMScript ---------------------------------------------------------------
def gemm_func(n: int):
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((n, n), "float32"), B: T.Buffer((n, n), "float32"), C: T.Buffer((n, n), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i, j, k in T.grid(n, n, n):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    return main.with_attr("global_symbol", "main")


def window_func(n: int):
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((n + 2,), "float32"), B: T.Buffer((n,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(n):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] + A[vi + 1] + A[vi + 2]

    return main.with_attr("global_symbol", "main")


def make_func(workload: str, n: int):
    return {"gemm": gemm_func, "window": window_func}[workload](n)


def _divides(n: int, *tiles: int) -> None:
    for t in tiles:
        if n % t:
            raise ValueError(f"size {n} is not a multiple of the tile {t}")


# -- hand schedules: GEMM ----------------------------------------------------------------------
def _gemm_extent(sch) -> int:
    return int(sch.get(sch.get_loops(sch.get_sblock("C"))[0]).extent)


def gemm_naive(func, ty: int = 16, tx: int = 16):
    """One thread per output element; a (ty, tx) thread block; k runs serially in the thread,
    accumulating into C in global memory (the bindings are the whole schedule)."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), ty, tx)
    blk = sch.get_sblock("C")
    i, j, k = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, ty])
    j0, j1 = sch.split(j, [None, tx])
    sch.reorder(i0, j0, i1, j1, k)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j1, "threadIdx.x")
    return sch


def cooperative_fetch(sch, block, read_idx: int, loop, nthread: int, vec: int = 1):
    """The course's ``cache_read_and_coop_fetch``: the ``read_idx``-th input of ``block`` is
    staged in shared memory at ``loop``, its copy loops fused and split over the block's threads
    (``vec`` elements per thread per step, vectorized)."""
    cache = sch.cache_read(block, read_idx, "shared")
    sch.compute_at(cache, loop)
    inner = sch.fuse(*sch.get_loops(cache)[-2:])
    if vec > 1:
        _, tx, v = sch.split(inner, [None, nthread, vec])
        sch.vectorize(v)
    else:
        _, tx = sch.split(inner, [None, nthread])
    sch.bind(tx, "threadIdx.x")
    return cache


def gemm_shared(func, tile: int = 32):
    """Shared-memory tiling (the CUDA programming guide's tiled matmul): a tile×tile block of
    threads, one output each (accumulated in a register), A and B tiles of tile×tile staged in
    shared memory per k-step by all threads together."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), tile)
    blk = sch.get_sblock("C")
    c_local = sch.cache_write(blk, 0, "local")
    i, j, k = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, tile])
    j0, j1 = sch.split(j, [None, tile])
    k0, k1 = sch.split(k, [None, tile])
    sch.reorder(i0, j0, i1, j1, k0, k1)
    sch.reverse_compute_at(c_local, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "threadIdx.x")
    cooperative_fetch(sch, blk, 0, k0, tile * tile)
    cooperative_fetch(sch, blk, 1, k0, tile * tile)
    sch.decompose_reduction(blk, k0)
    return sch


def gemm_register(func, micro=(8, 8), threads=(8, 8), rstep: int = 4):
    """The course's "local blocking": each thread computes a micro[0]×micro[1] tile of C in local
    accumulators, a threads[0]×threads[1] block of threads, operands read straight from global
    memory (L1/L2), the k-step of ``rstep`` unrolled."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), micro[0] * threads[0], micro[1] * threads[1], rstep)
    blk = sch.get_sblock("C")
    c_local = sch.cache_write(blk, 0, "local")
    i, j, k = sch.get_loops(blk)
    i0, i1, i2 = sch.split(i, [None, threads[0], micro[0]])
    j0, j1, j2 = sch.split(j, [None, threads[1], micro[1]])
    k0, k1 = sch.split(k, [None, rstep])
    sch.unroll(k1)
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.reverse_compute_at(c_local, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j1, "threadIdx.x")
    sch.decompose_reduction(blk, k0)
    return sch


def gemm_register_shared(func, micro=(8, 8), threads=(8, 8), rstep: int = 8, vec: int = 4):
    """The course's ``blocking_with_shared``: register micro-tiles as :func:`gemm_register`, and
    the block's A (bm×rstep) and B (rstep×bn) tiles staged in shared memory per k-step by a
    cooperative, ``vec``-wide vectorized fetch of all its threads."""
    sch = s_tir.Schedule(func)
    _divides(_gemm_extent(sch), micro[0] * threads[0], micro[1] * threads[1], rstep)
    blk = sch.get_sblock("C")
    c_local = sch.cache_write(blk, 0, "local")
    i, j, k = sch.get_loops(blk)
    i0, i1, i2 = sch.split(i, [None, threads[0], micro[0]])
    j0, j1, j2 = sch.split(j, [None, threads[1], micro[1]])
    k0, k1 = sch.split(k, [None, rstep])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.reverse_compute_at(c_local, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "threadIdx.x")
    nthread = threads[0] * threads[1]
    cooperative_fetch(sch, blk, 0, k0, nthread, vec)
    cooperative_fetch(sch, blk, 1, k0, nthread, vec)
    sch.decompose_reduction(blk, k0)
    return sch


# -- hand schedules: window sum ----------------------------------------------------------------
def window_naive(func, nthread: int = 256):
    """One thread per output, ``nthread`` threads per block; each thread reads its three inputs
    from global memory (neighbours share them through L1)."""
    sch = s_tir.Schedule(func)
    blk = sch.get_sblock("B")
    (i,) = sch.get_loops(blk)
    _divides(int(sch.get(i).extent), nthread)
    i0, i1 = sch.split(i, [None, nthread])
    sch.bind(i0, "blockIdx.x")
    sch.bind(i1, "threadIdx.x")
    return sch


def window_shared(func, nthread: int = 256):
    """The course's example: the block's nthread + 2 inputs are staged in shared memory
    (``cache_read`` computed at the thread loop, so it covers the whole block, fetched by all its
    threads), then each thread sums three neighbours from shared memory."""
    sch = s_tir.Schedule(func)
    blk = sch.get_sblock("B")
    (i,) = sch.get_loops(blk)
    _divides(int(sch.get(i).extent), nthread)
    i0, i1 = sch.split(i, [None, nthread])
    sch.bind(i0, "blockIdx.x")
    sch.bind(i1, "threadIdx.x")
    cache = sch.cache_read(blk, 0, "shared")
    sch.compute_at(cache, i1)
    _, tx = sch.split(sch.get_loops(cache)[-1], [None, nthread])
    sch.bind(tx, "threadIdx.x")
    return sch


@dataclass(frozen=True)
class Hand:
    workload: str
    key: str
    label: str
    schedule: Callable  # func -> s_tir.Schedule


HAND = [
    Hand("gemm", "naive", "naive: 1 output/thread, 16×16 threads", gemm_naive),
    Hand("gemm", "shared", "shared-memory tiling: 32×32 tile, 1 output/thread", gemm_shared),
    Hand("gemm", "reg8x8", "register tiling 8×8/thread, 8×8 threads, no shared (course)", gemm_register),
    Hand("gemm", "reg8x8_shared", "register 8×8 + shared 64×64 tile, k 8 (course)", gemm_register_shared),
    Hand("gemm", "reg4x4_shared", "register 4×4 + shared 64×64 tile, 16×16 threads, k 16",
         lambda f: gemm_register_shared(f, micro=(4, 4), threads=(16, 16), rstep=16)),
    Hand("gemm", "reg8x8_shared128", "register 8×8 + shared 128×128 tile, 16×16 threads, k 8",
         lambda f: gemm_register_shared(f, micro=(8, 8), threads=(16, 16), rstep=8)),
    Hand("window", "naive", "naive: 1 output/thread, 256 threads", window_naive),
    Hand("window", "shared", "shared-memory window, 256 threads (course)", window_shared),
]  # fmt: skip


def hand_variants(workload: str) -> list[Hand]:
    return [h for h in HAND if h.workload == workload]
