"""The GPU table: every row self-consistent, device names map to exactly one row."""

import pytest

from fastdlight.arch.table import (
    CC_LIMITS,
    GPUS,
    GPUS_BY_KEY,
    KB,
    LARGEST_DRAM_BYTES,
    MB,
    GiB,
    cc_limits,
    find_by_device_name,
    generic_spec,
    mma_shapes_for,
)

REQUIRED = {"v100", "t4", "a100-40gb", "a100-80gb", "a10", "l4", "rtx3090", "rtx4090",
            "h100-sxm", "h100-pcie", "h200"}


def test_required_gpus_present_and_unique():
    assert REQUIRED <= set(GPUS_BY_KEY)
    assert len({g.key for g in GPUS}) == len(GPUS)
    assert len({g.tag for g in GPUS}) == len(GPUS)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.key)
def test_row_self_consistent(gpu):
    cc = gpu.compute_capability
    assert isinstance(cc, tuple) and len(cc) == 2 and cc >= (7, 0)
    for field in ("sm_count", "regs_per_sm", "regs_per_block", "smem_per_sm", "smem_per_block",
                  "smem_per_block_optin", "max_threads_per_sm", "max_blocks_per_sm", "l2_bytes",
                  "dram_bandwidth_gbs", "peak_fp32_tflops"):
        assert getattr(gpu, field) > 0, field
    assert gpu.smem_per_block == 48 * KB
    assert gpu.smem_per_block <= gpu.smem_per_block_optin <= gpu.smem_per_sm
    assert gpu.regs_per_block <= gpu.regs_per_sm
    assert gpu.max_threads_per_sm >= 1024 and gpu.max_threads_per_sm % 32 == 0
    assert 1 * MB <= gpu.l2_bytes <= 256 * MB
    assert 100 <= gpu.dram_bandwidth_gbs <= 10000
    assert 16 * GiB <= gpu.dram_bytes <= LARGEST_DRAM_BYTES and gpu.dram_bytes % GiB == 0
    assert gpu.source and gpu.device_names and gpu.tag.startswith("nvidia/")
    # Tensor cores beat the CUDA cores, int8/fp8 are at least as fast as fp16.
    tc = dict(gpu.peak_tc_tflops)
    assert "float16" in tc
    assert all(v > gpu.peak_fp32_tflops for v in tc.values())
    for fast in ("int8", "float8"):
        if fast in tc:
            assert tc[fast] >= tc["float16"]
    # A tensor-core peak for a dtype means there is an MMA shape for it, and vice versa.
    shapes = mma_shapes_for(cc)
    in_dtypes = {"float8" if a.startswith("float8") else a for a, _ in shapes}
    assert set(tc) == in_dtypes
    assert gpu.arch_suffix in ("", "a")
    assert gpu.arch.startswith("sm_")
    # Peak FP32 ~ SMs x FP32 lanes x 2 x clock: clock must come out at a plausible 1.2-2.7 GHz.
    lanes = 64 if cc < (8, 6) else 128
    clock_ghz = gpu.peak_fp32_tflops * 1e3 / (gpu.sm_count * lanes * 2)
    assert 1.2 <= clock_ghz <= 2.7, clock_ghz


def test_datasheet_spot_checks():
    h100 = GPUS_BY_KEY["h100-sxm"]
    assert (h100.sm_count, h100.compute_capability, h100.arch) == (132, (9, 0), "sm_90a")
    assert h100.smem_per_block_optin == 227 * KB and h100.smem_per_sm == 228 * KB
    assert h100.l2_bytes == 50 * MB
    a100 = GPUS_BY_KEY["a100-40gb"]
    assert (a100.sm_count, a100.smem_per_block_optin, a100.arch) == (108, 163 * KB, "sm_80")
    assert GPUS_BY_KEY["h200"].dram_bandwidth_gbs > h100.dram_bandwidth_gbs
    assert GPUS_BY_KEY["h100-pcie"].sm_count == 114
    assert GPUS_BY_KEY["rtx4090"].max_blocks_per_sm == 24
    assert GPUS_BY_KEY["t4"].max_threads_per_sm == 1024
    # memory: the datasheet's GB read as GiB, above what the device reports (an H100 80GB: 85.0e9 bytes)
    assert h100.dram_bytes == 80 * GiB > 85.0e9 and GPUS_BY_KEY["h200"].dram_bytes == 141 * GiB
    assert GPUS_BY_KEY["t4"].dram_bytes == 16 * GiB and GPUS_BY_KEY["a100-40gb"].dram_bytes == 40 * GiB


@pytest.mark.parametrize("device_name,key", [
    ("Tesla V100-SXM2-16GB", "v100"), ("Tesla T4", "t4"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("NVIDIA A10", "a10"), ("NVIDIA L4", "l4"), ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("NVIDIA A10G", None), ("NVIDIA L40S", None), ("NVIDIA GeForce RTX 3090 Ti", None),
    ("NVIDIA GeForce RTX 4090 D", None), ("NVIDIA H100 NVL", None), ("NVIDIA GH200 480GB", None),
    ("NVIDIA B200", None),
])
def test_device_name_matches_one_row(device_name, key):
    hits = [g.key for g in GPUS if g.matches_device_name(device_name)]
    assert hits == ([key] if key else [])
    found = find_by_device_name(device_name)
    assert (found.key if found else None) == key


def test_cc_limits_nearest_lower():
    assert cc_limits((10, 3)) == CC_LIMITS[(10, 0)]
    assert cc_limits((12, 1)) == CC_LIMITS[(12, 0)]
    assert cc_limits((8, 6)).max_threads_per_sm == 1536
    assert cc_limits((3, 5)) == CC_LIMITS[min(CC_LIMITS)]
    for lim in CC_LIMITS.values():
        assert 48 * KB <= lim.smem_per_block_optin <= lim.smem_per_sm


def test_mma_shapes_per_generation():
    assert mma_shapes_for((7, 0)) == {("float16", "float32"): (16, 16, 16),
                                      ("float16", "float16"): (16, 16, 16)}
    assert mma_shapes_for((7, 5))[("int8", "int32")] == (8, 8, 16)
    assert ("bfloat16", "float32") not in mma_shapes_for((7, 5))
    ampere = mma_shapes_for((8, 0))
    assert ampere[("bfloat16", "float32")] == (16, 8, 16)
    assert ampere[("int8", "int32")] == (16, 8, 32)
    assert ("float8_e4m3fn", "float32") not in ampere
    assert mma_shapes_for((8, 9))[("float8_e4m3fn", "float32")] == (16, 8, 32)
    assert mma_shapes_for((12, 0))[("float16", "float32")] == (16, 8, 16)
    assert mma_shapes_for((6, 1)) == {}


def test_generic_spec_scales_with_sm_count():
    base = generic_spec((9, 0))
    half = generic_spec((9, 0), sm_count=66)
    assert base.key == "generic" and base.sm_count == 132
    assert half.peak_fp32_tflops == pytest.approx(base.peak_fp32_tflops / 2, rel=0.01)
    assert generic_spec((12, 0)).smem_per_block_optin == 99 * KB
    assert dict(generic_spec((6, 1)).peak_tc_tflops) == {}


def test_a_generic_gpu_refuses_no_size_a_gpu_may_hold():
    assert generic_spec((10, 0)).dram_bytes == LARGEST_DRAM_BYTES >= max(g.dram_bytes for g in GPUS)
