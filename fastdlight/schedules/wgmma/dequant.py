"""Hopper weight-only 4-bit matmul for prefill rows (``kind == "matmul_wgmma_dequant"``): a
:func:`~fastdlight.analysis.weight_only.weight_only_func` with fp16 activations, as one TIRx kernel
(``dequant_kernel.tvmscript``) on wgmma, reading the packed weights as they are.

The product is computed transposed, ``Y^T = W X^T``: the dequantized weights are wgmma's A
operand, which may come from registers, so they never go back to shared memory; X is the B
operand, K-major in 128B-swizzled shared memory as TMA loads it (the fp16 GEMM's NT layout).

* A persistent grid of one CTA per SM walks the tiles of ``bw`` weight rows by ``bx``
  activation rows (the activation tiles of one weight tile consecutively: concurrent CTAs share
  weight tiles, and X stays in L2).
* Warpgroup 0 is the producer: one thread loads each K step of 64 into a ring of stages: the X
  box (64 x ``bx``, 128B swizzle) and the packed weight box (``bw`` rows of 8 words, 32B swizzle,
  which stores the second 16-byte half of a row first in rows 4..7 of every 8, so the consumers'
  16-byte reads of 8 rows a warp meet no bank conflict).
* Each consumer warpgroup (two or three) owns 64 weight rows of the tile. A thread holds wgmma's
  A fragment of rows ``r`` and ``r + 8`` of its warp's 16: per k16 the nibble pairs ``(2c, 2c +
  1)`` and ``(8 + 2c, 9 + 2c)``, ``c = lane % 4``, which are byte ``c`` of the two words of the
  k16 slice. Per 32-bit register: one ``prmt`` puts the byte in both halves, one ``lop3`` masks
  the low nibble into the low half and the high nibble into bits 4..7 of the high half and ORs in
  the exponent of 1024 (``1024 + q``, ``1024 + 16 q``); one ``hfma2`` by ``(1, 1/16)`` minus
  ``(1032, 72)`` gives ``q - 8`` exactly, one ``hmul2`` the group scale: W exactly as the
  reference rounds ``(q - z) * s`` in fp16 (a zero point: ``q``, minus ``z``, times ``s``).
* The fragments of two K steps are held: a step's are built while the previous step's wgmma runs
  on the tensor cores (``wait_group(1)``), then the stage before goes back to the producer.
* Group scales (and zeros) come from global memory a group ahead, the next tile's first at the
  last group of a tile; groups are whole K steps (a multiple of 64).
* Epilogue: the accumulators (weight rows by activation rows) are written transposed into
  64 x 64 swizzled chunks of Y and stored by TMA, which clips the rows past M.

Taken: 4-bit weights, fp16 activations and output, group a multiple of 64, K a multiple of 128,
N a multiple of 8 (16-byte rows of Y); M any.
"""

from __future__ import annotations

import functools
import pathlib
import re
from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from fastdlight.analysis.weight_only import WeightOnlyShape, match_weight_only
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.policies.wgmma import PRODUCER_REGS, SM90_SMEM_OPTIN, consumer_regs
from fastdlight.policies.wgmma_dequant import BK, DequantTile
from fastdlight.schedules.base import ScheduleTemplate, as_tirx_kernel
from fastdlight.schedules.wgmma.template import register_codegen_fixes
from fastdlight.schedules.wgmma.tma import SWIZZLE_128B, Operand

KERNEL_SOURCE = pathlib.Path(__file__).with_name("dequant_kernel.tvmscript")
KIND = "matmul_wgmma_dequant"
SWIZZLE_32B = 1  # CUtensorMapSwizzle
L2_PROMO_256B = 3
_DEQUANT = r"""
__forceinline__ __device__ unsigned NAME(unsigned w, unsigned sel, half s, half z) {
  // byte (sel & 3) of w into bytes 0 and 2; its low nibble into the low half and its high nibble
  // into bits 4..7 of the high half, OR-ed into the mantissa of 1024: 1024 + q0, 1024 + 16 q1
  const unsigned x = __byte_perm(w, 0u, sel);
  unsigned t = (x & 0x00F0000Fu) | 0x64006400u;
  const half2 mul = __halves2half2(__ushort_as_half((unsigned short)0x3C00), __ushort_as_half((unsigned short)0x2C00));
  const half2 add = __halves2half2(__ushort_as_half((unsigned short)ADD_LO), __ushort_as_half((unsigned short)ADD_HI));
  half2 v = __hfma2(*reinterpret_cast<const half2*>(&t), mul, add);
  ZERO
  v = __hmul2(v, __half2half2(s));
  return *reinterpret_cast<unsigned*>(&v);
}
"""
#: symmetric (z = 8): (1024 + q) - 1032 and (1024 + 16 q) / 16 - 72, exact. A zero point: q
#: exactly ((1024 + q) - 1024, (1024 + 16 q) / 16 - 64), minus z rounded as the reference rounds it
_SYMMETRIC = {"NAME": "fdl_w4_frag", "ADD_LO": "0xE408", "ADD_HI": "0xD480", "ZERO": ""}
_ZERO_POINT = {"NAME": "fdl_w4z_frag", "ADD_LO": "0xE400", "ADD_HI": "0xD400",
               "ZERO": "v = __hsub2(v, __half2half2(z));"}


@dataclass(frozen=True)
class DequantPlan(DequantTile):
    """A :class:`~fastdlight.policies.wgmma_dequant.DequantTile` and the kernel's code for it:
    registers and threads, the wgmma instruction, the X operand's descriptor, the dequantizing
    function."""

    producer_regs = PRODUCER_REGS

    @property
    def consumer_regs(self) -> int:
        return consumer_regs(self.consumers)

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def x_stage_units(self) -> int:
        return self.x_elems * 2 // 16

    @property
    def mma(self) -> str:
        return f"wgmma.mma_async.sync.aligned.m64n{self.bx}k16.f32.f16.f16"

    def x_operand(self) -> Operand:
        return Operand(True, self.bx, BK, (self.k, self.m), 2)

    def dequant(self, word, sel, s, z):
        """A 32-bit A-fragment register (two fp16 weights) from byte ``sel & 3`` of ``word``."""
        parts = _ZERO_POINT if self.shape.zero_point else _SYMMETRIC
        source = _DEQUANT
        for key, value in parts.items():
            source = source.replace(key, value)
        return cuda_func_call(parts["NAME"], word, sel, s, z, source_code=source, return_type="uint32")


def plan_of(shape: WeightOnlyShape, config: Config, num_sms: int, smem: int) -> DequantPlan | None:
    """The plan of ``config`` (block = (weight rows, activation rows), warp = (64, activation
    rows), rstep = (64,)), or None where it does not fit."""
    if config.kind != KIND or config.warp != (64, config.block[1]) or config.rstep != (BK,) or config.cluster != 1:
        return None
    plan = DequantPlan(shape, config.block[0], config.block[1], config.pipeline_stages, num_sms, smem)
    return plan if plan.fits() else None


class DequantWgmmaTemplate(ScheduleTemplate):
    kinds = (KIND,)
    name = KIND
    sources = (KERNEL_SOURCE, pathlib.Path(__file__))  # part of the template's identity in the tuning database

    def apply_config(self, func: tirx.PrimFunc, config: Config):
        shape = match_weight_only(func)
        if shape is None or config.kind != KIND:
            return None
        target = tvm.target.Target.current(allow_none=True)
        arch = CUDA(target) if target is not None else None
        if arch is not None and not arch.has_wgmma:
            return None
        plan = plan_of(shape, config, arch.sm_count if arch else 132,
                       arch.smem_per_block_optin if arch else SM90_SMEM_OPTIN)
        return build_kernel(func, plan) if plan is not None else None


def build_kernel(func: tirx.PrimFunc, plan: DequantPlan) -> tirx.PrimFunc:
    """The TIRx kernel for ``func`` (a weight-only matmul) under ``plan``: same parameters, same result."""
    register_codegen_fixes()
    names = [str(p.name) for p in func.params]
    x, q, s = names[:3]
    z = names[3] if plan.shape.zero_point else None
    y = names[-1]
    params = ", ".join(f'{p.name}: T.Buffer({tuple(int(d) for d in p.shape)}, "{p.dtype}")' for p in func.params)

    def row(tile: str, rh: str) -> str:
        return f"T.min({tile} * P.bw + k_cw * 64 + k_r0 + {rh} * 8, P.n - 1)"

    def loads(tile: str, group: str) -> list[str]:
        out = ["for rh in T.unroll(2):", f"    k_sn[rh] = {s}[{row(tile, 'rh')}, {group}]"]
        if z is not None:
            out.append(f"    k_sn[2 + rh] = {z}[{row(tile, 'rh')}, {group}]")
        return out

    nxt = "(k_k // P.steps_per_group + 1)"
    next_tile = (f"T.if_then_else({nxt} < P.groups, P.tile_w(k_tile), "
                 "P.tile_w(T.min(k_tile + P.ctas, P.tiles - 1)))")
    zero = "k_sc[2 + j % 2]" if z is not None else "k_sc[j % 2]"
    text = (_kernel_text()
            .replace("{NAME}", "wgmma_w4").replace("{PARAMS}", params)
            .replace("{X}", x).replace("{Q}", q).replace("{Y}", y)
            .replace("{SCALES_FIRST}", _lines("{SCALES_FIRST}", loads("P.tile_w(k_bid)", "0")))
            .replace("{SCALES_NEXT}", _lines("{SCALES_NEXT}", loads(next_tile, f"{nxt} % P.groups")))
            .replace("{DEQUANT}", f"P.dequant(k_w[(j % 2) * 8 + 2 * kk + j // 2], k_sel, k_sc[j % 2], {zero})"))
    env = {"T": T, "P": plan, "K_X": plan.x_operand(), "K_SWIZZLE_128B": SWIZZLE_128B,
           "K_SWIZZLE_32B": SWIZZLE_32B, "K_L2_256B": L2_PROMO_256B, "range": range}
    kernel = tvm.script.from_source(text, extra_vars=env)
    return as_tirx_kernel(kernel, func)


@functools.cache
def _kernel_text() -> str:
    return KERNEL_SOURCE.read_text()


def _lines(placeholder: str, lines: list[str]) -> str:
    indent = re.search(rf"\n( *){re.escape(placeholder)}", _kernel_text()).group(1)
    return ("\n" + indent).join(lines)
