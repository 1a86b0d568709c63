"""Kernels built for sm_90+ are launched as programmatic dependents: TVM's launch tag (before the
dynamic-shared-memory tag, which must stay last) and ``griddepcontrol.wait`` before the kernel's
first access to global memory; none on sm_80, none when switched off; scheduled (s_tir) kernels
and TIRx kernels alike."""

import re

import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.decode_attention import DecodeAttentionShape, decode_split_func, match_decode_split
from fastdlight.arch import CUDA
from fastdlight.compiler import compile as cc
from fastdlight.compiler.dependent_launch import (
    COOPERATIVE_TAG,
    DYN_SMEM_TAG,
    LAUNCH_PARAMS,
    PDL_TAG,
    is_kernel,
    launch_tags,
    with_dependent_launch,
)
from fastdlight.policies.decode_attention import decode_attention_configs
from fastdlight.policies.default import DefaultPolicy
from fastdlight.schedules.decode_attention import DecodeAttentionTemplate
from fastdlight.schedules.dispatch import apply_config

H100 = CUDA(tvm.target.Target("nvidia/nvidia-h100"))
SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
SM80 = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})


def gemv_module(target) -> tvm.IRModule:
    func = ops.gemv(4096, 4096).func
    config = DefaultPolicy(func, H100).emit_config(1)[0]
    with target:
        return apply_config(func, config).mod


def decode_module(target) -> tvm.IRModule:
    func = decode_split_func(DecodeAttentionShape(1, 32, 1, 128, 17, False), 4096)
    config = decode_attention_configs(match_decode_split(func), H100)[0]
    with target:
        return tvm.IRModule({"main": DecodeAttentionTemplate().apply_config(func, config)})


def lowered_kernels(mod: tvm.IRModule, target) -> list:
    """The device kernels of ``mod`` after fastdlight's lowering for ``target``."""
    lower, _, _ = tvm.tirx.get_tir_pipeline(cc.tir_pipeline(mod))
    mod = tvm.tirx.transform.BindTarget(target.with_host("llvm"))(mod)
    with target, tvm.transform.PassContext(opt_level=3, config=cc.PASS_CONFIG):
        lowered = lower(mod)
    return [f for _, f in lowered.functions_items() if is_kernel(f)]


def kernel_bodies(source: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"__global__[^;{]*\{(.*?)\n\}", source, re.S)]


def kernel_params(source: str) -> list[list[str]]:
    """Each kernel's pointer parameters (its global memory)."""
    heads = re.finditer(r"__global__[^;{]*\(([^()]*)\)\s*\{", source)
    return [re.findall(r"\*\s*(?:__restrict__\s*)?(\w+)\s*(?:,|$)", m.group(1)) for m in heads]


def first_global_access(body: str, params: list[str]) -> int:
    """Where ``body`` first loads or stores through a parameter (or copies asynchronously)."""
    names = "|".join(map(re.escape, params)) or "$^"
    accesses = re.finditer(rf"\b(?:{names})\)*\[|\bld\.global|cp\.async\.(?!bulk\.prefetch)", body)
    return min((m.start() for m in accesses), default=len(body))


@pytest.mark.parametrize("make", [gemv_module, decode_module], ids=["s_tir", "tirx"])
def test_kernels_for_sm90_wait_for_their_predecessor_first(make):
    kernels = lowered_kernels(make(SM90A), SM90A)
    assert kernels
    for kernel in kernels:
        tags = [str(t) for t in kernel.attrs[LAUNCH_PARAMS]]
        assert tags.count(PDL_TAG) == 1
        assert DYN_SMEM_TAG not in tags or tags[-1] == DYN_SMEM_TAG
    source = cc.cuda_source(cc.build(make(SM90A), SM90A))
    bodies = kernel_bodies(source)
    assert bodies and len(bodies) == len(kernel_params(source))
    for body, params in zip(bodies, kernel_params(source)):
        assert params
        wait = body.index("griddepcontrol_wait()")
        assert wait < first_global_access(body, params), body[:2000]


def test_kernels_for_sm80_and_a_build_with_it_switched_off_are_as_tvm_builds_them(monkeypatch):
    for kernel in lowered_kernels(gemv_module(SM80), SM80):
        assert PDL_TAG not in [str(t) for t in kernel.attrs[LAUNCH_PARAMS]]
    monkeypatch.setattr(cc, "DEPENDENT_LAUNCH", False)
    for kernel in lowered_kernels(decode_module(SM90A), SM90A):
        assert PDL_TAG not in [str(t) for t in kernel.attrs[LAUNCH_PARAMS]]
    assert "griddepcontrol" not in cc.cuda_source(cc.build(decode_module(SM90A), SM90A))


def test_the_tag_goes_before_the_shared_memory_tag_once():
    assert launch_tags(["blockIdx.x", "threadIdx.x", DYN_SMEM_TAG]) == ["blockIdx.x", "threadIdx.x", PDL_TAG,
                                                                        DYN_SMEM_TAG]
    assert launch_tags(["blockIdx.x", "threadIdx.x"]) == ["blockIdx.x", "threadIdx.x", PDL_TAG]
    assert launch_tags(["blockIdx.x", PDL_TAG]) == ["blockIdx.x", PDL_TAG]
    kernel = lowered_kernels(decode_module(SM90A), SM90A)[0]
    again = with_dependent_launch(kernel)
    assert again.same_as(kernel)  # already a dependent: one wait, one tag
    tags = [t for t in kernel.attrs[LAUNCH_PARAMS] if str(t) != PDL_TAG]
    cooperative = kernel.with_attr(LAUNCH_PARAMS, [*tags[:-1], COOPERATIVE_TAG, tags[-1]])
    assert with_dependent_launch(cooperative).same_as(cooperative)  # keeps its cooperative launch
