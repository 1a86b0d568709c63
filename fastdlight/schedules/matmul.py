"""CUDA-core tiled matmul template (config kind ``"matmul"``): matmul, batch matmul and
conv2d (implicit GEMM through its own loop nest), any dtype the CUDA cores handle.

The template works on the *original* loop nest of the output-defining block, so one code path
covers every matmul-like reduction: each spatial axis i (``(b, i, j)``, ``(n, p, q, k)``, ...)
is tiled as ``[grid, chunk, thread, per-thread]`` and each reduction axis r as
``[outer, rstep[r]]``::

    blockIdx.x   = fused grid loops
    vthread.x    = fused chunk loops   (micro tile split in strided chunks, see below)
    threadIdx.x  = fused thread loops
      init C_local
      for ko (fused reduction outer loops)      <- A, B copied to shared memory (cooperative,
        for ki (reduction inner loops)              vectorized, optionally double-buffered)
          A_local, B_local <- shared            <- register fragments (vector loads)
          for per-thread tile: C_local += A_local * B_local
      C <- C_local (+ inlined elementwise epilogue)

Strided chunks: a thread's micro tile along an axis with ``thread[i] >= 8`` is split into
``thread[i] // 4`` chunks of 4 elements, the chunks lying ``block[i] / chunks`` apart. A warp
then reads consecutive 16-byte words of shared memory (no bank conflicts) and stores rows of
C in 16-byte words. Chunks are bound to a virtual thread, so TVM's vthread injection
replicates the per-thread code per chunk while shared-memory copies stay shared.

Shared layout: dims of an input indexed only by reduction axes are moved outermost (A[m, k]
is stored as [k, m]), so a thread's fragment along a spatial axis is contiguous and can be
read with vector loads; rows are padded to avoid bank conflicts on the transposing stores.

Double buffering (``pipeline_stages >= 2``): with ``use_async_copy`` cp.async stages; without,
the copy is staged through registers (TVM's ``manifest_shared_memory_local_stage``): global
loads of tile i+1 are issued before computing tile i and stored to shared memory after it —
the faster choice for big fp32 tiles on H100/H200. Shapes the tiles do not divide are padded
with ``pad_einsum`` (zero-filled loads, guarded stores); conv loops use predicated splits.
``rasterization`` launches blocks in panels of that many block rows. Tiles beyond 48 KB of
shared memory switch to dynamic shared memory.

Measured (H200, fp32): 4096³ 47.3 TFLOPS = 0.92x cuBLAS with 128x128 (or 64x128) / 8x8 /
rstep 16 / 2 stages staged; 1024³ 34.4 TFLOPS = 1.02x with 64x64 / 8x4 / rstep 16 / cp.async.
See benchmarks/bench_matmul_fp32.py.

This module decides whether a function and config fit the template; the schedule-building
steps live in :mod:`fastdlight.schedules.matmul_steps`.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from fastdlight.analysis.func_info import block_axes, output_block
from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate
from fastdlight.schedules.matmul_steps import MatmulBuilder


class MatmulTemplate(ScheduleTemplate):
    """Shared-memory tiled GEMM on CUDA cores, all sizes from the config."""

    kinds = ("matmul",)
    name = "matmul"

    def __init__(
        self,
        strided_chunks: bool = True,
        transpose_shared: bool = True,
        pad_shared: bool = True,
        register_stage: bool = True,
    ):
        self.strided_chunks = strided_chunks
        self.register_stage = register_stage
        self.transpose_shared = transpose_shared
        self.pad_shared = pad_shared

    # ------------------------------------------------------------------------------------
    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        if config.kind not in self.kinds:
            return None
        sch = s_tir.Schedule(func)
        try:
            _, info = output_block(sch)
            spatial, reduce = block_axes(info)
        except ValueError:
            return None
        if not info.is_reduction() or not spatial or not reduce:
            return None
        main = info.block_rv
        if len(sch.get(main).reads) < 2 or not _is_multiply_add(sch.get(main)):
            return None
        if len(config.block) != len(spatial) or len(config.rstep) != len(reduce):
            return None  # the config was made for other axes
        padded = _pad_to_tiles(sch, main, spatial + reduce, config.block + config.rstep)
        if padded:
            _, info = output_block(sch)
            main = info.block_rv
            spatial, reduce = block_axes(info)
        return MatmulBuilder(sch, main, spatial, reduce, config, self).build()


def _is_multiply_add(block: tirx.SBlock) -> bool:
    """C = C + f(A) * g(B): the body of a matmul / conv reduction."""
    body = block.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return False
    value = body.value
    terms = (value.a, value.b)
    # In TVM 0.27 a buffer load is an ``ir.TensorLoad`` whose ``source`` is the buffer.
    return any(isinstance(t, tirx.Mul) for t in terms) and any(
        isinstance(t, tvm.ir.TensorLoad) and t.source.same_as(body.buffer) for t in terms
    )


def _pad_to_tiles(sch, main, axes, tiles) -> bool:
    """Pad the iteration space up to whole tiles (``pad_einsum``) when a tile does not divide
    its axis, so the main loop runs without predicates; the zero padding is applied while
    loading shared memory and the output store is guarded. Returns whether it padded; conv
    loops (not an einsum) keep TVM's predicated splits instead."""
    padding = [tile if axis.extent % tile else 1 for axis, tile in zip(axes, tiles)]
    if all(p == 1 for p in padding):
        return False
    try:
        sch.pad_einsum(main, padding)
    except Exception:  # noqa: BLE001 - not an einsum: fall back to predication
        return False
    return True
