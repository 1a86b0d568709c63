"""Kernels built for sm_90+ are launched as programmatic dependents: TVM's launch tag (before the
dynamic-shared-memory tag, which must stay last) and ``griddepcontrol.wait`` before the kernel's
first access to global memory; none on sm_80, none when switched off; scheduled (s_tir) kernels
and TIRx kernels alike. A template's release mark becomes ``launch_dependents`` there only."""

import re

import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.decode_attention import DecodeAttentionShape, decode_split_func, match_decode_split
from fastdlight.arch import CUDA
from fastdlight.compiler import compile as cc
from fastdlight.compiler.dependent_launch import (
    _map_stmts,
    _with_releases,
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
from fastdlight.schedules import dependency
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


def decode_module(target, merged: bool = False) -> tvm.IRModule:
    func = decode_split_func(DecodeAttentionShape(1, 32, 1, 128, 17, False, merged=merged), 4096)
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


RELEASE = "griddepcontrol_launch_dependents()"


def test_the_merged_decode_step_releases_the_next_kernel_from_its_merging_cta_only():
    (body,) = kernel_bodies(cc.cuda_source(cc.build(decode_module(SM90A, merged=True), SM90A)))
    assert body.count(RELEASE) == 1
    # after the CTA has taken its ticket and found itself the last of its head, before the merge
    assert body.index("griddepcontrol_wait()") < body.index("fdl_take_ticket(") < body.index(RELEASE)
    merging = body[:body.index(RELEASE)].rindex("if (")
    assert "== 16)" in body[merging:body.index(RELEASE)]  # the ticket of the 17th chunk
    for module in (decode_module(SM90A), gemv_module(SM90A)):  # no mark: they release by exiting
        assert RELEASE not in cc.cuda_source(cc.build(module, SM90A))


def test_the_release_mark_is_dropped_where_kernels_are_not_dependents_or_early_release_is_off(monkeypatch):
    assert "griddepcontrol" not in cc.cuda_source(cc.build(decode_module(SM80, merged=True), SM80))
    monkeypatch.setattr(dependency, "RELEASE_EARLY", False)
    source = cc.cuda_source(cc.build(decode_module(SM90A, merged=True), SM90A))
    assert RELEASE not in source and "griddepcontrol_wait()" in source
    monkeypatch.setattr(cc, "DEPENDENT_LAUNCH", False)
    assert "griddepcontrol" not in cc.cuda_source(cc.build(decode_module(SM90A, merged=True), SM90A))


def test_marks_are_found_under_loops_and_branches_and_nothing_else_is_rebuilt():
    i = tvm.tirx.Var("i", "int32")
    mark = tvm.tirx.AttrStmt(tvm.tirx.const(0, "int32"), dependency.RELEASE, tvm.tirx.const(1, "int32"),
                             tvm.tirx.Evaluate(0))
    plain = tvm.tirx.Evaluate(tvm.tirx.const(7, "int32"))
    branch = tvm.tirx.IfThenElse(i > 3, tvm.tirx.SeqStmt([plain, mark]), None)
    loop = tvm.tirx.For(i, 0, 8, tvm.tirx.ForKind.SERIAL, branch)
    released = _with_releases(tvm.tirx.SeqStmt([plain, loop]), release=True)
    text = str(released)
    assert dependency.RELEASE not in text and "launch_dependents" in text and "for i" in text
    assert "launch_dependents" not in str(_with_releases(loop, release=False))
    assert _map_stmts(loop, lambda s: None).same_as(loop)  # nothing replaced: the same statement
