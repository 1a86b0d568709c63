"""CUDA hardware model: what a policy needs to know about the GPU it tunes for.

Built from a TVM target (object, tag string, JSON dict, or legacy "cuda -arch=sm_80" string) or
from a live ``tvm.runtime.Device``; the chip numbers come from ``table.GPUS``.
"""

from __future__ import annotations

import json
import re
import warnings
from functools import lru_cache

import tvm
from tvm.target import Target

from fastdlight.arch.stacklevel import caller_stacklevel
from fastdlight.arch.table import (
    GPUS,
    GPUS_BY_TAG,
    KB,
    MB,
    GiB,
    GPUSpec,
    find_by_device_name,
    generic_spec,
    mma_shapes_for,
)

_SM_RE = re.compile(r"^sm_(\d+)([a-z]?)$")
# Target attributes that tell TVM's nvidia/* tags apart (besides the compute capability).
_SIGNATURE_KEYS = ("l2_cache_size_bytes", "max_shared_memory_per_block", "registers_per_block",
                   "max_threads_per_block")


def parse_sm(arch: str) -> tuple[tuple[int, int], str]:
    """``"sm_90a"`` -> ``((9, 0), "a")``; ``"sm_100a"`` -> ``((10, 0), "a")``; ``"sm_86"`` ->
    ``((8, 6), "")``. The last digit is the minor version, the rest the major one."""
    m = _SM_RE.match(str(arch).strip())
    if not m:
        raise ValueError(f"cannot parse CUDA arch {arch!r}; expected e.g. 'sm_80', 'sm_90a', 'sm_120'")
    digits, suffix = m.groups()
    if len(digits) < 2:
        raise ValueError(f"cannot parse CUDA arch {arch!r}: need major and minor digits")
    return (int(digits[:-1]), int(digits[-1])), suffix


def parse_compute_version(version: str) -> tuple[int, int]:
    """``"9.0"`` (what ``Device.compute_version`` returns) -> ``(9, 0)``; ``"12.0"`` -> ``(12, 0)``."""
    major, _, minor = str(version).strip().partition(".")
    return int(major), int(minor or 0)


@lru_cache(maxsize=1)
def _tvm_tags() -> frozenset:
    import tvm_ffi  # noqa: PLC0415 - only needed to list TVM's registered tags

    return frozenset(tvm_ffi.get_global_func("target.TargetTagListTags")())


@lru_cache(maxsize=None)
def _tag_signature(tag: str):
    return _target_signature(Target(tag))


def _target_signature(target: Target):
    cc, _ = parse_sm(target.attrs["arch"])
    return cc, tuple(_plain(target.attrs.get(k)) for k in _SIGNATURE_KEYS)


def _plain(value):
    return None if value is None else int(value)


def _spec_target(spec: GPUSpec) -> Target:
    """TVM's tag when it has one, else a target carrying our tag name and the table's numbers."""
    if spec.tvm_tag:
        return Target({"tag": spec.tag})
    return Target({
        "kind": "cuda", "tag": spec.tag, "arch": spec.arch, "max_num_threads": 1024,
        "max_threads_per_block": 1024, "thread_warp_size": 32,
        "max_shared_memory_per_block": spec.smem_per_block, "registers_per_block": spec.regs_per_block,
        "l2_cache_size_bytes": spec.l2_bytes,
    })


def _parse_cli(text: str) -> dict:
    """Legacy ``"cuda -arch=sm_80 -max_shared_memory_per_block=49152"`` -> JSON-dict form (TVM 0.27
    no longer parses option strings)."""
    kind, *opts = text.split()
    spec = {"kind": kind}
    for opt in opts:
        key, eq, value = opt.lstrip("-").partition("=")
        if not eq:
            raise ValueError(f"cannot parse target option {opt!r} in {text!r}")
        spec[key] = int(value) if value.isdigit() else value
    return spec


def _to_target(target) -> tuple[Target, str]:
    """Any accepted target form -> (tvm Target, tag name or "")."""
    if isinstance(target, Target):
        return target, str(target.tag or "")
    if isinstance(target, dict):
        return _make_target(target, target), str(target.get("tag", ""))
    if not isinstance(target, str):
        raise TypeError(f"CUDA() takes a Target, tag string, dict or Device, got {type(target).__name__}")
    text = target.strip()
    if text.startswith("{"):
        return _to_target(json.loads(text))
    if " " in text:
        return _make_target(_parse_cli(text), text), ""
    if "/" in text:  # a tag: TVM's own, or one of ours for chips TVM has no tag for
        if text in GPUS_BY_TAG and not GPUS_BY_TAG[text].tvm_tag:
            return _spec_target(GPUS_BY_TAG[text]), text
        if text not in _tvm_tags():
            ours = sorted(g.tag for g in GPUS)
            raise ValueError(f"unknown target tag {text!r}: neither a TVM tag (see "
                             f"target.TargetTagListTags) nor one of fastdlight's {ours}")
        return Target({"tag": text}), text
    return _make_target(text, text), ""


def _make_target(spec, shown) -> Target:
    try:
        return Target(spec)
    except Exception as err:  # noqa: BLE001 - TVM raises several error types for a bad spec
        raise ValueError(f"cannot build a TVM target from {shown!r}: {err}") from err


def _spec_for_target(target: Target, tag: str) -> GPUSpec:
    """The table row a target describes: by tag name, else by arch + tag attributes."""
    cc, _ = parse_sm(target.attrs["arch"])
    if tag:
        if tag in GPUS_BY_TAG:
            return GPUS_BY_TAG[tag]
        warnings.warn(f"fastdlight.arch: no table entry for GPU tag {tag!r}; using generic "
                      f"sm_{cc[0]}{cc[1]} defaults (SM count, bandwidth and peaks are guesses)",
                      stacklevel=caller_stacklevel())
        return generic_spec(cc)
    signature = _target_signature(target)
    hits = [g for g in GPUS if g.tvm_tag and _tag_signature(g.tag) == signature]
    if len(hits) > 1:
        warnings.warn(f"fastdlight.arch: target {target} matches several GPUs "
                      f"({', '.join(g.name for g in hits)}); using {hits[0].name}. Pass the tag "
                      f"string, or Target({{'tag': ...}}), to choose", stacklevel=caller_stacklevel())
    if hits:
        return hits[0]
    warnings.warn(f"fastdlight.arch: target {target} names no known GPU; using generic "
                  f"sm_{cc[0]}{cc[1]} defaults (SM count, bandwidth and peaks are guesses)",
                  stacklevel=caller_stacklevel())
    return generic_spec(cc)


def _is_device(obj) -> bool:
    """A tvm Device, or a look-alike (tests). Never touches a tvm Device's properties: they raise
    when the CUDA runtime is missing."""
    if isinstance(obj, tvm.runtime.Device):
        return True
    return not isinstance(obj, (str, dict, Target)) and hasattr(obj, "multi_processor_count")


class CUDA:
    """Attributes (units in the name or comment):

    name, target (tvm Target), compute_capability (tuple, e.g. (9, 0)), arch ("sm_90a", what nvcc
    gets), sm_count, warp_size, max_threads_per_block, max_threads_per_sm, max_blocks_per_sm,
    regs_per_sm, regs_per_block, max_regs_per_thread, smem_per_block (bytes, default 48 KB),
    smem_per_block_optin (bytes), smem_per_sm (bytes), l2_bytes, dram_bytes, dram_bandwidth_gbs,
    peak_fp32_tflops, peak_tc_tflops (dict dtype -> TFLOPS), transaction_bytes_read (128),
    transaction_bytes_write (32), mma_shapes (dict (in_dtype, acc_dtype) -> (m, n, k)),
    has_async_copy, has_wgmma, has_tma.

    Also: tag (TVM or fastdlight tag name, "" if none), spec (the ``table.GPUSpec`` row used),
    is_generic (True when no table row matched: chip numbers are guesses), device_name (live
    device only, else None).

    Semantics:
    - compute_capability and arch follow the target's "arch" (what code is compiled for).
    - dram_bytes: the device's memory where a live device reports it, else the table's bound (a
      generic GPU: the largest any GPU has); sizes beyond it are refused before tuning.
    - peak_tc_tflops: dense, fp32 accumulator (int32 for int8); keys float16, bfloat16, int8,
      float8 (both e4m3/e5m2; ``tc_peak(dtype)`` maps TVM dtype names).
    - mma_shapes: mma.sync/wmma shapes (see ``table.mma_shapes_for``), not wgmma shapes.
    - has_wgmma: True only for cc (9, 0) compiled as "sm_90a": wgmma is arch-specific PTX and
      ptxas rejects it for plain sm_90. A target built with arch "sm_90" (e.g. the Dlight workaround)
      therefore has has_wgmma False although the chip has it.
    - has_tma: cc >= (9, 0) (cp.async.bulk.tensor is plain sm_90 PTX); has_async_copy: cc >= (8, 0).
    """

    transaction_bytes_read = 128  # one L1/L2 read transaction (a full cache line)
    transaction_bytes_write = 32  # one DRAM write sector

    def __init__(self, target="nvidia/nvidia-h100"):
        if isinstance(target, CUDA):
            self.__dict__.update(target.__dict__)
            return
        if _is_device(target):
            self._init_from_device(target)
            return
        tvm_target, tag = _to_target(target)
        if tvm_target.kind.name != "cuda":
            raise ValueError(f"fastdlight.arch.CUDA needs a CUDA target, got kind "
                             f"{tvm_target.kind.name!r} ({target!r})")
        live = None if tag else live_device_matching(tvm_target)
        if live is not None:  # a bare CUDA target on this machine's GPU: that GPU's row
            self._init_from_device(live)
            return
        spec = _spec_for_target(tvm_target, tag)
        self._fill(spec, str(tvm_target.attrs["arch"]))
        self.target = tvm_target
        self.tag = tag or spec.tag
        l2 = tvm_target.attrs.get("l2_cache_size_bytes")
        if self.is_generic and l2:
            self.l2_bytes = int(l2)

    @classmethod
    def from_device(cls, device) -> "CUDA":
        """From a live ``tvm.cuda(i)`` (or any object with the same attributes)."""
        return cls(device)

    def _init_from_device(self, dev) -> None:
        if hasattr(dev, "dlpack_device_type"):
            kind = tvm.runtime.Device._DEVICE_TYPE_TO_NAME.get(dev.dlpack_device_type(), "?")
            if kind != "cuda":
                raise ValueError(f"fastdlight.arch.CUDA needs a CUDA device, got {kind!r} ({dev})")
        if not getattr(dev, "exist", True):
            raise ValueError(f"CUDA device {dev} does not exist (no GPU or no driver)")
        cc = parse_compute_version(dev.compute_version)
        device_name = str(dev.device_name)
        sm_count = int(dev.multi_processor_count)
        spec = find_by_device_name(device_name)
        if spec is not None and spec.compute_capability != cc:
            spec = None  # a name collision with another generation: trust what the device says
        if spec is None:
            warnings.warn(f"fastdlight.arch: unknown GPU {device_name!r} (cc {cc}); using generic "
                          f"per-compute-capability defaults for what the device does not report",
                          stacklevel=caller_stacklevel())
            spec = generic_spec(cc, sm_count)
        self._fill(spec, f"sm_{cc[0]}{cc[1]}{spec.arch_suffix}")
        self.device_name = device_name
        if spec.key == "generic":
            self.name = device_name
        # What the device reports wins over the table.
        self.sm_count = sm_count
        self.warp_size = int(dev.warp_size)
        self.max_threads_per_block = int(dev.max_threads_per_block)
        self.smem_per_block = int(dev.max_shared_memory_per_block)
        l2 = getattr(dev, "l2_cache_size_bytes", None)
        if l2:
            self.l2_bytes = int(l2)
        dram = getattr(dev, "total_global_memory", None)
        if dram:
            self.dram_bytes = int(dram)
        self.tag = spec.tag
        self.target = Target({
            "kind": "cuda", "tag": spec.tag, "arch": self.arch,
            "max_num_threads": self.max_threads_per_block,
            "max_threads_per_block": self.max_threads_per_block, "thread_warp_size": self.warp_size,
            "max_shared_memory_per_block": self.smem_per_block,
            "registers_per_block": self.regs_per_block, "l2_cache_size_bytes": self.l2_bytes,
        })

    def _fill(self, spec: GPUSpec, arch: str) -> None:
        cc, suffix = parse_sm(arch)
        self.spec = spec
        self.is_generic = spec.key == "generic"
        self.name = spec.name
        self.device_name = None
        self.arch = arch
        self.compute_capability = cc
        self.sm_count = spec.sm_count
        self.warp_size = 32
        self.max_threads_per_block = 1024
        self.max_threads_per_sm = spec.max_threads_per_sm
        self.max_blocks_per_sm = spec.max_blocks_per_sm
        self.regs_per_sm = spec.regs_per_sm
        self.regs_per_block = spec.regs_per_block
        self.max_regs_per_thread = 255
        self.smem_per_block = spec.smem_per_block
        self.smem_per_block_optin = spec.smem_per_block_optin
        self.smem_per_sm = spec.smem_per_sm
        self.l2_bytes = spec.l2_bytes
        self.dram_bytes = spec.dram_bytes
        self.dram_bandwidth_gbs = spec.dram_bandwidth_gbs
        self.peak_fp32_tflops = spec.peak_fp32_tflops
        self.peak_tc_tflops = dict(spec.peak_tc_tflops)
        self.mma_shapes = mma_shapes_for(cc)
        self.has_async_copy = cc >= (8, 0)
        self.has_tma = cc >= (9, 0)
        self.has_wgmma = cc == (9, 0) and suffix == "a"

    # -- helpers -------------------------------------------------------------------------------
    def max_smem_per_block(self, optin: bool = True) -> int:
        """Shared memory one block may use, in bytes (opt-in maximum, or the default 48 KB)."""
        return self.smem_per_block_optin if optin else self.smem_per_block

    def mma_shape(self, in_dtype: str, acc_dtype: str = "float32"):
        """(m, n, k) of the warp MMA instruction for these dtypes, or None (no tensor-core path)."""
        return self.mma_shapes.get((str(in_dtype), str(acc_dtype)))

    def tc_peak(self, dtype: str):
        """Dense tensor-core TFLOPS for input ``dtype`` (any float8_* maps to "float8"), or None."""
        dtype = str(dtype)
        return self.peak_tc_tflops.get("float8" if dtype.startswith("float8") else dtype)

    def __repr__(self) -> str:
        return f"CUDA({self.name!r}, {self.arch}, {self.sm_count} SMs)"

    def __str__(self) -> str:
        tc = ", ".join(f"{k} {v:g}" for k, v in self.peak_tc_tflops.items()) or "none"
        mma = ", ".join(f"{a}->{c} m{m}n{n}k{k}" for (a, c), (m, n, k) in self.mma_shapes.items())
        feats = [f for f, on in (("cp.async", self.has_async_copy), ("TMA", self.has_tma),
                                 ("wgmma", self.has_wgmma)) if on]
        lines = [
            f"CUDA {self.name}" + (" (generic guess)" if self.is_generic else ""),
            f"  tag {self.tag or '-'}, arch {self.arch}, compute capability {self.compute_capability}"
            + (f", device {self.device_name!r}" if self.device_name else ""),
            f"  {self.sm_count} SMs, warp {self.warp_size}, {self.max_threads_per_block} threads/block,"
            f" {self.max_threads_per_sm} threads/SM, {self.max_blocks_per_sm} blocks/SM",
            f"  registers {self.regs_per_sm}/SM, {self.regs_per_block}/block,"
            f" {self.max_regs_per_thread}/thread",
            f"  shared memory {self.smem_per_block // KB} KB/block (opt-in"
            f" {self.smem_per_block_optin // KB} KB), {self.smem_per_sm // KB} KB/SM",
            f"  L2 {self.l2_bytes / MB:g} MB, DRAM {self.dram_bytes / GiB:.3g} GiB"
            + (" (at most: unknown GPU)" if self.is_generic and self.device_name is None else "")
            + f", {self.dram_bandwidth_gbs:g} GB/s",
            f"  peak FP32 {self.peak_fp32_tflops:g} TFLOPS; tensor cores (dense, TFLOPS): {tc}",
            f"  mma shapes: {mma or 'none'}",
            f"  features: {', '.join(feats) or 'none'}",
        ]
        return "\n".join(lines)


def live_device():
    """``tvm.cuda(0)`` when a CUDA GPU is usable here, else None."""
    return tvm.cuda(0) if has_gpu() else None


def live_device_matching(target: Target):
    """The live GPU, when ``target`` names no GPU (``Target("cuda")``, ``Target.from_device``,
    ``"cuda -arch=sm_90"``) and its compute capability is the live GPU's: such a target means
    "this machine's GPU", whose hardware row (and arch-specific ``sm_90a``) the device gives."""
    dev = live_device()
    if dev is None:
        return None
    try:
        same = parse_sm(str(target.attrs["arch"]))[0] == parse_compute_version(dev.compute_version)
    except (KeyError, ValueError):
        return None
    return dev if same else None


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
