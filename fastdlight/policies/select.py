"""The policy choice: which policies emit configs for a function, in which order.

    fused attention?       -> the attention policy's tiles first (sm_90a)
    decode attention?      -> the split-KV template's layouts
    packed weights, decode? -> the dequantizing GEMV's CTA shapes first
    tensor-core eligible?  -> TensorCorePolicy first (Hopper wgmma tiles included on sm_90a;
                              packed 4-bit weights, prefill rows: the dequantizing wgmma
                              template's tiles first, in the same set)
    always                 -> DefaultPolicy (CUDA cores), with the transpose/gather tiles first
                              on a layout change or a gather, and matmul tiles beside a GEMV
    stock / recorded       -> measured beside the first set (or after all, when nothing is timed)

The tensor-core match is computed once (:func:`match_tensor_core`) and handed on as a typed
record: the tuner reads it too (stock Dlight's schedules, database replay).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Iterator

from tvm import tirx

from fastdlight.analysis.attention import match_attention
from fastdlight.analysis.decode_attention import match_decode_combine, match_decode_split
from fastdlight.analysis.weight_only import match_weight_only
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.policies.attention import attention_configs
from fastdlight.policies.decode_attention import decode_attention_configs, decode_combine_configs
from fastdlight.policies.default import DefaultPolicy
from fastdlight.policies.gather import gather_configs
from fastdlight.policies.gemv_dequant import dequant_gemv_configs
from fastdlight.policies.tensorcore import TensorCorePolicy, get_tensorized_func_and_tags
from fastdlight.policies.transpose import transpose_configs
from fastdlight.policies.wgmma_dequant import dequant_wgmma_configs


@dataclass(frozen=True)
class TensorCoreMatch:
    """Whether a function goes to tensor cores, and what the tensor-core policy schedules:
    ``func`` (the function as the template sees it) and ``tags`` (the matmul view: M/N/K, dtypes,
    layouts, epilogue; see :func:`~fastdlight.policies.tensorcore.get_tensorized_func_and_tags`)."""

    func: tirx.PrimFunc | None
    tags: dict | None

    @property
    def eligible(self) -> bool:
        return bool(self.tags)

    @property
    def in_dtype(self) -> str | None:
        return self.tags["in_dtype"] if self.tags else None


def match_tensor_core(func, arch: CUDA) -> TensorCoreMatch:
    """The tensor-core match of ``func`` on ``arch`` (ineligible: ``func`` and ``tags`` None)."""
    tc_func, tags = get_tensorized_func_and_tags(func, arch)
    return TensorCoreMatch(tc_func if tags else None, tags or None)


@dataclass(frozen=True)
class CandidateSet:
    """Configs one policy emitted, and the function they schedule (the tensor-core policy
    schedules a rewritten copy)."""

    policy: str
    func: object
    configs: tuple[Config, ...]


def candidate_sets(func, arch: CUDA, topk: int, stock: tuple[Config, ...] = (),
                   stock_last: bool = False, recorded: tuple[Config, ...] = (),
                   match: TensorCoreMatch | None = None,
                   memory_bound_topk: int | None = None) -> Iterator[CandidateSet]:
    """Tensor-core configs first when the function is eligible, then CUDA-core ones. ``stock``
    (see :func:`stock_configs`) and ``recorded`` (a MetaSchedule database's records of the
    function) join the first set, to be measured against the policy's configs; ``stock_last``
    (nothing is timed, so stock could not win anyway): stock is a set of its own after the
    policies', built only when all of theirs fail (always so for a fused attention).
    ``match``: :func:`match_tensor_core` of ``func``, when the caller has it already. ``memory_bound_topk``: see :func:`default_configs`."""
    packed = match_weight_only(func)
    sets, fused, decode = _template_sets(func, arch, topk, packed)
    template_only = bool(sets)
    # stock Dlight's schedule of a fused attention is its fallback, three orders of magnitude
    # behind the template (B1 H32 T8192: about a second a launch, its probe and first timing
    # 5 s of a 14 s tune, H200): measured only where every config of the template fails
    stock_last = stock_last or fused
    sets += _tensor_core_sets(func, arch, topk, match, None if decode else packed)
    # a fused attention has its template, or stock Dlight: the seven-block naive form as general
    # reductions runs three orders of magnitude slower and takes minutes to tune; a 4- or 8-bit
    # decode GEMV has its template and stock Dlight (CUDA-core tiles lost to both)
    if not template_only:
        sets += _default_set(func, arch, topk, memory_bound_topk, bool(sets or stock or recorded), not sets)
    yield from _with_measured_beside(func, sets, stock, stock_last, recorded)


def _template_sets(func, arch: CUDA, topk: int, packed) -> tuple[list[CandidateSet], bool, bool]:
    """The sets of the templates an op family has to itself (fused and decode attention, the
    dequantizing GEMV of ``packed``, :func:`match_weight_only` of ``func``): where there are
    any, they are all the policies ``func`` gets but the tensor-core ones. With them, whether a
    fused attention and whether a dequantizing GEMV took ``func``."""
    sets = []
    attention = match_attention(func)
    fused = tuple(attention_configs(attention, arch, topk)) if attention is not None else ()
    if fused:
        sets.append(CandidateSet("AttentionPolicy", func, fused))
    chunked, merged = match_decode_split(func), match_decode_combine(func)
    split = tuple(decode_attention_configs(chunked, arch, topk)) if chunked is not None else ()
    split += tuple(decode_combine_configs(merged, topk)) if merged is not None else ()
    if split:
        sets.append(CandidateSet("DecodeAttentionPolicy", func, split))
    dequant = tuple(dequant_gemv_configs(packed, arch, topk)) if packed is not None else ()
    if dequant:
        sets.append(CandidateSet("DequantGemvPolicy", func, dequant))
    return sets, bool(fused), bool(dequant)


def _tensor_core_sets(func, arch: CUDA, topk: int, match: TensorCoreMatch | None,
                      prefill_packed) -> list[CandidateSet]:
    """The tensor-core policy's set, and for packed weights with prefill rows (``prefill_packed``:
    :func:`match_weight_only` of ``func`` where the dequantizing GEMV did not take it) on sm_90a
    the dequantizing wgmma template's tiles, measured beside it (ranked first)."""
    match = match if match is not None else match_tensor_core(func, arch)
    hopper = tuple(dequant_wgmma_configs(prefill_packed, arch, topk)) if prefill_packed is not None else ()
    configs = tuple(TensorCorePolicy(match.func, arch, match.tags).emit_config(topk)) if match.eligible else ()
    if hopper and configs and match_weight_only(match.func) is not None:
        return [ranked_last(CandidateSet("TensorCorePolicy", match.func, hopper), configs)]
    sets = [CandidateSet("TensorCorePolicy", func, hopper)] if hopper else []
    return sets + ([CandidateSet("TensorCorePolicy", match.func, configs)] if configs else [])


def _default_set(func, arch: CUDA, topk: int, memory_bound_topk: int | None, covered: bool,
                 alone: bool) -> list[CandidateSet]:
    """The CUDA-core default policy's set; none where it does not take ``func`` and something
    else is measured (``covered``; a warning where stock Dlight is all, ``alone``)."""
    try:
        return [CandidateSet("DefaultPolicy", func, default_configs(func, arch, topk, memory_bound_topk))]
    except ValueError as e:
        if not covered:
            raise
        if alone:
            warnings.warn(f"fastdlight: no fastdlight template covers this function ({e}); "
                          "measuring stock Dlight only", stacklevel=4)
        return []


def _with_measured_beside(func, sets: list[CandidateSet], stock: tuple[Config, ...], stock_last: bool,
                          recorded: tuple[Config, ...]) -> list[CandidateSet]:
    """``sets`` with MetaSchedule's records and stock Dlight's configs ranked after the first
    set's (or sets of their own: none before them, or stock last)."""
    sets = list(sets)
    if recorded:
        if sets:
            sets[0] = ranked_last(sets[0], recorded)
        else:
            sets.append(CandidateSet("MetaSchedule records", func, recorded))
    if stock:
        if sets and not stock_last:
            sets[0] = ranked_last(sets[0], stock)
        else:
            sets.append(CandidateSet("stock Dlight", func, stock))
    return sets


def ranked_last(cand: CandidateSet, extra: tuple[Config, ...]) -> CandidateSet:
    """``cand`` with ``extra`` appended, ranked after its own configs (their costs are another
    model's, or none: unmeasured, they come last)."""
    top = max((c.cost for c in cand.configs), default=0.0)
    ranked = tuple(dataclasses.replace(c, cost=top + 1 + i) for i, c in enumerate(extra))
    return dataclasses.replace(cand, configs=cand.configs + ranked)


#: transpose configs (:mod:`..policies.transpose`) among a layout change's ``topk`` candidates
TRANSPOSE_CONFIGS = 6
#: gather configs (:mod:`..policies.gather`) among a gather's ``topk`` candidates
GATHER_CONFIGS = 4


#: functions whose speed is their memory traffic, where the policy's first config is as good as
#: the best of many (:func:`default_configs`)
MEMORY_BOUND_KINDS = ("elementwise", "reduction", "general_reduction")


def default_configs(func, arch: CUDA, topk: int, memory_bound_topk: int | None = None) -> tuple[Config, ...]:
    """The CUDA-core policy's configs. An elementwise function or a reduction gets at most
    ``memory_bound_topk``: for those the policy's first config timed within 3% of the best of 20
    on every memory-bound operator of bench_ops (copy, add, sum, max, softmax; H100, 2026-11-23),
    and the winner of each such function of GPT-2 and LLaMA tuned alone was its first (H200,
    2026-11-29). A model is mostly such functions: their builds are most of its tuning time."""
    policy = DefaultPolicy(func, arch)
    if memory_bound_topk is not None and policy.info.kind in MEMORY_BOUND_KINDS:
        topk = min(topk, memory_bound_topk)
    configs = tuple(policy.emit_config(topk))
    # unmeasured, these rank first: on a layout change the elementwise kernels gather and move a
    # fraction of the bandwidth (the transpose template stages tiles), and on a gather the
    # planner's thread tiles pay the index arithmetic per element
    first = (tuple(transpose_configs(policy.info, arch, min(TRANSPOSE_CONFIGS, topk)))
             or tuple(gather_configs(policy.info, arch, min(GATHER_CONFIGS, topk))))
    if first:
        return first + configs[:max(1, topk - len(first))]
    alternatives = ()
    if policy.info.kind == "gemv":
        alternatives = other_family(func, arch, "matmul", max(1, topk // 4))
    elif is_column_sum(policy.info):
        sums = other_family(func, arch, "reduction", max(1, topk // 2))
        if sums:  # the column sums first; a few of the matmul planner's tiles compete last
            configs, alternatives = sums, configs[:max(1, topk // 8)]
    elif policy.info.kind == "matmul" and is_decode_matmul(policy.info):
        alternatives = other_family(func, arch, "reduction", max(1, topk // 4))
    if configs and alternatives:
        # predicted costs of two planners do not compare: unmeasured, the alternatives rank last
        top = max(c.cost for c in configs)
        configs += tuple(dataclasses.replace(c, cost=top + c.cost) for c in alternatives)
    return configs


#: a matmul with at most this many output rows (the product of its outer spatial extents) is a
#: decode step's projection (``relax.decode`` reads its bound weight [N, K]; one still read
#: [K, N] gets column-sum configs)
DECODE_ROWS = 16


def is_decode_matmul(info) -> bool:
    return math.prod(a.extent for a in info.spatial_axes[:-1]) <= DECODE_ROWS


#: a decode matmul whose weight is read [K, N] and whose K is at least this long is a column sum
#: first: in the zoo's batch-1 CNNs (squeeze-and-excitation FCs, RegNet; H200, 2026-11-29), of 37
#: such functions the matmul planner's tiles (one block of a few threads walking all of K) won 6,
#: all with K <= 16, where a thread's walk is short, and none of the 23 with K >= 72, where their
#: best was 2-8x behind stock Dlight's schedule; the reduction template's column sums won 4 and
#: stock 27.
COLUMN_SUM_MIN_K = 64


def is_column_sum(info) -> bool:
    """A decode matmul (:data:`DECODE_ROWS`) with K of at least :data:`COLUMN_SUM_MIN_K` whose
    weight (a parameter indexed by N and K) is contiguous along N. (A packed weight dequantized
    in the kernel, contiguous along K, is not one.)"""
    if info.kind != "matmul" or not is_decode_matmul(info) or len(info.reduce_iters) != 1:
        return False
    if math.prod(a.extent for a in info.reduce_axes) < COLUMN_SUM_MIN_K:
        return False
    n, k = info.spatial_iters[-1], info.reduce_iters[0]
    return any(r.is_param and r.depends_on(k) and r.innermost_axis() == n for r in info.reads)


def other_family(func, arch: CUDA, family: str, n: int) -> tuple[Config, ...]:
    """A few configs of another template's planner, to compete by measurement: a GEMV is also a
    matmul, and a decode matmul reading a [K, N] weight is a column sum, which the reduction
    template's outer layout streams along N with K split over threads. (The matmul planner's
    first config gives a 1x11008x4096 step 43 thread blocks; decode GEMVs with a [K, N] weight
    ran 8-50x slower than stock Dlight in the coverage survey, H100.) None when the planner
    finds nothing to fit."""
    try:
        return tuple(DefaultPolicy(func, arch, family=family).emit_config(n))
    except ValueError:
        return ()
