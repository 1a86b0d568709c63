"""fastdlight.arch.CUDA: targets, tags, arch parsing, device path, errors."""

import warnings

import pytest
import tvm
from tvm.target import Target

from fastdlight.arch import CUDA, auto_arch
from fastdlight.arch import cuda as cuda_mod
from fastdlight.arch.cuda import parse_compute_version, parse_sm
from fastdlight.arch.table import GPUS, GPUS_BY_KEY, KB, MB

CONTRACT = ("name", "target", "compute_capability", "arch", "sm_count", "warp_size",
            "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm",
            "regs_per_block", "max_regs_per_thread", "smem_per_block", "smem_per_block_optin",
            "smem_per_sm", "l2_bytes", "dram_bytes", "dram_bandwidth_gbs", "peak_fp32_tflops", "peak_tc_tflops",
            "transaction_bytes_read", "transaction_bytes_write", "mma_shapes", "has_async_copy",
            "has_wgmma", "has_tma")


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("tag,key,cc,sms", [
    ("nvidia/nvidia-h100", "h100-sxm", (9, 0), 132),
    ("nvidia/nvidia-a100", "a100-40gb", (8, 0), 108),
    ("nvidia/nvidia-a10", "a10", (8, 6), 72),
    ("nvidia/nvidia-t4", "t4", (7, 5), 40),
    ("nvidia/nvidia-v100", "v100", (7, 0), 80),
    ("nvidia/geforce-rtx-4090", "rtx4090", (8, 9), 128),
    ("nvidia/geforce-rtx-3090", "rtx3090", (8, 6), 82),
    # Chips TVM has no tag for: fastdlight's own tags.
    ("nvidia/nvidia-h200", "h200", (9, 0), 132),
    ("nvidia/nvidia-h100-pcie", "h100-pcie", (9, 0), 114),
    ("nvidia/nvidia-l4", "l4", (8, 9), 58),
    ("nvidia/nvidia-a100-80gb", "a100-80gb", (8, 0), 108),
])
def test_tags(tag, key, cc, sms, no_warnings):
    a = CUDA(tag)
    assert a.spec is GPUS_BY_KEY[key] and not a.is_generic
    assert a.compute_capability == cc and a.sm_count == sms
    assert a.target.kind.name == "cuda" and a.target.tag == tag == a.tag
    assert parse_sm(a.target.attrs["arch"])[0] == cc
    for attr in CONTRACT:
        assert hasattr(a, attr), attr
    # The target round-trips to the same row, also through its JSON export.
    assert CUDA(a.target).spec is a.spec
    assert CUDA(str(a.target)).spec is a.spec


def test_h100_details(no_warnings):
    a = CUDA("nvidia/nvidia-h100")
    assert a.arch == "sm_90a" and a.has_wgmma and a.has_tma and a.has_async_copy
    assert a.max_smem_per_block() == 227 * KB and a.max_smem_per_block(optin=False) == 48 * KB
    assert a.l2_bytes == 50 * MB and a.dram_bandwidth_gbs == 3350
    assert a.mma_shape("float16", "float32") == (16, 8, 16)
    assert a.mma_shape("int8", "int32") == (16, 8, 32)
    assert a.mma_shape("float32", "float32") is None
    assert a.tc_peak("float8_e4m3fn") == a.peak_tc_tflops["float8"] > a.tc_peak("float16")
    assert (a.transaction_bytes_read, a.transaction_bytes_write) == (128, 32)
    text = str(a)
    for piece in ("H100", "(9, 0)", "132 SMs", "227 KB", "50 MB", "3350 GB/s", "989.4", "wgmma"):
        assert piece in text, piece
    assert "\n" in text and "H100" in repr(a)


def test_feature_flags_by_generation(no_warnings):
    v100, t4, a100 = CUDA("nvidia/nvidia-v100"), CUDA("nvidia/nvidia-t4"), CUDA("nvidia/nvidia-a100")
    assert not v100.has_async_copy and not t4.has_async_copy and a100.has_async_copy
    assert not a100.has_tma and not a100.has_wgmma
    assert v100.mma_shape("float16", "float32") == (16, 16, 16)
    assert v100.mma_shape("int8", "int32") is None and v100.tc_peak("bfloat16") is None
    assert t4.mma_shape("int8", "int32") == (8, 8, 16)
    # The Dlight workaround target (sm_90, not sm_90a) is still an H100, but without wgmma.
    plain = CUDA(Target({"tag": "nvidia/nvidia-h100", "arch": "sm_90"}))
    assert plain.name == CUDA("nvidia/nvidia-h100").name and plain.arch == "sm_90"
    assert plain.has_tma and not plain.has_wgmma


@pytest.mark.parametrize("arch,cc,suffix", [
    ("sm_90a", (9, 0), "a"), ("sm_90", (9, 0), ""), ("sm_100a", (10, 0), "a"),
    ("sm_120", (12, 0), ""), ("sm_86", (8, 6), ""), ("sm_103a", (10, 3), "a"),
    ("sm_110a", (11, 0), "a"), ("sm_75", (7, 5), ""),
])
def test_parse_sm(arch, cc, suffix):
    assert parse_sm(arch) == (cc, suffix)


def test_parse_sm_orders_numerically_and_rejects_garbage():
    assert parse_sm("sm_100a")[0] > parse_sm("sm_90a")[0] > parse_sm("sm_89")[0]
    assert parse_sm("sm_120")[0] > parse_sm("sm_100")[0]
    for bad in ("compute_90", "sm_9", "90", "sm_90xy"):
        with pytest.raises(ValueError):
            parse_sm(bad)
    assert parse_compute_version("9.0") == (9, 0)
    assert parse_compute_version("12.0") == (12, 0)


@pytest.mark.parametrize("arch,cc", [("sm_100a", (10, 0)), ("sm_120", (12, 0)), ("sm_86", (8, 6)),
                                     ("sm_80", (8, 0))])
def test_legacy_arch_strings(arch, cc):
    with pytest.warns(UserWarning, match="names no known GPU"):
        a = CUDA(f"cuda -arch={arch}")
    assert a.compute_capability == cc and a.arch == arch and a.is_generic
    assert a.has_tma == (cc >= (9, 0)) and a.has_async_copy
    assert not a.has_wgmma  # wgmma is Hopper-only (Blackwell uses tcgen05)
    assert a.smem_per_block_optin <= a.smem_per_sm and a.sm_count > 0


def test_unknown_tag_warns_and_works():
    with pytest.warns(UserWarning, match="nvidia-b100"):
        a = CUDA("nvidia/nvidia-b100")
    assert a.compute_capability == (10, 0) and a.arch == "sm_100a" and a.is_generic
    assert a.l2_bytes == int(a.target.attrs["l2_cache_size_bytes"])
    assert a.mma_shape("float16", "float32") == (16, 8, 16)
    assert "generic" in str(a)


def test_ambiguous_target_object_warns():
    # TVM's A10 and RTX 3090 tags carry identical attributes: the object alone cannot tell.
    with pytest.warns(UserWarning, match="several GPUs"):
        a = CUDA(Target("nvidia/geforce-rtx-3090"))
    assert a.compute_capability == (8, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert CUDA(Target("nvidia/nvidia-h100")).sm_count == 132  # unique by attributes


@pytest.mark.parametrize("target", ["llvm", Target("llvm"), {"kind": "llvm"}, "llvm -mcpu=x86-64"])
def test_non_cuda_target_raises(target):
    with pytest.raises(ValueError, match="llvm"):
        CUDA(target)


@pytest.mark.parametrize("bad", ["nvidia/not-a-gpu", "foo/bar"])
def test_bad_tag_raises(bad):
    with pytest.raises(ValueError, match="unknown target tag"):
        CUDA(bad)


def test_bad_type_raises():
    with pytest.raises(TypeError):
        CUDA(42)


class FakeDevice:
    """Same attributes as tvm.runtime.Device for a CUDA GPU."""

    def __init__(self, name="NVIDIA H100 80GB HBM3", cc="9.0", sms=132, l2=50 * MB):
        self.device_name = name
        self.compute_version = cc
        self.multi_processor_count = sms
        self.l2_cache_size_bytes = l2
        self.max_shared_memory_per_block = 48 * KB
        self.warp_size = 32
        self.max_threads_per_block = 1024
        self.exist = True


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "h100-sxm"),
                                      ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200")])
def test_fake_device_hopper(name, key, no_warnings):
    spec = GPUS_BY_KEY[key]
    a = CUDA.from_device(FakeDevice(name, sms=spec.sm_count))
    assert a.spec is spec and a.device_name == name and a.sm_count == spec.sm_count
    assert a.arch == "sm_90a" and a.has_wgmma  # Target.from_device would say sm_90
    assert a.target.attrs["arch"] == "sm_90a" and a.target.kind.name == "cuda"
    assert a.smem_per_block_optin == 227 * KB and a.dram_bandwidth_gbs == spec.dram_bandwidth_gbs
    assert CUDA(a.target).spec is spec  # the device-built target maps back to the row
    assert CUDA(FakeDevice(name)).name == a.name  # CUDA() accepts a device directly


def test_fake_device_reported_values_win(no_warnings):
    a = CUDA.from_device(FakeDevice("NVIDIA A100-SXM4-80GB", cc="8.0", sms=98, l2=40 * MB))
    assert a.spec.key == "a100-80gb" and a.sm_count == 98 and a.arch == "sm_80"
    assert a.l2_bytes == 40 * MB and not a.has_wgmma
    assert a.dram_bytes == a.spec.dram_bytes  # the fake reports no memory: the table's bound
    dev = FakeDevice("NVIDIA A100-SXM4-80GB", cc="8.0")
    dev.total_global_memory = 85_198_045_184
    assert CUDA.from_device(dev).dram_bytes == 85_198_045_184


def test_str_shows_the_memory(no_warnings):
    assert "DRAM 80 GiB, 3350 GB/s" in str(CUDA("nvidia/nvidia-h100"))


def test_unknown_device_warns_and_works():
    with pytest.warns(UserWarning, match="unknown GPU"):
        a = CUDA.from_device(FakeDevice("NVIDIA B200", cc="10.0", sms=148, l2=126 * MB))
    assert a.is_generic and a.name == "NVIDIA B200" and a.compute_capability == (10, 0)
    assert a.sm_count == 148 and a.l2_bytes == 126 * MB and a.arch == "sm_100"
    assert a.peak_fp32_tflops > 0 and a.mma_shape("bfloat16", "float32") == (16, 8, 16)
    assert a.target.attrs["arch"] == "sm_100"


def test_non_cuda_device_raises():
    with pytest.raises(ValueError, match="cpu"):
        CUDA(tvm.cpu(0))


def test_auto_arch_passthrough():
    a = CUDA("nvidia/nvidia-a100")
    assert auto_arch(a) is a
    assert auto_arch("nvidia/nvidia-t4").sm_count == 40
    assert CUDA(a).spec is a.spec


@pytest.mark.gpu
def test_live_device_agrees_with_table():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CI GPU (H100) must be in the table
        a = CUDA.from_device(tvm.cuda(0))
    spec = a.spec
    assert not a.is_generic and a.spec in GPUS
    assert a.sm_count == spec.sm_count
    assert a.compute_capability == spec.compute_capability
    assert abs(a.l2_bytes - spec.l2_bytes) <= 0.1 * spec.l2_bytes
    assert a.smem_per_block == 48 * KB and a.warp_size == 32
    assert auto_arch().name == a.name


@pytest.mark.parametrize("target", ["cuda -arch=sm_90", {"kind": "cuda", "arch": "sm_90"}, "cuda"])
def test_a_bare_cuda_target_resolves_to_the_live_gpu(target, monkeypatch, no_warnings):
    monkeypatch.setattr(cuda_mod, "live_device", lambda: FakeDevice("NVIDIA H200", sms=132, l2=60 * MB))
    if target == "cuda":  # TVM picks the arch from the local GPU; without one it says sm_50
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    a = CUDA(target)
    assert a.spec is GPUS_BY_KEY["h200"] and a.device_name == "NVIDIA H200"
    assert a.arch == "sm_90a" and a.has_wgmma and a.target.attrs["arch"] == "sm_90a"
    # a tag still means that GPU, and another compute capability is not this GPU
    assert CUDA("nvidia/nvidia-a100").name != a.name
    with pytest.warns(UserWarning, match="generic"):
        assert CUDA("cuda -arch=sm_80").device_name is None
