"""Hopper tensor-core matmul template: warp-specialized wgmma fed by TMA (sm_90a).

For a ``matmul_wgmma`` config (block (bm, bn), warp (wm, bn), rstep (64,), stages,
rasterization = group of M tiles) the function ``D = epilogue(A @ B)`` becomes one TIRx kernel
(``wgmma_kernel.tvmscript``, built with ``tir_pipeline="tirx"``):

* a persistent grid of one CTA per SM walks the output tiles (batch, then groups of
  ``rasterization`` M-tiles so concurrently running CTAs share B tiles in L2);
* warpgroup 0 is the producer: one thread issues TMA loads of the A and B tiles into a
  ``stages``-deep ring of 128-byte-swizzled shared-memory stages (full/empty mbarriers);
* two (or three) consumer warpgroups issue ``wgmma.m64n{bn}k16`` (fp32 accumulation) straight
  from shared memory, ``wm / 64`` slices of 64 rows each; registers are moved from the producer
  to them with ``setmaxnreg``. Cooperative (``bm = 2 wm``, or ``3 wm`` with 64-row slices): they
  split every tile. Ping-pong (``bm = wm``): two take alternate tiles, so one's epilogue
  overlaps the other's main loop;
* epilogue: the elementwise blocks that follow the matmul in the function (cast, bias,
  activation, multiply by another tensor...) are evaluated on the accumulators, staged through
  swizzled shared memory and written by TMA stores that overlap the next tile's main loop.
  Where the function pairs accumulator columns (gate and up projections interleaved into one
  GEMM, ``WgmmaMatch.pair``) each output chunk is made of two accumulator chunks;
* deferred epilogue (cooperative tiles whose epilogue reads nothing but scalars, 16-bit
  outputs): the evaluated outputs are packed into registers when a tile's main loop ends, and
  each K step of the next tile stores one chunk of them (staging, TMA store) after issuing
  its wgmma group, so the tensor cores are not idle while the warpgroups stage the chunks;
  the last tile's are stored after the loop;
* ``cluster = 2``: two CTAs of a thread-block cluster take vertically adjacent tiles; each
  loads half of the B tile they share and multicasts it to both, and a stage goes back to the
  producers once the consumers of both CTAs released it (remote mbarrier arrives).

Operands may be K-major (``A[M, K]``, ``B[N, K]``) or MN-major (``A[K, M]``, ``B[K, N]``: the
transpose bit of wgmma, the tile loaded as 64-wide column chunks), with one batch axis or none
(a 3-D tensor map; an operand without it is shared by every batch). TMA zero-fills loads past
the edges and clips stores, so any M, N and K work as long as every row is 16-byte aligned
(fp16/bf16: the innermost extent a multiple of 8), which :func:`match_wgmma` checks.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re

import tvm
from tvm import tirx

from fastdlight.arch import CUDA
from fastdlight.analysis.prepare import scalar_dtype, shape_var_names
from fastdlight.config import Config
from fastdlight.policies.wgmma import (
    SM90_SMEM_OPTIN,
    consumer_warpgroups,
    max_acc_regs,
)
from fastdlight.analysis.wgmma_match import WgmmaMatch, distinct_param_names, match_wgmma
from fastdlight.schedules.base import ScheduleTemplate, as_tirx_kernel
from fastdlight.schedules.wgmma.epilogue import extract_epilogue
from fastdlight.schedules.wgmma.plan import Plan
from fastdlight.schedules.wgmma.tma import SWIZZLE_128B, SWIZZLE_BYTES, operands

KERNEL_SOURCE = pathlib.Path(__file__).with_name("kernel.tvmscript")
#: registers a consumer thread keeps for addresses, descriptors and the epilogue's temporaries
#: beside its accumulators and held outputs, where the epilogue is deferred
DEFER_SPARE_REGS = 40
def config_fits(match: WgmmaMatch, config: Config) -> bool:
    """Structural legality: warp tile (64 | 128 rows, bn) per consumer warpgroup, block tile of
    one (ping-pong), two or (64-row warp tiles, no convolution) three (cooperative) warp tiles,
    K step = one 128-byte swizzled row."""
    if config.kind != "matmul_wgmma":
        return False
    (bm, bn), (wm, wn), (bk,) = config.block, config.warp, config.rstep
    chunk = SWIZZLE_BYTES // match.in_bytes
    three = wm == 64 and bm == 3 * wm and match.conv is None
    return (
        wm in (64, 128) and (bm in (wm, 2 * wm) or three) and wn == bn and bk == chunk and 16 <= bn <= 256
        and (wm // 64) * bn // 2 <= max_acc_regs(consumer_warpgroups(bm, wm)) and bn % match.bn_multiple == 0
        and (match.b_k_major or bn % chunk == 0) and config.pipeline_stages >= 2
        and match.cluster_fits(bm, bn, config.cluster, config.cluster_axis) and match.views_fit(bm, bn)
    )  # fmt: skip


class WgmmaMatmulTemplate(ScheduleTemplate):
    kinds = ("matmul_wgmma",)
    name = "matmul_wgmma"
    sources = (KERNEL_SOURCE, *(pathlib.Path(__file__).with_name(f"{name}.py") for name in ("epilogue", "plan", "tma")))  # part of the template's identity in the tuning database

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        func = distinct_param_names(func)  # once: match_wgmma and build_kernel then find the names unique
        match, _reason = match_wgmma(func)
        if match is None or not config_fits(match, config):
            return None
        target = tvm.target.Target.current(allow_none=True)
        arch = CUDA(target) if target is not None else None
        plan = Plan(match, config.block[0], config.block[1], config.rstep[0], config.pipeline_stages,
                    config.rasterization, arch.sm_count if arch else 132, config.warp[0], config.cluster,
                    config.cluster_axis, arch.smem_per_block_optin if arch else SM90_SMEM_OPTIN)
        return build_kernel(func, plan)


def symbolic_kernel(symbolic: tirx.PrimFunc, static: tirx.PrimFunc, config: Config, num_sms: int):
    """The kernel ``config`` gives ``static`` (``symbolic`` at one row count), for every row
    count: ``symbolic`` with a TIRx body whose tile counts are expressions of its M (TMA clips
    the edge tiles; the grid is one CTA per SM). None unless the output's rows are ``symbolic``'s
    only symbolic dimension. A cluster config gives its single-CTA tile: clusters over a
    symbolic number of tile rows are not tested on a GPU."""
    symbolic, static = distinct_param_names(symbolic), distinct_param_names(static)
    match, _reason = match_wgmma(static)
    if match is None or not match.tma_store or not config_fits(match, config):
        return None
    out = next((p for p in symbolic.params if str(p.name) == match.d_name), None)
    rows = out.shape[-2] if out is not None and len(out.shape) >= 2 else None
    if not isinstance(rows, tvm.ir.expr.Var) or shape_var_names(symbolic) != [str(rows.name)]:
        return None
    m = rows if scalar_dtype(rows) == "int32" else tirx.Cast("int32", rows)
    plan = Plan(dataclasses.replace(match, m=m), config.block[0], config.block[1], config.rstep[0],
                config.pipeline_stages, config.rasterization, num_sms, config.warp[0])
    kernel = build_kernel(static, plan, bind=symbolic)
    return symbolic.with_body(kernel.body).with_attrs(dict(kernel.attrs))


def build_kernel(func: tirx.PrimFunc, plan: Plan, bind: tirx.PrimFunc | None = None) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` under ``plan``: same parameters, same result. ``bind``: a
    function whose parameters (by name) the kernel uses instead of its own (it then has none)."""
    register_codegen_fixes()
    func = distinct_param_names(func)
    epilogue = extract_epilogue(func, plan.match)
    a, b, d = operands(plan.match, plan.bm, plan.bn, plan.bk, plan.cluster, plan.cluster_axis)
    plan = dataclasses.replace(plan, deferred=defers_epilogue(plan, epilogue, d))
    out = next(p for p in func.params if str(p.name) == plan.match.d_name)
    params = "" if bind is not None else ", ".join(
        f'{p.name}: T.Buffer({tuple(int(x) for x in p.shape)}, "{p.dtype}")' for p in func.params)
    text = (_kernel_text()
            .replace("{NAME}", "wgmma_gemm").replace("{PARAMS}", params)
            .replace("{D_MAP}", _lines("{D_MAP}", d.host(plan.match.d_name)))
            .replace("{D_PREFETCH}", _lines("{D_PREFETCH}", d.prefetch()))
            .replace("{MMA_FLAGS}", plan.mma_flags)
            .replace("{A}", plan.match.a_name).replace("{B}", plan.match.b_name).replace("{D}", plan.match.d_name)
            .replace("{RANK}", "k_rank = T.cta_id_in_cluster([K_PLAN.cluster])" if plan.cluster > 1 else "k_rank = T.meta_var(0)")
            .replace("{RELEASE_PREVIOUS}", _release("(k_g + K_PLAN.stages - 1) % K_PLAN.stages", plan.cluster,
                                                    _indent("{RELEASE_PREVIOUS}")))
            .replace("{RELEASE_LAST}", _release("(k_it * K_PLAN.k_steps + K_PLAN.k_steps - 1) % K_PLAN.stages",
                                                plan.cluster, _indent("{RELEASE_LAST}")))
            .replace("{REGISTERS}", epilogue.registers(plan, _indent("{REGISTERS}")))
            .replace("{PREFETCH}", epilogue.prefetch(plan, _indent("{PREFETCH}")))
            .replace("{HOLD}", epilogue.stores(plan, _indent("{HOLD}")).replace("k_Cs[k_cw, k_buf, k_at]", HELD_PAIR)))
    store_chunk = d.store_chunk(plan.match.d_name, tuple(int(x) for x in out.shape), plan.match.m, plan.match.out_n,
                                plan.match.out_dtype)
    staged_pair = ["k_reg = T.meta_var(K_PLAN.acc_reg(k_mi, k_c, k_j, k_h))", *epilogue.stores(plan, "").split("\n")]
    text = text.replace("{STAGE_CHUNK}", _stage_chunk(staged_pair, epilogue.prefetch_next(plan, "").split("\n"),
                                                      store_chunk, _indent("{STAGE_CHUNK}")))
    text = _each("{STORE_HELD}", text, lambda indent: _store_held(store_chunk, indent))
    from tvm.script import tirx as T

    env = {"T": T, "K_PLAN": plan, "K_A": a, "K_B": b, "K_D": d, "K_IN_DTYPE": plan.match.in_dtype,
           "K_OUT_DTYPE": plan.match.out_dtype, "K_SWIZZLE_128B": SWIZZLE_128B,
           "len": len, "range": range}
    if bind is not None:
        env.update({str(p.name): p for p in bind.params})
    kernel = tvm.script.from_source(text, extra_vars=env, check_well_formed=bind is None)
    return as_tirx_kernel(kernel, func)


#: the held register of the thread's pair (k_j, k_h) of chunk (k_mi, k_c)
HELD_PAIR = "k_held[K_PLAN.held_reg(k_mi, k_c, k_j, k_h)]"


def defers_epilogue(plan: Plan, epilogue, d) -> bool:
    """Whether ``plan``'s epilogue can be deferred into the next tile's main loop: cooperative
    (a ping-pong warpgroup's epilogue already runs under the other's main loop), 16-bit
    outputs stored by TMA, no reads but scalars (prefetch rings are tied to the current tile),
    a chunk for each of the first K steps, and the held pairs fitting beside the accumulators."""
    return (not plan.pingpong and d.tma and plan.match.out_bytes == 2 and all(r.scalar for r in epilogue.reads)
            and plan.held_chunks <= plan.k_steps
            and plan.acc_regs + plan.held_pairs + DEFER_SPARE_REGS <= plan.consumer_regs)


def _stage_chunk(pair: list[str], after: list[str], store: list[str], indent: str) -> str:
    """Statements staging chunk ``k_mi, k_c`` of a tile in buffer ``k_buf`` and storing it:
    once the store that last read the buffer has read it, each thread writes its pairs
    (``pair``: statements writing the pair ``k_j, k_h`` to word ``k_at``), then ``after``, then
    the warpgroup hands the chunk to ``store`` (a TMA store, or its own element stores)."""
    lines = ["if k_ltid == 0:",
             '    T.ptx["cp.async.bulk.wait_group.read"](K_PLAN.out_buffers - 1)',
             'T.ptx.bar.sync(T.Cast("uint32", 1 + k_cw), T.uint32(128))',
             "for k_j in T.unroll(K_PLAN.chunk_cols // 8):",
             "    for k_h in T.unroll(2):",
             "        k_row = T.meta_var(k_r0 + 8 * k_h)",
             "        k_col = T.meta_var(k_j * 8 + (k_lane % 4) * 2)",
             "        k_at = T.meta_var(k_row * 32 + K_PLAN.swizzled_word(k_row, k_col))",
             *("        " + line for line in pair),
             *after,
             "T.ptx.fence.proxy.async_.shared__cta()",
             'T.ptx.bar.sync(T.Cast("uint32", 1 + k_cw), T.uint32(128))',
             *store]
    return ("\n" + indent).join(lines)


def _store_held(store_chunk: list[str], indent: str) -> str:
    """Statements storing chunk ``k_q`` of the held tile (``k_prev``: its coordinates and
    sequence number, as ``k_pb, k_pm, k_pn, k_pi``), in the staging buffers' alternation of the
    plain epilogue's chunks."""
    held_tile = [re.sub(r"\bk_([bmn])\b", r"k_p\1", line) for line in store_chunk]
    heads = ["k_mi = T.meta_var(k_q // K_PLAN.out_chunks)",
             "k_c = T.meta_var(k_q % K_PLAN.out_chunks)",
             "k_buf = T.meta_var((k_pi * K_PLAN.held_chunks + k_q) % K_PLAN.out_buffers)"]
    return ("\n" + indent).join(heads) + "\n" + indent + _stage_chunk(
        [f"k_Cs[k_cw, k_buf, k_at] = {HELD_PAIR}"], [], held_tile, indent)


def _each(placeholder: str, text: str, make) -> str:
    """``text`` with every ``placeholder`` replaced by ``make(its indentation)``."""
    return re.sub(rf"\n( *){re.escape(placeholder)}", lambda m: "\n" + m.group(1) + make(m.group(1)), text)


def _release(stage: str, cluster: int, indent: str) -> str:
    """Statements by which consumer thread ``k_ltid`` (< ``cluster``) hands ``stage`` back to
    the producer: its own CTA's, or CTA ``k_ltid``'s of the cluster (mapped address)."""
    if cluster == 1:
        return f"T.ptx.mbarrier.arrive.shared.b64(k_empty.ptr_to([{stage}]), T.uint32(1))"
    lines = [f"T.ptx.mapa.shared__cluster.u32(k_remote[0], T.cuda.cvta_generic_to_shared(k_empty.ptr_to([{stage}])), "
             "T.Cast(\"uint32\", k_ltid))",
             "T.ptx.mbarrier.arrive.shared__cluster.b64(k_remote[0], T.uint32(1))"]
    return ("\n" + indent).join(lines)


@functools.cache
def _kernel_text() -> str:
    return KERNEL_SOURCE.read_text()


def _lines(placeholder: str, lines: list[str]) -> str:
    """``lines`` as the text that replaces ``placeholder``, each at its indentation."""
    return ("\n" + _indent(placeholder)).join(lines)


def _indent(placeholder: str) -> str:
    return re.search(rf"\n( *){re.escape(placeholder)}", _kernel_text()).group(1)


@functools.cache
def register_codegen_fixes() -> None:
    """TVM 0.27's CUDA codegen of ``T.cuda.wgmma.noop_barrier`` reads ``.dtype`` of a
    ``TensorLoad``, which 0.27's loads no longer have (they carry ``.ty``): re-register it."""
    from tvm.backend.cuda.codegen.registry import CODEGEN_REGISTRY, register_codegen
    from tvm.backend.cuda.codegen.types import PTXDataType

    @register_codegen("cuda_wgmma_noop_barrier")
    def _noop_barrier(reg):
        dtype = getattr(reg, "dtype", None) or str(reg.ty)
        dtype = str(dtype).split("(")[-1].rstrip(")").strip('"')
        kind = PTXDataType.from_string(dtype)
        if kind == PTXDataType.UINT32:
            op = "tirx.cuda_wgmma_noop_barrier_uint32"
        elif kind == PTXDataType.FLOAT32:
            op = "tirx.cuda_wgmma_noop_barrier_float32"
        else:
            raise ValueError(f"noop_barrier supports uint32/float32 registers, got {dtype}")
        result = CODEGEN_REGISTRY[op]([reg])
        return result[0] if isinstance(result, tuple) else result
