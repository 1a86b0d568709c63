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
from dataclasses import dataclass

import tvm
from tvm import tirx

from ..arch import CUDA
from ..policies.config import Config
from ..policies.wgmma import (PRODUCER_REGS, SM90_SMEM_OPTIN, consumer_regs, consumer_warpgroups, max_acc_regs,
                               staging_buffers, staging_bytes)
from ..policies.wgmma_match import WgmmaMatch, distinct_param_names, match_wgmma
from ..policies.wgmma_conv import PATCH_W
from .base import ScheduleTemplate
from .wgmma_epilogue import extract_epilogue
from .wgmma_tma import ATOM_ROWS, SWIZZLE_128B, SWIZZLE_BYTES, operands

KERNEL_SOURCE = pathlib.Path(__file__).with_name("wgmma_kernel.tvmscript")
#: reuse of L2 between a worker's consecutive tiles (one wave of the grid after another): odd
#: tiles walk K backwards, so a wave starts on the K slices the wave before it loaded last,
#: still in L2; odd groups of ``group_m`` rows walk their columns right to left, so a group's
#: first wave meets the B columns the group before it loaded last. On an H100 (ncu, fp16 NN,
#: 128x256 tiles, group 16) DRAM reads fell from 148 to 122 MB on 4096^3 and from 1298 to
#: 1123 MB on 8192^3 (cuBLAS: 150 and 1347), and the 4096^3 kernels spent 1-2% less energy a
#: GEMM at the power limit, at the same speed. DRAM traffic costs energy there: the same
#: kernel loading one tile everywhere (145 MB less) spent 5% less and ran 6.5% faster
SNAKE_ORDER = True
ABBR = {"float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Plan:
    """The kernel's compile-time numbers for one (function, config). Consumer warpgroups, each
    computing ``wg_m`` rows (one or two wgmma m64 slices) by ``bn`` columns: cooperative when
    the tile is ``2 * wg_m`` or ``3 * wg_m`` rows (two or three of them split it), ping-pong when
    it is ``wg_m`` rows (two take alternate tiles)."""

    match: WgmmaMatch
    bm: int
    bn: int
    bk: int
    stages: int
    group_m: int
    num_sms: int
    wg_m: int = 64
    cluster: int = 1  # CTAs of a cluster, sharing B (along M) or A (along N; see ``Operand.split``)
    cluster_axis: str = "m"
    smem: int = SM90_SMEM_OPTIN  # the shared memory a block may opt in to

    producer_regs = PRODUCER_REGS

    @property
    def consumers(self) -> int:
        return consumer_warpgroups(self.bm, self.wg_m)

    @property
    def consumer_regs(self) -> int:
        return consumer_regs(self.consumers)

    @property
    def pingpong(self) -> bool:
        return self.bm == self.wg_m

    @property
    def m_per_wg(self) -> int:
        return self.wg_m // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def tile_step(self) -> int:
        return 2 if self.pingpong else 1

    def first_tile(self, cw):
        return cw if self.pingpong else 0

    @property
    def consumer_iters(self) -> int:
        return (self.tiles_per_worker + self.tile_step - 1) // self.tile_step

    @property
    def empty_arrivals(self) -> int:
        """Consumers that release each stage: the one whose tile it is, or both; in every CTA
        of the cluster (each one's producer also writes the others' stages)."""
        return (1 if self.pingpong else self.consumers) * self.cluster

    def row0(self, cw):
        """First tile row of consumer ``cw``."""
        return 0 if self.pingpong else cw * self.wg_m

    def row0_text(self) -> str:
        return "0" if self.pingpong else f"k_cw * {self.wg_m}"

    def a_offset(self, cw):
        """Element offset of consumer ``cw``'s first 64-row slice in an A stage (K-major rows of
        ``bk``, or MN-major 64-column chunks of ``bk`` rows: the same number); its further
        slices follow ``a_slice_units`` apart."""
        return self.row0(cw) * self.bk

    # M may be an expression (a symbolic row count, see symbolic_kernel): the tile counts then
    # are too, and the grid is one CTA per SM

    @property
    def grid_m(self) -> int:
        return self.match.m_tiles(self.bm)

    def out_coords(self, row: str, col: str) -> list[str]:
        """The output's indices of tile row ``row`` (text, within the tile) and column ``col``
        of the current tile (``k_b, k_m`` in scope), as TVMScript text."""
        geo = self.match.conv
        if geo is None:
            return ["k_b", f"(k_m * {self.bm} + {row})", col]
        per_image, tiles_q = geo.tiles_p(self.bm) * geo.tiles_q, geo.tiles_q
        return [f"(k_m // {per_image})",
                f"((k_m // {tiles_q}) % {geo.tiles_p(self.bm)} * {geo.patch_rows(self.bm)} + ({row}) // {PATCH_W})",
                f"(k_m % {tiles_q} * {PATCH_W} + ({row}) % {PATCH_W})", col]

    def in_bounds(self, coords: list[str], rows: bool = True) -> str:
        """Text of "the element at ``coords`` (from :meth:`out_coords`) is in the output"."""
        col = f"{coords[-1]} < {self.match.out_n}"
        if not rows:
            return col
        geo = self.match.conv
        if geo is None:
            return f"{coords[-2]} < {self.match.m} and {col}"
        return f"{coords[1]} < {geo.p} and {coords[2]} < {geo.q} and {col}"

    @property
    def grid_n(self) -> int:
        return -(-self.match.n // self.bn)

    def _along(self, axis: str) -> int:
        return self.cluster if self.cluster_axis == axis else 1

    @property
    def cluster_grid_m(self):
        """Clusters' rows of tiles: a cluster along M takes ``cluster`` vertically adjacent tiles."""
        return (self.grid_m + self._along("m") - 1) // self._along("m")

    @property
    def cluster_grid_n(self):
        """Clusters' columns of tiles: a cluster along N takes ``cluster`` horizontally adjacent ones."""
        return (self.grid_n + self._along("n") - 1) // self._along("n")

    @property
    def tiles(self) -> int:
        """Work items of the persistent loop: tiles, or clusters' groups of tiles."""
        return self.match.batch * self.cluster_grid_m * self.cluster_grid_n

    @property
    def workers(self) -> int:
        """Persistent workers: CTAs, or clusters of CTAs; one CTA per SM."""
        most = self.num_sms // self.cluster
        return min(most, self.tiles) if isinstance(self.tiles, int) else most

    @property
    def ctas(self) -> int:
        return self.workers * self.cluster

    @property
    def tiles_per_worker(self) -> int:
        return (self.tiles + self.workers - 1) // self.workers

    def cta_m(self, m, rank):
        """The M tile of the CTA of rank ``rank`` in a cluster whose group of tiles is ``m``."""
        return m * self.cluster + rank if self._along("m") > 1 else m

    def cta_n(self, n, rank):
        """The N tile of the CTA of rank ``rank`` in a cluster whose group of tiles is ``n``."""
        return n * self.cluster + rank if self._along("n") > 1 else n

    @property
    def k_steps(self) -> int:
        return -(-self.match.k // self.bk)

    @property
    def a_tile(self) -> int:
        return self.bm * self.bk

    @property
    def b_tile(self) -> int:
        return self.bn * self.bk

    @property
    def a_stage_units(self) -> int:
        """16-byte units from one A stage to the next (a wgmma descriptor's address step)."""
        return self.a_tile * self.match.in_bytes // 16

    @property
    def b_stage_units(self) -> int:
        return self.b_tile * self.match.in_bytes // 16

    @property
    def a_slice_units(self) -> int:
        """16-byte units from one 64-row slice of an A stage to the next (64 rows of ``bk``)."""
        return 64 * self.bk * self.match.in_bytes // 16

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * self.bk * self.match.in_bytes

    @property
    def slice_regs(self) -> int:
        """fp32 accumulator registers per thread of one m64nBN slice."""
        return self.bn // 2

    @property
    def acc_regs(self) -> int:
        return self.m_per_wg * self.slice_regs

    @property
    def chunk_cols(self) -> int:
        return SWIZZLE_BYTES // self.match.out_bytes

    @property
    def chunks(self) -> int:
        return self.bn // self.chunk_cols

    @property
    def out_bn(self) -> int:
        """Output columns of a tile: ``bn``, or half of it where the epilogue pairs chunks."""
        return self.bn // 2 if self.match.pair else self.bn

    @property
    def out_chunks(self) -> int:
        """Chunks of output a 64-row slice of a tile stores."""
        return self.out_bn // self.chunk_cols

    def acc_chunk(self, c):
        """The accumulator chunk output chunk ``c`` is made of (the first of its pair)."""
        return 2 * c if self.match.pair else c

    @property
    def pair_regs(self) -> int:
        """Accumulator registers from a value to its pair's (the next chunk's same place)."""
        return self.chunk_cols // 8 * 4

    @property
    def mma_per_step(self) -> int:
        return self.bk // 16

    @property
    def mma(self) -> str:
        ab = ABBR[self.match.in_dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.bn}k16.f32.{ab}.{ab}"

    @property
    def out_buffers(self) -> int:
        """Epilogue staging chunks per consumer warpgroup (see ``policies.wgmma.ring``)."""
        return staging_buffers(self.consumers, self.stages, self.stage_bytes, self.smem)

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + staging_bytes(self.consumers, self.out_buffers)

    def coords(self, tile):
        """(batch, M tile, N tile) of a linear tile index: batch outermost, then groups of
        ``group_m`` rows of work items walked column by column (the last group may be shorter;
        odd groups right to left, see ``SNAKE_ORDER``).
        A row is an M tile, or with a cluster along M a pair of them: such a group spans
        ``2 * group_m`` M tiles."""
        grid_m = self.cluster_grid_m
        per_batch = grid_m * self.cluster_grid_n
        b, t = tile // per_batch, tile % per_batch
        if self.group_m <= 1:
            return b, t % grid_m, t // grid_m
        group = self.group_m * self.cluster_grid_n
        first_m = (t // group) * self.group_m
        height = tirx.min(grid_m - first_m, self.group_m)
        n = (t % group) // height
        if SNAKE_ORDER:
            n = tirx.if_then_else((t // group) % 2 == 1, self.cluster_grid_n - 1 - n, n)
        return b, first_m + (t % group) % height, n

    def k_step(self, it, k):
        """The K step of a worker's ``k``-th load in its ``it``-th tile (see ``SNAKE_ORDER``)."""
        return tirx.if_then_else(it % 2 == 1, self.k_steps - 1 - k, k) if SNAKE_ORDER else k

    def swizzled_word(self, row, col):
        """32-bit word of (row, col) in a 128B-swizzled staging row (``col`` even: the pair of
        16-bit outputs at col, col + 1 is one word; an fp32 output is one word each)."""
        byte = col * self.match.out_bytes
        return (((byte // 16) ^ (row % ATOM_ROWS)) * 16 + byte % 16) // 4


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
    sources = (KERNEL_SOURCE, pathlib.Path(__file__).with_name("wgmma_epilogue.py"),
               pathlib.Path(__file__).with_name("wgmma_tma.py"))  # part of the template's identity in the tuning database

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
    from ..policies.prepare import scalar_dtype, shape_var_names

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
    out = next(p for p in func.params if str(p.name) == plan.match.d_name)
    params = "" if bind is not None else ", ".join(
        f'{p.name}: T.Buffer({tuple(int(x) for x in p.shape)}, "{p.dtype}")' for p in func.params)
    text = (_kernel_text()
            .replace("{NAME}", "wgmma_gemm").replace("{PARAMS}", params)
            .replace("{D_MAP}", _lines("{D_MAP}", d.host(plan.match.d_name)))
            .replace("{D_PREFETCH}", _lines("{D_PREFETCH}", d.prefetch()))
            .replace("{STORE_CHUNK}", _lines("{STORE_CHUNK}", d.store_chunk(
                plan.match.d_name, tuple(int(x) for x in out.shape), plan.match.m, plan.match.out_n,
                plan.match.out_dtype)))
            .replace("{A}", plan.match.a_name).replace("{B}", plan.match.b_name).replace("{D}", plan.match.d_name)
            .replace("{RANK}", "k_rank = T.cta_id_in_cluster([K_PLAN.cluster])" if plan.cluster > 1 else "k_rank = T.meta_var(0)")
            .replace("{RELEASE_PREVIOUS}", _release("(k_g + K_PLAN.stages - 1) % K_PLAN.stages", plan.cluster,
                                                    _indent("{RELEASE_PREVIOUS}")))
            .replace("{RELEASE_LAST}", _release("(k_it * K_PLAN.k_steps + K_PLAN.k_steps - 1) % K_PLAN.stages",
                                                plan.cluster, _indent("{RELEASE_LAST}")))
            .replace("{REGISTERS}", epilogue.registers(plan, _indent("{REGISTERS}")))
            .replace("{PREFETCH_NEXT}", epilogue.prefetch_next(plan, _indent("{PREFETCH_NEXT}")))
            .replace("{PREFETCH}", epilogue.prefetch(plan, _indent("{PREFETCH}")))
            .replace("{STORE}", epilogue.stores(plan, _indent("{STORE}"))))
    from tvm.script import tirx as T

    env = {"T": T, "K_PLAN": plan, "K_A": a, "K_B": b, "K_D": d, "K_IN_DTYPE": plan.match.in_dtype,
           "K_OUT_DTYPE": plan.match.out_dtype, "K_SWIZZLE_128B": SWIZZLE_128B,
           "len": len, "range": range}
    if bind is not None:
        env.update({str(p.name): p for p in bind.params})
    kernel = tvm.script.from_source(text, extra_vars=env, check_well_formed=bind is None)
    attrs = {"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True}
    if func.attrs is not None and "global_symbol" in func.attrs:
        attrs["global_symbol"] = func.attrs["global_symbol"]
    return kernel.with_attrs(attrs)


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
