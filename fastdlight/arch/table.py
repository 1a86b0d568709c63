"""Known NVIDIA GPUs: one frozen row per chip, plus the per-compute-capability limits.

Units: bytes for memory sizes (DRAM: the datasheet's GB read as GiB, an upper bound: an H100
80GB reports 85.0e9 bytes, 79.2 GiB), GB/s (1e9 bytes/s) for DRAM bandwidth, TFLOPS (1e12/s; TOPS for
int8) for peaks. Tensor-core peaks are DENSE (no 2:4 sparsity) and with a float32 accumulator
(int32 for int8): the datasheets print the sparse number first, we halve it. "float8" stands for
both float8_e4m3fn and float8_e5m2.

Sources: the per-row comment names the NVIDIA datasheet / whitepaper of the chip numbers; the
per-SM limits come from the CUDA C++ Programming Guide, table "Technical Specifications per
Compute Capability" (shared by every chip of one compute capability, see ``CC_LIMITS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KB = 1024
MB = 1024 * 1024
GiB = 1024**3

#: no CUDA GPU has more memory than this (B300: 288 GB): the bound for a GPU whose memory is
#: not known, so that a size is refused only where no GPU could hold it
LARGEST_DRAM_BYTES = 288 * GiB


@dataclass(frozen=True)
class CCLimits:
    """Per-SM limits that depend only on the compute capability."""

    max_threads_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int  # bytes
    smem_per_block_optin: int  # bytes, cudaFuncAttributeMaxDynamicSharedMemorySize ceiling


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability".
# A compute capability missing here uses the nearest lower entry (e.g. 10.3 -> 10.0, 12.1 -> 12.0).
CC_LIMITS: dict[tuple[int, int], CCLimits] = {
    (5, 0): CCLimits(2048, 32, 64 * KB, 48 * KB),
    (5, 2): CCLimits(2048, 32, 96 * KB, 48 * KB),
    (6, 0): CCLimits(2048, 32, 64 * KB, 48 * KB),
    (6, 1): CCLimits(2048, 32, 96 * KB, 48 * KB),
    (7, 0): CCLimits(2048, 32, 96 * KB, 96 * KB),
    (7, 2): CCLimits(2048, 32, 96 * KB, 96 * KB),
    (7, 5): CCLimits(1024, 16, 64 * KB, 64 * KB),
    (8, 0): CCLimits(2048, 32, 164 * KB, 163 * KB),
    (8, 6): CCLimits(1536, 16, 100 * KB, 99 * KB),
    (8, 7): CCLimits(1536, 16, 164 * KB, 163 * KB),
    (8, 9): CCLimits(1536, 24, 100 * KB, 99 * KB),
    (9, 0): CCLimits(2048, 32, 228 * KB, 227 * KB),
    (10, 0): CCLimits(2048, 32, 228 * KB, 227 * KB),
    (12, 0): CCLimits(1536, 32, 128 * KB, 99 * KB),
}


def cc_limits(cc: tuple[int, int]) -> CCLimits:
    """Limits of ``cc``, else of the nearest lower known compute capability (tuples compare right)."""
    lower = [k for k in CC_LIMITS if k <= tuple(cc)]
    return CC_LIMITS[max(lower)] if lower else CC_LIMITS[min(CC_LIMITS)]


def mma_shapes_for(cc: tuple[int, int]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Warp-level tensor-core instruction shape (m, n, k) per (input dtype, accumulator dtype).

    These are the mma.sync / wmma shapes (what TVM's tensor intrinsics emit), not Hopper's
    warpgroup wgmma shapes (m64nNk16), which a wgmma template picks itself.
    """
    cc = tuple(cc)
    if cc < (7, 0):
        return {}
    if cc < (7, 5):  # Volta: only fp16 tensor cores, used through wmma 16x16x16
        return {("float16", "float32"): (16, 16, 16), ("float16", "float16"): (16, 16, 16)}
    if cc < (8, 0):  # Turing: mma.sync m16n8k8 for fp16, m8n8k16 for int8 (PTX ISA)
        return {
            ("float16", "float32"): (16, 8, 8),
            ("float16", "float16"): (16, 8, 8),
            ("int8", "int32"): (8, 8, 16),
        }
    shapes = {  # Ampere and later: m16n8k16 fp16/bf16, m16n8k32 int8
        ("float16", "float32"): (16, 8, 16),
        ("float16", "float16"): (16, 8, 16),
        ("bfloat16", "float32"): (16, 8, 16),
        ("int8", "int32"): (16, 8, 32),
    }
    if cc >= (8, 9):  # mma.sync with .e4m3/.e5m2 inputs needs sm_89+
        shapes[("float8_e4m3fn", "float32")] = (16, 8, 32)
        shapes[("float8_e5m2", "float32")] = (16, 8, 32)
    return shapes


@dataclass(frozen=True)
class GPUSpec:
    """One known GPU. ``tag``: the TVM target tag, or our own ``nvidia/...`` name where TVM has none
    (``tvm_tag`` tells which). ``device_names``: case-insensitive regexes for the CUDA device name."""

    key: str
    name: str
    tag: str
    tvm_tag: bool
    device_names: tuple[str, ...]
    compute_capability: tuple[int, int]
    arch_suffix: str  # "a": the chip's arch-specific features (wgmma, setmaxnreg) are worth sm_90a
    sm_count: int
    regs_per_sm: int  # 32-bit registers
    regs_per_block: int
    smem_per_sm: int  # bytes
    smem_per_block: int  # bytes, static/default limit without opt-in
    smem_per_block_optin: int  # bytes, max dynamic smem a kernel may opt in to
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    dram_bytes: int  # device memory, an upper bound (see module docstring)
    dram_bandwidth_gbs: float
    peak_fp32_tflops: float
    peak_tc_tflops: tuple[tuple[str, float], ...]  # (dtype, dense TFLOPS), see module docstring
    source: str

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}{self.arch_suffix}"

    def matches_device_name(self, device_name: str) -> bool:
        return any(re.search(p, device_name, re.IGNORECASE) for p in self.device_names)


def _gpu(key, name, cc, *, tag, tvm_tag, device_names, sm_count, l2_bytes, dram_gb, bw, fp32, tc, source,
         suffix=""):
    """A row whose per-SM limits come from ``CC_LIMITS`` (identical for every chip of one cc)."""
    lim = cc_limits(cc)
    return GPUSpec(
        key=key, name=name, tag=tag, tvm_tag=tvm_tag, device_names=tuple(device_names),
        compute_capability=cc, arch_suffix=suffix, sm_count=sm_count,
        regs_per_sm=64 * KB, regs_per_block=64 * KB,
        smem_per_sm=lim.smem_per_sm, smem_per_block=48 * KB,
        smem_per_block_optin=lim.smem_per_block_optin,
        max_threads_per_sm=lim.max_threads_per_sm, max_blocks_per_sm=lim.max_blocks_per_sm,
        l2_bytes=l2_bytes, dram_bytes=int(dram_gb * GiB), dram_bandwidth_gbs=float(bw),
        peak_fp32_tflops=float(fp32),
        peak_tc_tflops=tuple((k, float(v)) for k, v in tc.items()), source=source,
    )


# Order matters only for Targets that cannot be told apart by their attributes (several sm_86 tags
# carry identical attributes): the first matching row is used, with a warning.
GPUS: tuple[GPUSpec, ...] = (
    # NVIDIA Tesla V100 datasheet (SXM2) + Volta GV100 whitepaper: 80 SMs, 6 MB L2, 900 GB/s HBM2
    # (32 GB, also sold with 16: the memory is a bound, so the larger),
    # 15.7 TFLOPS FP32, 125 TFLOPS fp16 tensor. No bf16/int8 tensor cores.
    _gpu("v100", "Tesla V100 SXM2", (7, 0), tag="nvidia/nvidia-v100", tvm_tag=True,
         device_names=[r"\bV100"], sm_count=80, l2_bytes=6 * MB, dram_gb=32, bw=900, fp32=15.7,
         tc={"float16": 125}, source="Tesla V100 datasheet; Volta whitepaper"),
    # NVIDIA T4 datasheet + Turing whitepaper: 40 SMs, 4 MB L2, 320 GB/s 16 GB GDDR6, 8.1 TFLOPS FP32,
    # 65 TFLOPS fp16 mixed precision, 130 TOPS int8.
    _gpu("t4", "Tesla T4", (7, 5), tag="nvidia/nvidia-t4", tvm_tag=True,
         device_names=[r"\bT4\b"], sm_count=40, l2_bytes=4 * MB, dram_gb=16, bw=320, fp32=8.1,
         tc={"float16": 65, "int8": 130}, source="NVIDIA T4 datasheet; Turing whitepaper"),
    # NVIDIA A100 datasheet (SXM 40GB) + Ampere GA100 whitepaper: 108 SMs, 40 MB L2, 1555 GB/s
    # 40 GB HBM2, 19.5 TFLOPS FP32, 312 TFLOPS fp16/bf16, 624 TOPS int8 (dense).
    _gpu("a100-40gb", "A100 SXM4 40GB", (8, 0), tag="nvidia/nvidia-a100", tvm_tag=True,
         device_names=[r"\bA100\b(?!.*80\s*GB)"], sm_count=108, l2_bytes=40 * MB, dram_gb=40, bw=1555,
         fp32=19.5, tc={"float16": 312, "bfloat16": 312, "int8": 624},
         source="NVIDIA A100 datasheet; Ampere GA100 whitepaper"),
    # NVIDIA A100 80GB datasheet (SXM): same chip, HBM2e 2039 GB/s.
    _gpu("a100-80gb", "A100 SXM4 80GB", (8, 0), tag="nvidia/nvidia-a100-80gb", tvm_tag=False,
         device_names=[r"\bA100\b.*80\s*GB"], sm_count=108, l2_bytes=40 * MB, dram_gb=80, bw=2039,
         fp32=19.5, tc={"float16": 312, "bfloat16": 312, "int8": 624},
         source="NVIDIA A100 80GB datasheet"),
    # NVIDIA A10 datasheet: 72 SMs (9216 cores), 6 MB L2, 600 GB/s 24 GB GDDR6, 31.2 TFLOPS FP32,
    # 125 TFLOPS fp16/bf16, 250 TOPS int8 (dense).
    _gpu("a10", "A10", (8, 6), tag="nvidia/nvidia-a10", tvm_tag=True,
         device_names=[r"\bA10\b"], sm_count=72, l2_bytes=6 * MB, dram_gb=24, bw=600, fp32=31.2,
         tc={"float16": 125, "bfloat16": 125, "int8": 250}, source="NVIDIA A10 datasheet"),
    # NVIDIA L4 datasheet + Ada whitepaper: 58 SMs (7424 cores), 48 MB L2, 300 GB/s 24 GB GDDR6, 30.3 TFLOPS
    # FP32; 242 fp16 / 485 fp8 / 485 int8 are sparse figures -> 121 / 242.5 / 242.5 dense.
    _gpu("l4", "L4", (8, 9), tag="nvidia/nvidia-l4", tvm_tag=False,
         device_names=[r"\bL4\b"], sm_count=58, l2_bytes=48 * MB, dram_gb=24, bw=300, fp32=30.3,
         tc={"float16": 121, "bfloat16": 121, "int8": 242.5, "float8": 242.5},
         source="NVIDIA L4 datasheet; Ada Lovelace whitepaper"),
    # Ampere GA102 whitepaper, appendix (RTX 3090): 82 SMs, 6 MB L2, 936 GB/s 24 GB GDDR6X, 35.6 TFLOPS
    # FP32; GeForce runs fp16/bf16 with fp32 accumulate at half rate: 71 TFLOPS, int8 284 TOPS.
    _gpu("rtx3090", "GeForce RTX 3090", (8, 6), tag="nvidia/geforce-rtx-3090", tvm_tag=True,
         device_names=[r"RTX 3090\b(?!\s*Ti)"], sm_count=82, l2_bytes=6 * MB, dram_gb=24, bw=936, fp32=35.6,
         tc={"float16": 71, "bfloat16": 71, "int8": 284}, source="NVIDIA Ampere GA102 whitepaper"),
    # Ada AD102 whitepaper, appendix (RTX 4090): 128 SMs, 72 MB L2, 1008 GB/s 24 GB GDDR6X, 82.6 TFLOPS FP32;
    # with fp32 accumulate: fp16/bf16 165.2, fp8 330.3; int8 660.6 TOPS (dense).
    _gpu("rtx4090", "GeForce RTX 4090", (8, 9), tag="nvidia/geforce-rtx-4090", tvm_tag=True,
         device_names=[r"RTX 4090\b(?!\s*(D\b|Laptop))"], sm_count=128, l2_bytes=72 * MB,
         dram_gb=24, bw=1008, fp32=82.6, tc={"float16": 165.2, "bfloat16": 165.2, "int8": 660.6,
                                 "float8": 330.3},
         source="NVIDIA Ada Lovelace AD102 whitepaper"),
    # NVIDIA H100 datasheet (SXM5) + Hopper whitepaper: 132 SMs, 50 MB L2, 3350 GB/s 80 GB HBM3,
    # 67 TFLOPS FP32, 989.4 fp16/bf16, 1979 fp8, 1979 TOPS int8 (dense).
    _gpu("h100-sxm", "H100 SXM5 80GB", (9, 0), tag="nvidia/nvidia-h100", tvm_tag=True,
         device_names=[r"\bH100\b.*\b(HBM3|SXM)"], sm_count=132, l2_bytes=50 * MB, dram_gb=80, bw=3350,
         fp32=67, tc={"float16": 989.4, "bfloat16": 989.4, "int8": 1979, "float8": 1979},
         source="NVIDIA H100 datasheet; Hopper H100 whitepaper", suffix="a"),
    # NVIDIA H100 datasheet (PCIe): 114 SMs, 50 MB L2, 2000 GB/s 80 GB HBM2e, 51 TFLOPS FP32,
    # 756 fp16/bf16, 1513 fp8, 1513 TOPS int8 (dense).
    _gpu("h100-pcie", "H100 PCIe 80GB", (9, 0), tag="nvidia/nvidia-h100-pcie", tvm_tag=False,
         device_names=[r"\bH100\b.*\bPCIe\b"], sm_count=114, l2_bytes=50 * MB, dram_gb=80, bw=2000, fp32=51,
         tc={"float16": 756, "bfloat16": 756, "int8": 1513, "float8": 1513},
         source="NVIDIA H100 datasheet (PCIe)", suffix="a"),
    # NVIDIA H200 datasheet (SXM): H100 compute (132 SMs) with 4800 GB/s 141 GB HBM3e. L2: 60 MB as
    # the device itself reports it (cudaDevAttrL2CacheSize = 62914560 on an H200, 2026-11-22).
    _gpu("h200", "H200 SXM 141GB", (9, 0), tag="nvidia/nvidia-h200", tvm_tag=False,
         device_names=[r"\bH200\b(?!.*NVL)"], sm_count=132, l2_bytes=60 * MB, dram_gb=141, bw=4800, fp32=67,
         tc={"float16": 989.4, "bfloat16": 989.4, "int8": 1979, "float8": 1979},
         source="NVIDIA H200 datasheet", suffix="a"),
)

GPUS_BY_TAG: dict[str, GPUSpec] = {g.tag: g for g in GPUS}
GPUS_BY_KEY: dict[str, GPUSpec] = {g.key: g for g in GPUS}


def find_by_device_name(device_name: str) -> GPUSpec | None:
    hits = [g for g in GPUS if g.matches_device_name(device_name or "")]
    return hits[0] if hits else None


def generic_spec(cc: tuple[int, int], sm_count: int | None = None) -> GPUSpec:
    """Best guess for an unknown GPU of compute capability ``cc``: the per-cc limits are exact; the
    chip numbers (L2, bandwidth, peaks) are those of the nearest lower known chip, peaks scaled by
    the SM count when it is known. Rough: only for ranking tiles, never for reporting. Memory:
    :data:`LARGEST_DRAM_BYTES`, so that a guess never refuses a size the GPU may hold."""
    cc = tuple(cc)
    lower = [g for g in GPUS if g.compute_capability <= cc]
    rep = max(lower, key=lambda g: g.compute_capability) if lower else GPUS[0]
    sms = sm_count or rep.sm_count
    scale = sms / rep.sm_count
    tc = {k: round(v * scale, 1) for k, v in rep.peak_tc_tflops}
    if cc < (7, 0):
        tc = {}
    major, minor = cc
    return _gpu("generic", f"generic sm_{major}{minor} (numbers scaled from {rep.name})", cc,
                tag="", tvm_tag=False, device_names=[], sm_count=sms, l2_bytes=rep.l2_bytes,
                dram_gb=LARGEST_DRAM_BYTES / GiB, bw=rep.dram_bandwidth_gbs,
                fp32=round(rep.peak_fp32_tflops * scale, 1), tc=tc,
                source=f"guess: per-cc limits + {rep.name} numbers")
