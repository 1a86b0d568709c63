"""Fallback template: a correct (not fast) schedule for any normalizable function.

Injective blocks are inlined; every remaining block gets its spatial loops fused and split over
``blockIdx.x`` × ``threadIdx.x`` (threads per block from the config, clamped to [32, 1024]);
reductions run serially inside each thread. The dispatcher tries it after the templates of the
config's kind, so a missing or failing template still yields a runnable kernel.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import MAX_THREADS, ScheduleTemplate, inline_injective, prepare


class FallbackTemplate(ScheduleTemplate):
    kinds = ("*",)
    name = "fallback"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        sch, blocks, _, _, _ = prepare(func)
        inline_injective(sch, blocks)
        threads = min(MAX_THREADS, max(32, _threads(config)))
        pending_init = []
        for info in blocks:
            block = info.block_rv
            loops = sch.get_loops(block)
            if any(sch.get(lp).thread_binding is not None for lp in loops):
                continue
            kinds = info.dom_kind()
            s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
            other = [lp for lp, k in zip(loops, kinds) if k != "S"]
            if not s_loops:
                s_loops = [sch.add_unit_loop(block)]
            sch.reorder(*s_loops, *other)
            fused = sch.fuse(*s_loops) if len(s_loops) > 1 else s_loops[0]
            bx, tx = sch.split(fused, [None, threads], preserve_unit_iters=True)
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            if other and info.is_reduction():
                pending_init.append((block, other[0]))
        # Separate init statements so each reduction accumulates in its own thread.
        for block, loop in pending_init:
            sch.decompose_reduction(block, loop)
        return sch


def _threads(config: Config) -> int:
    try:
        return config.num_threads
    except Exception:  # noqa: BLE001 - malformed configs still get a default
        return 256 if not config.block else math.prod(config.block)
