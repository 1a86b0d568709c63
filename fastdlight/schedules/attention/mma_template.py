"""Fused attention with ``mma.sync`` (FlashAttention-2's form): one TIRx kernel
(``mma_kernel.tvmscript``) for an :func:`~fastdlight.analysis.attention.attention_func` on any
GPU from sm_80 (A100, L4, RTX 30/40), and a measured alternative to the wgmma template on Hopper.

A CTA computes ``bm`` query rows of one (batch, head), a warp each 16 of them:

* every thread copies 16-byte chunks of Q and of each ``bn``-key tile of K and V into shared
  memory with ``cp.async`` (a ``stages``-deep ring, a commit group a tile; rows past the
  sequence ends zero-filled), each row's chunks XOR-swizzled by the row so that ``ldmatrix``
  reads 8 rows from 8 different banks;
* a warp holds its 16 rows of Q as A fragments for the whole tile, and for each key tile computes
  ``S = Q Kᵀ`` with ``mma.sync m16n8k16`` (K's rows are B's columns: ``ldmatrix``), the online
  softmax on the accumulators (exp2 with the scale folded in, row statistics over the 4 threads
  of a row by shuffles, keys past the end or the causal diagonal minus infinity), and
  ``O += P V`` with P straight from registers (the accumulator layout is the A layout) and V's
  rows as B's (``ldmatrix .trans``);
* O is divided by the row sums and stored from registers, two adjacent columns a 32-bit store.

Causal tiles past a query tile's diagonal are never loaded; GQA reads K/V head ``h // group``.
The CTAs take the query tiles in the wgmma template's order (a head's tiles together, causal
ones in blocks of heads that fill the SMs, heaviest first), so the K/V a wave streams stays in L2.
"""

from __future__ import annotations

import pathlib

import tvm
from tvm import tirx

from fastdlight.analysis.attention import match_attention
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.schedules.attention.mma_plan import MmaAttentionPlan
from fastdlight.schedules.attention.template import script_kernel
from fastdlight.schedules.base import ScheduleTemplate

KERNEL_SOURCE = pathlib.Path(__file__).with_name("mma_kernel.tvmscript")
#: the smallest SM version with mma.sync m16n8k16 in fp16 and bf16, ldmatrix and cp.async
MIN_SM = 80


def mma_plan_for(func: tirx.PrimFunc, config: Config, smem_bytes: int | None = None,
                 sms: int = 132) -> MmaAttentionPlan | None:
    """The plan of ``config`` for ``func`` on a GPU of ``sms`` SMs, or None where the kernel does
    not take them (or its shared memory is more than ``smem_bytes``)."""
    shape = match_attention(func)
    if shape is None or config.kind != "attention_mma" or config.persistent:
        return None
    try:
        plan = MmaAttentionPlan(shape, *config.block, config.pipeline_stages, *(config.warp or (16,)), sms)
    except ValueError:
        return None
    return None if smem_bytes is not None and plan.smem_bytes() > smem_bytes else plan


class MmaAttentionTemplate(ScheduleTemplate):
    kinds = ("attention_mma",)
    name = "attention_mma"
    # part of the template's identity in the tuning database: its kernel, its plan and what it
    # shares with the wgmma template (the plans' base class, the kernel text's assembly)
    sources = (KERNEL_SOURCE, *(pathlib.Path(__file__).with_name(f"{name}.py")
                                for name in ("mma_plan", "plan", "template")))

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        target = tvm.target.Target.current(allow_none=True)
        arch = CUDA(target) if target is not None else None
        if arch is not None and 10 * arch.compute_capability[0] + arch.compute_capability[1] < MIN_SM:
            return None
        plan = mma_plan_for(func, config, *((arch.smem_per_block_optin, arch.sm_count) if arch is not None else ()))
        return None if plan is None else script_kernel(func, plan, KERNEL_SOURCE, "attention_mma", {}, at="mt * ")
