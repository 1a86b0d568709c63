"""CUDA source → cubin through NVRTC with a precompiled header, and the choice of compiler."""

import os

import pytest
import tvm
from tvm.script import tirx as T

from fastdlight.arch import CUDA
from fastdlight.policies.default import DefaultPolicy
from fastdlight.schedules import apply_config
from fastdlight.tune import nvrtc
from fastdlight.tune.compile import COMPILER_ENV, NVRTC_REJECTED, CompileError, build, compile_cubin, cuda_compiler, cuda_source

needs_nvrtc = pytest.mark.skipif(nvrtc.unavailable_reason() is not None,
                                 reason=f"NVRTC not usable here: {nvrtc.unavailable_reason()}")
H100 = CUDA("nvidia/nvidia-h100")


@T.prim_func(s_tir=True)
def _softmax_rows(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (256, 1024), "float16")
    B = T.match_buffer(b, (256, 1024), "float16")
    M = T.alloc_buffer((256,), "float32")
    S = T.alloc_buffer((256,), "float32")
    for i, k in T.grid(256, 1024):
        with T.sblock("max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                M[vi] = T.float32(-3.0e38)
            M[vi] = T.max(M[vi], T.Cast("float32", A[vi, vk]))
    for i, k in T.grid(256, 1024):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + T.exp(T.Cast("float32", A[vi, vk]) - M[vi])
    for i, k in T.grid(256, 1024):
        with T.sblock("out"):
            vi, vk = T.axis.remap("SS", [i, k])
            B[vi, vk] = T.Cast("float16", T.exp(T.Cast("float32", A[vi, vk]) - M[vi]) / S[vi])


@pytest.fixture(scope="module")
def softmax_source() -> str:
    config = DefaultPolicy(_softmax_rows, H100).emit_config(1)[0]
    with H100.target:
        scheduled = apply_config(_softmax_rows, config)
    func = scheduled if isinstance(scheduled, tvm.tirx.PrimFunc) else scheduled.mod["main"]
    return cuda_source(build(tvm.IRModule({"main": func.with_attr("global_symbol", "k")}), H100.target))


def test_prepared_source_starts_with_the_shared_includes_and_drops_the_host_header():
    src = '#include <cuda.h>\n#include <cuda_fp16.h>\nextern "C" __global__ void k() {}\n'
    prepared = nvrtc.prepare(src)
    assert prepared.startswith(nvrtc.PREFIX)
    assert "#include <cuda.h>" not in prepared
    assert "CUtensorMap_st" in prepared and 'extern "C" __global__ void k()' in prepared


def test_the_compiler_follows_the_environment(monkeypatch):
    monkeypatch.setenv(COMPILER_ENV, "nvcc")
    assert cuda_compiler() == "nvcc"
    monkeypatch.setenv(COMPILER_ENV, "clang")
    with pytest.raises(CompileError, match="expected 'nvrtc' or 'nvcc'"):
        cuda_compiler()
    monkeypatch.delenv(COMPILER_ENV)
    assert cuda_compiler() == ("nvcc" if nvrtc.unavailable_reason() else "nvrtc")


def test_asking_for_nvrtc_where_it_cannot_run_names_the_reason(monkeypatch):
    monkeypatch.setattr(nvrtc, "unavailable_reason", lambda: "cuda-bindings is not installed")
    monkeypatch.setenv(COMPILER_ENV, "nvrtc")
    with pytest.raises(CompileError, match="NVRTC cannot be used: cuda-bindings is not installed"):
        cuda_compiler()
    monkeypatch.delenv(COMPILER_ENV)
    assert cuda_compiler() == "nvcc"


@needs_nvrtc
def test_nvrtc_and_nvcc_report_the_same_kernel(monkeypatch, softmax_source):
    monkeypatch.setenv(COMPILER_ENV, "nvrtc")
    by_nvrtc = compile_cubin(softmax_source, H100.target)
    monkeypatch.setenv(COMPILER_ENV, "nvcc")
    by_nvcc = compile_cubin(softmax_source, H100.target)
    assert by_nvrtc.binary[:4] == by_nvcc.binary[:4] == b"\x7fELF"
    assert by_nvrtc.registers == by_nvcc.registers > 0
    assert by_nvrtc.shared_bytes == by_nvcc.shared_bytes and by_nvrtc.spill_bytes == by_nvcc.spill_bytes == 0
    assert "Used" in by_nvrtc.log and "k_kernel" in by_nvrtc.log


@needs_nvrtc
def test_a_source_nvrtc_rejects_gets_nvccs_verdict(monkeypatch, softmax_source):
    calls = []

    def reject(source, arch):
        calls.append(arch)
        raise nvrtc.NvrtcError("NVRTC failed for sm_90: made up")

    monkeypatch.setenv(COMPILER_ENV, "nvrtc")
    monkeypatch.setattr(nvrtc, "compile_source", reject)
    cubin = compile_cubin(softmax_source, H100.target)  # nvcc compiles it
    assert len(calls) == 1 and cubin.registers > 0
    assert cubin.log.startswith(NVRTC_REJECTED) and "made up" in cubin.log
    with pytest.raises(CompileError, match="nvcc failed"):
        compile_cubin(softmax_source.replace("extern \"C\"", "extern \"C\" this_is_not_cuda"), H100.target)


@needs_nvrtc
def test_nvrtc_errors_carry_the_log():
    with pytest.raises(nvrtc.NvrtcError, match="(?s)NVRTC failed for sm_90a:.*undefined_name"):
        nvrtc.compile_source('extern "C" __global__ void k(int* p) { p[0] = undefined_name; }\n', "sm_90a")


def test_include_dirs_finds_the_toolkits_folders(tmp_path):
    (tmp_path / "include" / "cccl").mkdir(parents=True)
    (tmp_path / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    found = nvrtc.include_dirs(str(tmp_path))
    assert found == (str(tmp_path / "include"), str(tmp_path / "include" / "cccl"),
                     str(tmp_path / "targets" / "x86_64-linux" / "include"))
    assert nvrtc.include_dirs(None) == ()


def test_an_nvrtc_newer_than_the_driver_is_not_used(monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from cuda.bindings import nvrtc as lib

    _, major, minor = lib.nvrtcVersion()
    monkeypatch.setattr(nvrtc, "driver_version", lambda: (major, minor - 1) if minor else (major - 1, 9))
    nvrtc._library.cache_clear()
    try:
        assert "is newer than the driver's CUDA" in nvrtc.unavailable_reason()
    finally:
        nvrtc._library.cache_clear()


def test_a_gone_process_precompiled_headers_are_removed(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setattr(nvrtc.tempfile, "gettempdir", lambda: str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{nvrtc.PCH_PREFIX}{int(gone.stdout)}"
    live = tmp_path / f"{nvrtc.PCH_PREFIX}{os.getpid()}"
    other = tmp_path / "unrelated_123"
    for d in (dead, live, other):
        d.mkdir()
        (d / "kernel_0.pch").write_bytes(b"x")
    nvrtc.remove_stale_pch_dirs()
    assert not dead.exists() and live.exists() and other.exists()
