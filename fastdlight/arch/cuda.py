"""CUDA hardware model (PROVISIONAL skeleton: the arch helper replaces this with the full
table-driven version; the attribute names below are the contract other modules rely on)."""

from __future__ import annotations

import tvm
from tvm.target import Target


class CUDA:
    """Attributes (units in the name or comment):

    name, target (tvm Target), compute_capability (tuple, e.g. (9, 0)), arch ("sm_90a", what nvcc
    gets), sm_count, warp_size, max_threads_per_block, max_threads_per_sm, max_blocks_per_sm,
    regs_per_sm, regs_per_block, max_regs_per_thread, smem_per_block (bytes, default 48 KB),
    smem_per_block_optin (bytes), smem_per_sm (bytes), l2_bytes, dram_bandwidth_gbs,
    peak_fp32_tflops, peak_tc_tflops (dict dtype -> TFLOPS), transaction_bytes_read (128),
    transaction_bytes_write (32), mma_shapes (dict (in_dtype, acc_dtype) -> (m, n, k)),
    has_async_copy, has_wgmma, has_tma.
    """

    def __init__(self, target="nvidia/nvidia-h100"):
        if isinstance(target, str):
            target = Target(target)
        if target.kind.name != "cuda":
            raise ValueError(f"fastdlight.arch.CUDA needs a CUDA target, got kind {target.kind.name!r}")
        self.target = target
        arch = str(target.attrs.get("arch", "sm_90a"))
        digits = "".join(c for c in arch[3:] if c.isdigit())
        self.arch = arch
        self.compute_capability = (int(digits[:-1]), int(digits[-1]))
        self.name = "H100 SXM" if self.compute_capability == (9, 0) else "A100"
        self.sm_count = 132 if self.compute_capability == (9, 0) else 108
        self.warp_size = 32
        self.max_threads_per_block = 1024
        self.max_threads_per_sm = 2048
        self.max_blocks_per_sm = 32
        self.regs_per_sm = 65536
        self.regs_per_block = 65536
        self.max_regs_per_thread = 255
        self.smem_per_block = 48 * 1024
        self.smem_per_block_optin = 227 * 1024 if self.compute_capability == (9, 0) else 163 * 1024
        self.smem_per_sm = 228 * 1024 if self.compute_capability == (9, 0) else 164 * 1024
        self.l2_bytes = 50 * 2**20 if self.compute_capability == (9, 0) else 40 * 2**20
        self.dram_bandwidth_gbs = 3350 if self.compute_capability == (9, 0) else 1555
        self.peak_fp32_tflops = 67.0 if self.compute_capability == (9, 0) else 19.5
        self.peak_tc_tflops = {"float16": 989.0, "bfloat16": 989.0, "int8": 1979.0}
        self.transaction_bytes_read = 128
        self.transaction_bytes_write = 32
        self.mma_shapes = {
            ("float16", "float32"): (16, 8, 16),
            ("float16", "float16"): (16, 8, 16),
            ("bfloat16", "float32"): (16, 8, 16),
            ("int8", "int32"): (16, 8, 32),
        }
        self.has_async_copy = self.compute_capability >= (8, 0)
        self.has_wgmma = self.compute_capability == (9, 0)
        self.has_tma = self.compute_capability >= (9, 0)

    @classmethod
    def from_device(cls, device) -> "CUDA":
        return cls(Target.from_device(device))


def has_gpu() -> bool:
    """True when a CUDA GPU (and its driver) is usable from this process."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no runtime, no driver: no GPU
        return False


def auto_arch(target=None) -> CUDA:
    """The arch for ``target``, else the live GPU, else the built-in H100 model."""
    if target is not None:
        return target if isinstance(target, CUDA) else CUDA(target)
    if has_gpu():
        return CUDA.from_device(tvm.cuda(0))
    return CUDA("nvidia/nvidia-h100")
