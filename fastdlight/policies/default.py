"""DefaultPolicy: Roller for CUDA cores (every family except tensor-core matmul).

Per function (see :mod:`.analysis` for the families) it runs Roller's recipe:

1. best-first search over output tiles of the output-defining block (:func:`roller.best_first`),
   each step enlarging one axis to its next candidate size (factors of the extent, powers of two
   below it), at most ``MAX_VISITS`` tiles;
2. per tile, a family "planner" picks the reduction step (coalescing), the threads (prefer
   4–8 warps, split over spatial axes to minimize the per-thread footprint, leftover threads on
   the reduction) and vector widths, and discards what exceeds the arch's shared memory
   (``smem_per_block``: the 48 KB default, CUDA-core templates do not opt in), registers or
   threads;
3. every candidate config is scored ``(traffic + 1) × waves`` (:mod:`.roller`), with waves from
   the blocks per SM allowed by threads, registers, shared memory and ``max_blocks_per_sm``.

``emit_config(topk)`` returns the ``topk`` best distinct configs, cost ascending, each kernel once
(configs its template builds into the same kernel are dropped, not replaced: fewer than
``topk`` then); equal costs are ordered by a family preference (thread count in the preferred
range, …) then by the config's text, so the result is deterministic.
"""

from __future__ import annotations

from fastdlight.analysis.func_info import FuncInfo, analyze
from fastdlight.config import Config
from fastdlight.analysis.matmul_match import match_matmul
from fastdlight.policies.planner import MAX_VISITS
from fastdlight.policies.planner_matmul import MAX_UNROLLED_FMAS, MatmulPlanner  # noqa: F401 - MAX_UNROLLED_FMAS: part of the API
from fastdlight.policies.planner_memory import (  # noqa: F401 - GATHER_MAX_LANES: part of the API
    GATHER_MAX_LANES,
    ElementwisePlanner,
    GemvPlanner,
    GeneralReductionPlanner,
    ReductionPlanner,
)
from fastdlight.policies.roller import best_first

_PLANNERS = {
    "elementwise": ElementwisePlanner,
    "reduction": ReductionPlanner,
    "general_reduction": GeneralReductionPlanner,
    "gemv": GemvPlanner,
    "matmul": MatmulPlanner,
}


def _pairs_columns(func) -> bool:
    match, _reason = match_matmul(func)
    return match is not None and match.pair_columns > 0


class DefaultPolicy:
    """Roller on CUDA cores. ``DefaultPolicy(func, arch, opt_shapes).emit_config(topk)``."""

    def __init__(self, func, arch, opt_shapes: dict | None = None, family: str | None = None):
        """``family``: plan for another template than the analysis picks, where it applies
        (a GEMV is also a matmul: benchmarks compare the two templates on decode shapes)."""
        self.arch = arch
        self.info = func if isinstance(func, FuncInfo) else analyze(func, opt_shapes)
        kind = family or self.info.kind
        if family == "matmul" and self.info.kind not in ("matmul", "gemv"):
            raise ValueError(f"a {self.info.kind} function cannot be planned as a matmul")
        if kind == "matmul" and not isinstance(func, FuncInfo) and _pairs_columns(func):
            raise ValueError("the epilogue pairs the matmul's columns (gate and up in one GEMM): "
                             "only the wgmma template computes it")
        planner = _PLANNERS.get(kind)
        if planner is None or (kind == "gemv" and self.info.gemv_weight is None):
            raise ValueError(f"DefaultPolicy cannot handle op family {kind!r} here")
        self.planner = planner(self.info, arch)
        self.visited = 0
        self._resources: dict = {}

    def emit_config(self, topk: int = 10) -> list[Config]:
        """The ``topk`` best distinct configs, best first (each carries its predicted ``cost``),
        each kernel once."""
        if topk <= 0:
            return []
        best: dict[Config, tuple] = {}
        planner = self.planner
        cands = planner.axis_candidates()

        def evaluate(tile):
            top = None
            for plan in planner.plans(tile):
                scored = planner.score(*plan)
                if scored is None:
                    continue
                key, cfg, emittable, res = scored
                top = key[0] if top is None else min(top, key[0])
                if not emittable:
                    continue
                full = (*key, repr(cfg))
                if cfg not in best or full < best[cfg][0]:
                    best[cfg] = (full, cfg, res)
            return top

        def neighbors(tile):
            for j, c in enumerate(cands):
                nxt = [s for s in c if s > tile[j]]
                if nxt:
                    yield tile[:j] + (nxt[0],) + tile[j + 1 :]

        self.visited = best_first(planner.start(), neighbors, evaluate, MAX_VISITS)
        if not best:
            raise ValueError(
                f"DefaultPolicy found no config within {self.arch.name}'s limits for "
                f"{self.info.kind} {[a.extent for a in self.info.spatial_axes]}"
            )
        ranked = _one_per_kernel(_diverse(sorted(best.values(), key=lambda kv: kv[0]), topk), planner)
        self._resources = {cfg: res for _, cfg, res in ranked}
        return [cfg for _, cfg, _ in ranked]

    def resources(self, config: Config) -> dict:
        """What the policy assumed for an emitted config: threads, registers per thread (estimate),
        shared-memory bytes, resident blocks per SM and grid size."""
        return dict(self._resources[config])


def _diverse(ranked: list, topk: int) -> list:
    """The ``topk`` best entries, first taking one per (block tile, thread tile, pipelining) —
    variants of one such shape (reduction steps, vector widths) are usually close in speed, so
    measuring more shapes pays off — then filling up in rank order; returned in rank order."""
    picked, seen, rest = [], set(), []
    for entry in ranked:
        cfg = entry[1]
        key = (cfg.block, cfg.thread, cfg.pipeline_stages, cfg.use_async_copy)
        if key in seen:
            rest.append(entry)
            continue
        seen.add(key)
        picked.append(entry)
        if len(picked) == topk:
            break
    picked += rest[: topk - len(picked)]
    return sorted(picked, key=lambda kv: kv[0])


def _one_per_kernel(ranked: list, planner) -> list:
    """``ranked`` with each kernel once, as its plain config (:meth:`Planner.kernel_of`), where
    the best-ranked of its configs was. The configs dropped are not replaced by lower-ranked
    ones: building the same kernel twice measured nothing new (a depthwise convolution's
    one-step reductions had half their candidates so, at ~2 s of nvcc each), and the kernels
    built stay the ones the policy ranked in its top k."""
    out, seen = [], set()
    for key, cfg, res in ranked:
        plain = planner.kernel_of(cfg)
        if plain not in seen:
            seen.add(plain)
            out.append((key, plain, res))
    return out


__all__ = ["DefaultPolicy"]
