"""Fused attention on Hopper: one TIRx kernel (``kernel.tvmscript``, built with the TIRx
pipeline) for an :func:`~fastdlight.analysis.attention.attention_func`.

The grid walks the query tiles (``bm`` rows of one batch and head), a few heads' at a time so
that their K/V stays in L2 (``AttentionPlan.head_block``), heaviest (causal) first within them:
a CTA per tile, or, for a persistent config, a CTA per SM taking tiles ``b, b + SMs, ...`` (on the
H200 the persistent grid ran GPT-2's B8 H12 T1024 d64 causal 18% faster, the d128 shapes 2-9%
slower: the tuner times both). In each CTA:

* warpgroup 0 is the producer: one thread loads each tile's Q (once the consumers are done
  with the previous one) and streams ``bn``-key tiles of
  K and V through a ``stages``-deep ring of 128-byte-swizzled shared memory (TMA, mbarriers;
  K and V complete on barriers of their own, so scores start before V lands, and go back to
  the producer apart: a stage's K once the scores that read it are in, its V once P·V is done,
  so the next K loads a step earlier);
* each consumer warpgroup owns 64 query rows: scores ``S = Q Kᵀ`` with ``wgmma m64n{bn}k16``
  from shared memory, an online softmax on the accumulators in registers (exp2 with the scale
  folded in, row statistics shared over the 4 threads of a row by shuffles), then
  ``O += P V`` with P straight from registers (the score accumulator's layout is wgmma's
  A-fragment layout) and V read MN-major. Keys past the end or past the causal diagonal count
  as minus infinity; causal tiles past a query tile's diagonal are never loaded;
* two or more consumers take turns issuing their GEMMs (a named barrier each: pingpong), so
  one's softmax runs while the tensor cores work on the other's;
* O is divided by the row sums at the end and leaves through shared memory, each consumer's 64
  rows TMA-stored while the next tile starts (rows past the end clipped), where its tile fits
  beside Q and the ring (``AttentionPlan.stage_o``); else from registers, two adjacent columns a
  32-bit store (one fp16 a store cost GPT-2's shape 18%), rows past the end not stored.

TMA zero-fills past the sequence ends, so any TQ and TKV work, and past D: a head dim short of
whole 64-column chunks (40, 80, 96) is loaded and computed as the padded one (the scores over D in
16s, P·V over the chunks), O's columns past D not stored. GQA reads K/V head
``h // group`` (its tiles come from L2 for the group's other heads).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re

import tvm
from tvm import tirx
from tvm.script import tirx as T

from fastdlight.analysis.attention import match_attention, fused_head_dim
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.policies.wgmma import SM90_SMEM_OPTIN
from fastdlight.schedules.attention.plan import AttentionPlan
from fastdlight.schedules.base import ScheduleTemplate, as_tirx_kernel
from fastdlight.schedules.wgmma.template import register_codegen_fixes
from fastdlight.schedules.wgmma.tma import L2_PROMO_256B, SWIZZLE_128B

KERNEL_SOURCE = pathlib.Path(__file__).with_name("kernel.tvmscript")


def plan_for(func: tirx.PrimFunc, config: Config, num_sms: int = 132,
             smem_bytes: int = SM90_SMEM_OPTIN) -> AttentionPlan | None:
    """The plan of ``config`` for ``func`` on a GPU of ``num_sms`` SMs (a persistent config's
    grid) and ``smem_bytes`` of shared memory a CTA (whether O's tile fits beside the ring), or
    None where the template does not take them."""
    shape = match_attention(func)
    if (shape is None or config.kind != "attention_wgmma" or shape.dtype not in ("float16", "bfloat16")
            or not fused_head_dim(shape.head_dim)):
        return None
    (bm, bn) = config.block
    try:
        # two or more consumers take turns at the tensor cores (H200, 2026-11-30: 0-7% faster at
        # every shape and tile timed, never slower beyond noise)
        plan = AttentionPlan(shape, bm, bn, config.pipeline_stages, num_sms if config.persistent else None,
                             pingpong=bm >= 128, stage_o=True, sms=num_sms)
    except ValueError:
        return None
    return plan if plan.smem_bytes() <= smem_bytes else dataclasses.replace(plan, stage_o=False)


class AttentionTemplate(ScheduleTemplate):
    kinds = ("attention_wgmma",)
    name = "attention_wgmma"
    sources = (KERNEL_SOURCE, pathlib.Path(__file__).with_name("plan.py"))

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        target = tvm.target.Target.current(allow_none=True)
        arch = CUDA(target) if target is not None else None
        plan = plan_for(func, config, *((arch.sm_count, arch.smem_per_block_optin) if arch else ()))
        return None if plan is None else build_kernel(func, plan)


def pack_text(dtype: str, low: str, high: str) -> str:
    """TVMScript of a 32-bit word holding fp32 values ``low`` and ``high`` as two ``dtype``s."""
    def half(value: str) -> str:
        return f'T.Cast("uint32", T.reinterpret("uint16", T.Cast("{dtype}", {value})))'
    return f"T.bitwise_or(T.shift_left({half(high)}, T.uint32(16)), {half(low)})"


def row_half(s_regs: int, at: str = "") -> list[str]:
    """TVMScript of the scores of row half ``h`` in a thread's ``s_regs`` accumulators (wgmma's
    and mma.sync's layout: registers 4i + 2h and 4i + 2h + 1), from offset ``at`` on."""
    return [f"k_s[{at}{4 * i + j} + h * 2]" for i in range(s_regs // 4) for j in (0, 1)]


def tree_text(combine: str, leaves: list[str]) -> str:
    """One expression combining ``leaves`` pairwise, level by level (``combine``: a format of
    two operands), so that its depth is log2 of their count."""
    while len(leaves) > 1:
        pairs = [combine.format(a, b) for a, b in zip(leaves[::2], leaves[1::2])]
        leaves = pairs + ([leaves[-1]] if len(leaves) % 2 else [])
    return leaves[0]


def build_kernel(func: tirx.PrimFunc, plan: AttentionPlan) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` under ``plan``: same parameters, same result."""
    register_codegen_fixes()
    q, k, v = plan.operands()
    env = {"K_QOP": q, "K_KOP": k, "K_VOP": v, "K_SWIZZLE_128B": SWIZZLE_128B, "K_L2_256B": L2_PROMO_256B}
    return script_kernel(func, plan, KERNEL_SOURCE, "attention_wgmma", env)


def script_kernel(func: tirx.PrimFunc, plan, source: pathlib.Path, name: str, env: dict,
                  at: str = "") -> tirx.PrimFunc:
    """The kernel of ``source`` for ``func`` under ``plan`` (its ``shape`` and ``s_regs``): the
    function's parameters and names, the packing and row-statistics text placed, parsed with
    ``env`` beside ``T``, ``P`` (the plan) and the dtype names. ``at``: an offset (text, e.g.
    ``"mt * "``) before which each register array's current slice starts: the scores at ``at
    P.s_regs``, O at ``at P.o_regs``, P at ``at P.p_regs`` and the row statistics at ``at 4``."""
    names = [str(p.name) for p in func.params]
    inputs = names[:-1] * 3 if len(names) == 2 else names[:-1]  # a packed QKV tensor is all three
    params = ", ".join(f'{p.name}: T.Buffer({tuple(int(x) for x in p.shape)}, "{p.dtype}")' for p in func.params)
    dtype = plan.shape.dtype
    s, o, t = (f"{at}{n} + " if at else "" for n in ("P.s_regs", "P.o_regs", "4"))
    text = (kernel_text(source).replace("{NAME}", name).replace("{PARAMS}", params)
            .replace("{Q}", inputs[0]).replace("{K}", inputs[1]).replace("{V}", inputs[2]).replace("{O}", names[-1])
            .replace("{PACK_P}", pack_text(dtype, f"k_s[{s}2 * i]", f"k_s[{s}2 * i + 1]"))
            .replace("{PACK_O}", pack_text(dtype, f"k_o[{o}2 * i] * k_t[{t}i % 2]",
                                           f"k_o[{o}2 * i + 1] * k_t[{t}i % 2]"))
            .replace("{MAX_TREE}", tree_text("T.max({}, {})", row_half(plan.s_regs, s)))
            .replace("{SUM_TREE}", tree_text("({} + {})", row_half(plan.s_regs, s))))
    env = {"T": T, "P": plan, "K_DTYPE": dtype, "K_PAIR": f"{dtype}x2", "range": range, **env}
    kernel = tvm.script.from_source(text, extra_vars=env)
    return as_tirx_kernel(kernel, func)


@functools.cache
def kernel_text(source: pathlib.Path) -> str:
    """The kernel of ``source`` with its blocks placed: ``{NAME: tile}`` at an indentation
    becomes block ``NAME`` (a ``#@block NAME`` .. ``#@end`` section of the source) with ``{t}`` =
    ``tile``."""
    text, _, rest = source.read_text().partition("\n# --- blocks")
    blocks = dict(re.findall(r"#@block (\w+)\n(.*?)#@end", rest, flags=re.S))

    def place(m: re.Match) -> str:
        indent, name, tile = m.group(1), m.group(2), (m.group(3) or "").strip()
        lines = blocks[name].rstrip("\n").split("\n")
        return "\n".join(indent + line.replace("{t}", tile) if line else "" for line in lines)

    return re.sub(r"^( *)\{([A-Z_]+)(?::([^}]*))?\}$", place, text, flags=re.M)
