"""CUDA source → cubin through NVRTC with a precompiled header, and the choice of compiler."""

import os
import shutil
import struct
import subprocess
import sys
from types import SimpleNamespace

import pytest
import tvm
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.compiler import build_task, nvrtc
from fastdlight.compiler.compile import (
    COMPILER_ENV,
    NVRTC_REJECTED,
    CompileError,
    build,
    compile_cubin,
    cuda_compiler,
    cuda_source,
)
from fastdlight.config import Config
from fastdlight.policies.default import DefaultPolicy
from fastdlight.schedules import apply_config

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


def _softmax_source(*names: str) -> str:
    """The CUDA of a module with the scheduled softmax under each of ``names``."""
    config = DefaultPolicy(_softmax_rows, H100).emit_config(1)[0]
    with H100.target:
        scheduled = apply_config(_softmax_rows, config)
    func = scheduled if isinstance(scheduled, tvm.tirx.PrimFunc) else scheduled.mod["main"]
    return cuda_source(build(tvm.IRModule({n: func.with_attr("global_symbol", n) for n in names}), H100.target))


@pytest.fixture(scope="module")
def softmax_source() -> str:
    return _softmax_source("k")


def test_prepared_source_starts_with_the_shared_includes_and_drops_the_host_header():
    src = '#include <cuda.h>\n#include <cuda_fp16.h>\nextern "C" __global__ void k() {}\n'
    prepared = nvrtc.prepare(src)
    assert prepared.startswith(nvrtc.PREFIX)
    assert "#include <cuda.h>" not in prepared
    assert "CUtensorMap_st" in prepared and 'extern "C" __global__ void k()' in prepared


def test_the_preludes_type_traits_come_from_their_own_headers(softmax_source):
    """TVM's NVRTC prelude includes all of libcu++'s traits and aliases eight of them into std."""
    assert nvrtc.FULL_TRAITS in softmax_source
    prepared = nvrtc.prepare(softmax_source)
    assert nvrtc.FULL_TRAITS not in prepared
    aliased = {line.split("cuda::std::")[1].rstrip(";").strip() for line in softmax_source.splitlines()
               if line.strip().startswith("using cuda::std::is_") or line.strip().startswith("using cuda::std::enable_if")
               or line.strip().startswith("using cuda::std::conditional")}
    assert aliased == {"is_same", "is_same_v", "is_integral", "is_signed", "is_unsigned", "is_floating_point",
                       "enable_if", "conditional"}
    headers = {line.split("/")[-1].removesuffix(".h>") for line in nvrtc.LIGHT_TRAITS.splitlines()}
    assert headers == aliased - {"is_same_v"}  # is_same.h defines both


def test_the_light_trait_headers_define_what_the_prelude_aliases(tmp_path):
    """Checked with nvcc (CI has no NVRTC): the toolkit has these headers and they declare the
    eight traits, each used the way TVM's prelude may use it."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    src = tmp_path / "traits.cu"
    src.write_text(nvrtc.LIGHT_TRAITS + """
static_assert(cuda::std::is_same_v<int, int> && cuda::std::is_same<float, float>::value, "");
static_assert(cuda::std::is_integral<int>::value && !cuda::std::is_floating_point<int>::value, "");
static_assert(cuda::std::is_signed<int>::value && cuda::std::is_unsigned<unsigned>::value, "");
__global__ void k(typename cuda::std::enable_if<true, int*>::type p,
                  typename cuda::std::conditional<true, float, int>::type x) { p[0] = (int)x; }
""")
    proc = subprocess.run([nvcc, "-arch=sm_90a", "-cubin", "-o", str(tmp_path / "traits.cubin"),
                           *(f"-I{d}" for d in nvrtc.include_dirs(nvrtc.cuda_home())), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


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


@pytest.fixture(scope="module")
def two_kernels_source() -> str:
    """The softmax twice in one module (a model's build compiles all its kernels in one)."""
    return _softmax_source("k", "k2")


@pytest.mark.parametrize("compiler", ["nvcc", pytest.param("nvrtc", marks=needs_nvrtc)])
def test_kernels_of_one_module_compiled_at_a_time_are_the_same_machine_code(monkeypatch, two_kernels_source, compiler):
    monkeypatch.setenv(COMPILER_ENV, compiler)
    one = compile_cubin(two_kernels_source, H100.target)
    two = compile_cubin(two_kernels_source, H100.target, threads=2)
    kernels = _text_sections(one.binary)
    assert len(kernels) >= 2 and _text_sections(two.binary) == kernels
    assert two.log.count("Used") == one.log.count("Used") == len(kernels)  # ptxas' report of each


def test_what_the_compiler_prints_meanwhile_goes_to_the_log_not_the_terminal(capfd):
    """NVRTC's split-compile threads print ptxas' advisories on the process's standard error."""
    with nvrtc._stderr_kept(True) as printed:
        os.write(2, b"ptxas info    : (C7508) Potential Performance Loss\n")
    assert printed.text == "ptxas info    : (C7508) Potential Performance Loss\n"
    assert capfd.readouterr().err == ""
    with nvrtc._stderr_kept(False) as printed:
        os.write(2, b"shown\n")
    assert printed.text == "" and capfd.readouterr().err == "shown\n"


def test_the_compile_callback_uses_the_threads_its_caller_gives(monkeypatch):
    """A model's build asks for the CPUs (:func:`compile_threads`); a build worker's one kernel
    gets one thread."""
    seen = []
    monkeypatch.setattr(build_task, "compile_cubin",
                        lambda code, target, threads=1: seen.append(threads) or SimpleNamespace(binary=b"cubin"))
    with H100.target:
        build_task._cuda_compile_callback("source")
        with build_task.compile_threads(6):
            build_task._cuda_compile_callback("source")
        build_task._cuda_compile_callback("source")
    assert seen == [1, 6, 1]


def _text_sections(cubin: bytes) -> dict[str, bytes]:
    """The ELF's ``.text.*`` sections (the machine code) by name."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    size, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * size) for i in range(count)]
    strings = headers[names][4]
    out = {}
    for h in headers:
        name = cubin[strings + h[0]:cubin.index(b"\0", strings + h[0])].decode()
        if name.startswith(".text"):
            out[name] = cubin[h[4]:h[4] + h[5]]
    return out


@needs_nvrtc
def test_the_light_traits_give_the_same_machine_code(monkeypatch, softmax_source):
    """A wgmma GEMM and the softmax, compiled with libcu++'s whole type_traits (TVM's prelude as
    it is) and with the eight traits' own headers: the same instructions."""
    config = Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4,
                    use_async_copy=True, rasterization=8)
    with H100.target:
        gemm = apply_config(ops.matmul(1024, 1024, 1024, "float16", layout="NT", acc_dtype="float32").func, config)
    sources = [softmax_source, cuda_source(build(tvm.IRModule({"main": gemm}), H100.target))]
    light = [nvrtc.compile_source(src, "sm_90a")[0] for src in sources]

    light_prepare = nvrtc.prepare

    def full(source):  # the prelude as TVM writes it: the whole type_traits, in PREFIX too
        return light_prepare(source).replace(nvrtc.LIGHT_TRAITS, nvrtc.FULL_TRAITS + "\n")

    monkeypatch.setattr(nvrtc, "prepare", full)
    for src, cubin in zip(sources, light):
        text = _text_sections(cubin)
        assert text and _text_sections(nvrtc.compile_source(src, "sm_90a")[0]) == text


@needs_nvrtc
def test_a_source_nvrtc_rejects_gets_nvccs_verdict(monkeypatch, softmax_source):
    calls = []

    def reject(source, arch, threads=1):
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
    # cuda-bindings is optional (the nvrtc extra)
    from cuda.bindings import nvrtc as lib

    _, major, minor = lib.nvrtcVersion()
    monkeypatch.setattr(nvrtc, "driver_version", lambda: (major, minor - 1) if minor else (major - 1, 9))
    nvrtc.nvrtc_library.cache_clear()
    try:
        assert "is newer than the driver's CUDA" in nvrtc.unavailable_reason()
    finally:
        nvrtc.nvrtc_library.cache_clear()


def test_a_gone_process_precompiled_headers_are_removed(tmp_path, monkeypatch):
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
