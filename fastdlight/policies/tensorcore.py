"""Tensor-core matmul: eligibility (``get_tensorized_func_and_tags``) and the Roller-style tile
search over MMA-aligned tiles (``TensorCorePolicy``).

Every matmul-like PrimFunc is viewed as ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` (S: fused batch
axes). The function itself is returned unchanged: the schedule template re-does the (cheap)
normalization with ``reindex`` + ``transform_layout`` so that shared memory keeps the operands'
*stored* layout (128-bit global loads for every layout; ldmatrix ``.trans`` does the transpose).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tvm import tirx

from fastdlight.arch import CUDA
from fastdlight.analysis.dtypes import NBYTES
from fastdlight.config import Config
from fastdlight.analysis.matmul_match import MatmulMatch, match_matmul, split_axis  # noqa: F401 - part of this module's API
from fastdlight.policies.wgmma import WgmmaPolicy, wgmma_eligible

#: (in dtype, accumulator dtype) pairs with ldmatrix + mma.sync intrinsics: TVM 0.27's, and bf16
#: with an fp32 accumulator, which the template registers (``matmul_tensorcore.bf16_intrinsic``)
SUPPORTED_MMA = {("float16", "float32"), ("float16", "float16"), ("bfloat16", "float32"), ("int8", "int32")}
DTYPE_ABBR = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "int8": "i8", "int32": "i32"}


def intrin_group(match: MatmulMatch, smem_a_k_inner: bool, smem_b_k_inner: bool) -> dict[str, str]:
    """Names of the TVM tensor intrinsics for this matmul (registered by
    ``tvm.s_tir.tensor_intrin.cuda``; the int32 shared-memory store is registered by the
    template). ``smem_*_k_inner`` say how the operands sit in shared memory."""
    a, acc = DTYPE_ABBR[match.in_dtype], DTYPE_ABBR[match.acc_dtype]
    trans_a, trans_b = not smem_a_k_inner, smem_b_k_inner
    return {
        "init": f"mma_fill_16x16_{acc}",
        "load_a": f"mma_ldmatrix_{a}_a{'_trans' if trans_a else ''}_dyn",
        "load_b": f"mma_ldmatrix_{a}_b{'_trans' if trans_b else ''}_dyn",
        "compute": f"mma_{a}{a}{acc}{'_trans_a' if trans_a else ''}{'_trans_b' if trans_b else ''}",
        "store": f"mma_store_16x16_{acc}_shared_dyn_simple_",
    }


def _as_arch(target) -> CUDA:
    return target if isinstance(target, CUDA) else CUDA(target)


def get_tensorized_func_and_tags(func: tirx.PrimFunc, target, opt_shapes=None):
    """``(func, tags)`` when ``func`` is a (batched) matmul the tensor-core template can take on
    ``target`` (a Target, tag string or :class:`fastdlight.arch.CUDA`), else ``(func, None)``.

    The function is returned unchanged (the template normalizes it); ``tags`` describe the
    normalized view ``C[S, I, J] += A[S, I, K] * B[S, J, K]``."""
    tags, _reason = tensorcore_tags(func, target)
    return func, tags


def tensorcore_tags(func, target) -> tuple[dict | None, str]:
    """Like :func:`get_tensorized_func_and_tags` but also says *why* a function is ineligible."""
    try:
        arch = _as_arch(target)
    except ValueError as e:
        return None, str(e)
    # mma.sync.m16n8k16 (f16) and m16n8k32 (s8) need sm_80; never compare arch strings.
    if tuple(arch.compute_capability) < (8, 0):
        return None, f"compute capability {arch.compute_capability} < 8.0: no m16n8k16 mma.sync"
    match, reason = match_matmul(func)
    if match is None:
        return _wgmma_only_tags(func, arch, reason)
    pair = (match.in_dtype, match.acc_dtype)
    if min(match.m, match.n, match.k) < 16:
        return None, f"M/N/K = {match.m}/{match.n}/{match.k}: a dimension below 16"
    wgmma = _wgmma_takes(func, arch)
    mma_reason = _mma_sync_refusal(match, arch)
    instructions = (("wgmma",) if wgmma else ()) + (() if mma_reason else ("mma.sync",))
    if not instructions:
        return None, mma_reason
    smem_a_k_inner, smem_b_k_inner = smem_layout(match)
    tags = {
        "in_dtype": match.in_dtype,
        "acc_dtype": match.acc_dtype,
        "out_dtype": match.out_dtype,
        "layout": match.layout,
        "smem_layout": ("N" if smem_a_k_inner else "T") + ("T" if smem_b_k_inner else "N"),
        "batch": match.batch,
        "M": match.m,
        "N": match.n,
        "K": match.k,
        "mma_shape": tuple(arch.mma_shapes.get(pair, (16, 8, 16))),
        "intrin_group": intrin_group(match, smem_a_k_inner, smem_b_k_inner) if "mma.sync" in instructions else None,
        "instructions": instructions,
        "block": match.block,
        "epilogue": match.num_epilogue,
        #: extent of the reduction axis split-K may slice (K; a convolution's input channels)
        "split_extent": (split_axis(func, match.block) or ("", 0))[1],
    }
    return tags, ""


def _wgmma_only_tags(func, arch: CUDA, reason: str) -> tuple[dict | None, str]:
    """Tags of a matmul only the wgmma template takes: operands read through views of larger
    tensors (TMA boxes; see :mod:`.wgmma_view`), which the other templates' match refuses
    with ``reason``."""
    wm, _why = wgmma_eligible(func, arch)
    if wm is None:
        return None, reason
    layout = ("N" if wm.a_k_major else "T") + ("T" if wm.b_k_major else "N")
    return {"in_dtype": wm.in_dtype, "acc_dtype": "float32", "out_dtype": wm.out_dtype, "layout": layout,
            "smem_layout": layout, "batch": wm.batch, "M": wm.m, "N": wm.n, "K": wm.k,
            "mma_shape": tuple(arch.mma_shapes.get((wm.in_dtype, "float32"), (16, 8, 16))), "intrin_group": None,
            "instructions": ("wgmma",), "block": wm.block, "split_extent": 0}, ""


def _mma_sync_refusal(match: MatmulMatch, arch: CUDA) -> str:
    """Why the mma.sync template cannot take this matmul ("" when it can)."""
    pair = (match.in_dtype, match.acc_dtype)
    if match.pair_columns:
        return "the epilogue pairs the matmul's columns (gate and up in one GEMM): wgmma only"
    if pair not in SUPPORTED_MMA or pair not in arch.mma_shapes:
        return f"dtypes {pair} have no tensor-core path"
    if match.in_dtype == "int8" and match.layout != "NT":
        # TVM 0.27 has no int8 A-trans ldmatrix and its int8 B non-trans "ldmatrix" is a manual
        # loop; transposing int8 operands while copying them to shared memory crashed on the
        # GPU (illegal access) in an earlier version of the template: CUDA cores instead
        return f"int8 layout {match.layout}: tensor cores only for NT (A and B K-inner)"
    if match.in_dtype == "bfloat16" and match.layout != "NT":
        # TVM 0.27's CUDA codegen emits a transposing ldmatrix (.trans) only for fp16; for any
        # other 16-bit type it writes a scalar loop meant for int8: NT needs no .trans
        return f"bf16 layout {match.layout}: mma.sync only for NT (A and B K-inner: no ldmatrix .trans)"
    return ""


def _wgmma_takes(func, arch: CUDA) -> bool:
    return wgmma_eligible(func, arch)[0] is not None


def smem_layout(match: MatmulMatch) -> tuple[bool, bool]:
    """Shared-memory layout of A and B as ``(a_k_inner, b_k_inner)``: the stored layout
    (ldmatrix .trans does the transposes; int8 is only offered for NT, see tensorcore_tags)."""
    return match.a_k_inner, match.b_k_inner


# -- the policy ------------------------------------------------------------------------------

#: cycles a cp.async load takes to land in shared memory under load (what the pipeline hides)
LOAD_LATENCY_CYCLES = 700
#: shared-memory bandwidth of one SM (32 banks x 4 bytes per clock)
SMEM_BYTES_PER_CYCLE = 128
#: assumed SM clock; only converts the datasheet's TFLOPS and GB/s into per-cycle rates
CLOCK_HZ = 1.5e9
#: bytes one ldmatrix.x4 moves (four 8x8 matrices of 16-bit elements / a 16x32 int8 tile)
LDMATRIX_BYTES = 512
#: cost of the per-K-step __syncthreads + cp.async wait, per warp of the block
BARRIER_CYCLES_PER_WARP = 20
#: registers per thread beyond accumulators and fragments (addresses, loop counters)
REG_OVERHEAD = 24
#: fraction of the datasheet tensor peak mma.sync reaches on Hopper (wgmma gets the rest)
HOPPER_MMA_SYNC_EFFICIENCY = 0.62
#: mma.sync configs measured beside the wgmma tiles on sm_90a (at most half the top-k): on the
#: H100 the best mma.sync candidate was 1.4-1.8x slower than the best wgmma one in every GEMM
#: benchmark row and model function measured (2026-11-25); they stay as a fallback
MMA_SYNC_BESIDE_WGMMA = 4
#: split-K slice counts tried where the output tiles fill less than one wave of the GPU
SPLIT_K_OPTIONS = (2, 4, 8)
#: a slice keeps at least this many K-steps (the pipeline needs steps to overlap)
MIN_STEPS_PER_SLICE = 4
#: the extra launch split-K costs (the kernel that adds the slices)
SPLIT_K_LAUNCH_S = 2e-6
BLOCK_SIZES = (16, 32, 64, 128, 256)
WARP_SIZES = (16, 32, 64, 128)
MAX_WARPS = 8


@dataclass(frozen=True)
class TileCandidate:
    bm: int
    bn: int
    wm: int
    wn: int
    bk: int
    stages: int
    splits: int = 1  # split-K slices

    @property
    def warps(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn)


class TensorCorePolicy:
    """Roller search over MMA-aligned tiles for ``C[S, I, J] += A[S, I, K] * B[S, J, K]``.

    Every (block tile, warp tile, K step, pipeline depth) that the template builds and the SM
    can hold (shared memory x stages up to the opt-in limit, registers, threads) is scored by an
    estimated run time: waves x K-steps x the slowest of tensor-core issue, shared-memory traffic
    (ldmatrix + cp.async writes) and L2 traffic per step, but no faster than the pipeline can
    hide load latency. Padding waste is included (tiles need not divide the shape)."""

    def __init__(self, func, arch, tags: dict | None = None, opt_shapes: dict | None = None,
                 instructions: tuple[str, ...] | None = None):
        self.func = func
        self.arch = _as_arch(arch)
        if tags is None:
            tags, reason = tensorcore_tags(func, self.arch)
            if tags is None:
                raise ValueError(f"function is not tensor-core eligible: {reason}")
        self.tags = dict(tags)
        available = tuple(self.tags.get("instructions", ("mma.sync",)))
        #: "wgmma" (Hopper template, sm_90a) and/or "mma.sync": which templates' configs to emit
        self.instructions = tuple(i for i in available if instructions is None or i in instructions)
        if not self.instructions:
            raise ValueError(f"none of {instructions} applies here (available: {available})")
        for key in ("M", "N", "K", "batch"):  # symbolic dims specialized by the caller
            if opt_shapes and key in opt_shapes:
                self.tags[key] = int(opt_shapes[key])
        self.in_bytes = NBYTES[self.tags["in_dtype"]]
        self.acc_bytes = NBYTES[self.tags["acc_dtype"]]
        self.mma_k = int(self.tags["mma_shape"][2])

    # -- search space --------------------------------------------------------------------------
    def candidates(self) -> list[TileCandidate]:
        t, arch = self.tags, self.arch
        m_cap, n_cap = _pow2_at_least(t["M"]), _pow2_at_least(t["N"])
        k_padded = -(-t["K"] // self.mma_k) * self.mma_k
        bks = [self.mma_k * f for f in (1, 2, 4) if self.mma_k * f <= max(k_padded, self.mma_k)]
        # >= 64-byte rows keep every load a full 128-bit vector and allow the swizzled layout
        wide = [bk for bk in bks if bk * self.in_bytes >= 64]
        bks = wide or bks[-1:]
        stages_opts = (2, 3, 4) if arch.has_async_copy else (1, 2)
        out = []
        for bm in (b for b in BLOCK_SIZES if b <= m_cap):
            for bn in (b for b in BLOCK_SIZES if b <= n_cap):
                for wm in (w for w in WARP_SIZES if w <= bm and bm % w == 0):
                    for wn in (w for w in WARP_SIZES if w <= bn and bn % w == 0):
                        warps = (bm // wm) * (bn // wn)
                        if not 1 <= warps <= MAX_WARPS:
                            continue
                        for bk in bks:
                            for stages in stages_opts:
                                cand = TileCandidate(bm, bn, wm, wn, bk, stages)
                                if self.fits(cand):
                                    out.append(cand)
        # 2-8 warps per block (latency hiding); single-warp blocks only when nothing else fits
        multi = [c for c in out if c.warps >= 2] or out
        return multi + [split for c in multi for split in self.split_variants(c)]

    def split_variants(self, c: TileCandidate) -> list[TileCandidate]:
        """``c`` with its K cut into slices (split-K), where its output tiles fill less than one
        wave: each slice a whole number of 16-element chunks and at least a few K-steps, and
        no more blocks than two waves."""
        t, arch = self.tags, self.arch
        extent, per_sm = t.get("split_extent", 0), self.blocks_per_sm(c)
        grid = t["batch"] * -(-t["M"] // c.bm) * -(-t["N"] // c.bn)
        wave = per_sm * arch.sm_count
        if not extent or grid >= wave:
            return []
        return [
            dataclasses.replace(c, splits=s)
            for s in SPLIT_K_OPTIONS
            if extent % s == 0 and (extent // s) % 16 == 0 and t["K"] // s >= MIN_STEPS_PER_SLICE * c.bk
            and grid * s <= 2 * wave
        ]  # fmt: skip

    def smem_bytes(self, c: TileCandidate) -> int:
        """Dynamic shared memory: the pipelined A/B tiles, or the accumulator staging tile of the
        epilogue, whichever is larger (TVM merges the two allocations; they are never live at
        the same time)."""
        pad = 16 if self.tags["in_dtype"] == "int8" else 0  # int8 is padded, fp16 swizzled
        row_a = (c.bk if self.tags["smem_layout"][0] == "N" else c.bm) * self.in_bytes + pad
        row_b = (c.bk if self.tags["smem_layout"][1] == "T" else c.bn) * self.in_bytes + pad
        rows_a = c.bm if self.tags["smem_layout"][0] == "N" else c.bk
        rows_b = c.bn if self.tags["smem_layout"][1] == "T" else c.bk
        pipeline = c.stages * (rows_a * row_a + rows_b * row_b)
        staging = c.bm * (c.bn + 8) * self.acc_bytes
        return max(pipeline, staging)

    def registers(self, c: TileCandidate) -> int:
        """Registers per thread: accumulators + A/B fragments (a whole K-step or one MMA-k
        sub-step, as the template loads them) + overhead."""
        acc = c.wm * c.wn * self.acc_bytes // (32 * 4)
        return acc + fragment_registers(c.wm, c.wn, c.bk, self.in_bytes, self.mma_k) + REG_OVERHEAD

    def fits(self, c: TileCandidate) -> bool:
        arch = self.arch
        threads = c.warps * 32
        regs = self.registers(c)
        return (
            threads <= arch.max_threads_per_block
            and regs <= arch.max_regs_per_thread
            and regs * threads <= arch.regs_per_block
            and self.smem_bytes(c) <= arch.smem_per_block_optin
            and self.blocks_per_sm(c) >= 1
        )

    def blocks_per_sm(self, c: TileCandidate) -> int:
        arch = self.arch
        threads = c.warps * 32
        regs = -(-self.registers(c) // 8) * 8  # allocation granularity
        return max(0, min(
            arch.max_blocks_per_sm,
            arch.max_threads_per_sm // threads,
            arch.regs_per_sm // (regs * threads),
            arch.smem_per_sm // max(self.smem_bytes(c) + 1024, 1),  # + per-block reservation
        ))  # fmt: skip

    # -- cost ----------------------------------------------------------------------------------
    def cost(self, c: TileCandidate) -> float:
        """Estimated kernel time in seconds (for ranking; absolute values are rough)."""
        t, arch = self.tags, self.arch
        grid_m, grid_n = -(-t["M"] // c.bm), -(-t["N"] // c.bn)
        grid = t["batch"] * grid_m * grid_n * c.splits
        steps = -(-(t["K"] // c.splits) // c.bk)
        per_sm = self.blocks_per_sm(c)
        waves = -(-grid // (per_sm * arch.sm_count))
        resident = min(per_sm, -(-grid // arch.sm_count))  # blocks sharing an SM in a wave

        peak = arch.peak_tc_tflops.get(t["in_dtype"], max(arch.peak_tc_tflops.values())) * 1e12
        if getattr(arch, "has_wgmma", False):
            peak *= HOPPER_MMA_SYNC_EFFICIENCY
        mma_flops = 2 * 16 * 8 * self.mma_k
        mma_per_cycle = peak / (arch.sm_count * CLOCK_HZ * mma_flops)
        # each of the SM's 4 schedulers needs a warp to keep its tensor core busy
        busy = min(1.0, resident * c.warps / 4)
        k_sub = c.bk // self.mma_k
        mma = (c.bm // 16) * (c.bn // 8) * k_sub / (mma_per_cycle * busy)
        tile_bytes = (c.bm + c.bn) * c.bk * self.in_bytes
        ldmatrix = c.warps * (c.wm // 16 + c.wn // 16) * k_sub * LDMATRIX_BYTES
        smem = (ldmatrix + tile_bytes) / SMEM_BYTES_PER_CYCLE
        l2_per_cycle = 2.5 * arch.dram_bandwidth_gbs * 1e9 / (arch.sm_count * CLOCK_HZ)
        l2 = tile_bytes / l2_per_cycle
        step = max(mma, smem, l2)
        # `stages - 1` loads in flight per block must cover the load latency; every K-step ends
        # in a block-wide barrier whose skew grows with the warps it waits for (co-resident
        # blocks fill the bubble)
        barrier = BARRIER_CYCLES_PER_WARP * c.warps / resident
        sm_step = max(resident * step, LOAD_LATENCY_CYCLES / max(c.stages - 1, 1)) + barrier
        out_bytes = 4 if c.splits > 1 else NBYTES.get(t["out_dtype"], 4)
        epilogue = resident * c.bm * c.bn * (2 * self.acc_bytes / SMEM_BYTES_PER_CYCLE + out_bytes / l2_per_cycle)
        cycles = waves * (steps * sm_step + epilogue + LOAD_LATENCY_CYCLES)
        return cycles / CLOCK_HZ + self.split_sum_cost(c)

    def split_sum_cost(self, c: TileCandidate) -> float:
        """Seconds of split-K's second kernel: read every slice's fp32 partials, write the output."""
        if c.splits == 1:
            return 0.0
        t = self.tags
        outputs = t["batch"] * t["M"] * t["N"]
        traffic = outputs * (4 * c.splits + NBYTES.get(t["out_dtype"], 4))
        return traffic / (self.arch.dram_bandwidth_gbs * 1e9) + SPLIT_K_LAUNCH_S

    def rasterization(self, c: TileCandidate) -> int:
        """Panel width of the block swizzle when the operands and output overflow L2."""
        t = self.tags
        footprint = t["batch"] * (
            (t["M"] + t["N"]) * t["K"] * self.in_bytes + t["M"] * t["N"] * NBYTES.get(t["out_dtype"], 4)
        )
        grid_m, grid_n = -(-t["M"] // c.bm), -(-t["N"] // c.bn)
        if footprint <= self.arch.l2_bytes or grid_n < 2:
            return 0
        for panel in (16, 8, 4):
            if grid_m > panel and grid_m % panel == 0:
                return panel
        return 0

    def emit_config(self, topk: int = 10) -> list[Config]:
        """The ``topk`` best configs, best first (ascending estimated time). On ``sm_90a`` the
        Hopper wgmma template's tiles (``WgmmaPolicy``) come first and ``MMA_SYNC_BESIDE_WGMMA``
        mma.sync configs are measured beside them; their estimates are in the same seconds."""
        if "wgmma" not in self.instructions:
            return self.mma_sync_configs(topk)
        n_mma = min(MMA_SYNC_BESIDE_WGMMA, topk // 2) if "mma.sync" in self.instructions else 0
        wgmma = WgmmaPolicy(self.func, self.arch).emit_config(max(1, topk - n_mma))
        return sorted(wgmma + self.mma_sync_configs(n_mma), key=lambda c: c.cost)

    def mma_sync_configs(self, topk: int) -> list[Config]:
        """The ``topk`` best mma.sync configs, best first. Equal estimates prefer square warp
        tiles, deeper pipelines, then longer K steps. Only the two best pipeline depths of each
        tile shape are emitted, so a measured top-k sees more tiles; split-K variants take at
        most half of the slots (the estimate of the partial sums' cost is the roughest part)."""
        if topk <= 0:
            return []
        ranked = sorted(
            self.candidates(),
            key=lambda c: (self.cost(c), abs(math.log2(c.wm / c.wn)), -c.stages, -c.bk, c.splits, c.bm, c.bn, c.wm, c.wn),
        )
        whole = [c for c in ranked if c.splits == 1]
        split = [c for c in ranked if c.splits > 1]
        chosen = self._distinct(split, topk // 2 if whole else topk)
        chosen += self._distinct(whole, topk - len(chosen))
        return sorted((self._config(c) for c in chosen), key=lambda cfg: cfg.cost)

    @staticmethod
    def _distinct(ranked: list[TileCandidate], count: int) -> list[TileCandidate]:
        """The first ``count`` of ``ranked``, at most two pipeline depths per tile shape."""
        out, per_shape = [], {}
        for c in ranked:
            if len(out) >= count:
                break
            shape = (c.bm, c.bn, c.wm, c.wn, c.bk, c.splits)
            per_shape[shape] = per_shape.get(shape, 0) + 1
            if per_shape[shape] <= 2:
                out.append(c)
        return out

    def _config(self, c: TileCandidate) -> Config:
        return Config(
            "matmul_tc",
            block=(c.bm, c.bn),
            warp=(c.wm, c.wn),
            rstep=(c.bk,),
            pipeline_stages=c.stages,
            use_async_copy=self.arch.has_async_copy and c.stages > 1,
            rasterization=self.rasterization(c),
            split_k=c.splits,
            cost=self.cost(c),
        )


#: A+B fragment registers up to which the template loads a whole K-step of fragments at once
WHOLE_STEP_FRAGMENT_REGS = 64


def whole_step_fragments(wm: int, wn: int, bk: int, in_bytes: int) -> bool:
    """Does the template load the A/B fragments of a whole K-step at once (else per MMA-k)?"""
    return (wm + wn) * bk * in_bytes // (32 * 4) <= WHOLE_STEP_FRAGMENT_REGS


def fragment_registers(wm: int, wn: int, bk: int, in_bytes: int, mma_k: int) -> int:
    k = bk if whole_step_fragments(wm, wn, bk, in_bytes) else mma_k
    return (wm + wn) * k * in_bytes // (32 * 4)


def _pow2_at_least(n: int) -> int:
    p = 16
    while p < n:
        p *= 2
    return p
