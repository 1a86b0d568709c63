"""CUDA source → cubin through NVRTC, with the headers parsed once per process.

Most of a candidate's compile time is the CUDA headers: nvcc preprocesses ``cuda_runtime.h``
and parses ``cuda_fp16.h`` and friends again for every kernel (about 0.3 s of a 0.5-1 s
compile). NVRTC 12.8+ can keep that parse as an automatic precompiled header (``--pch``): the
first compilation in a process creates it, later ones whose leading ``#include`` lines and
options match reuse it. Every source therefore starts with the same :data:`PREFIX` (a superset
of what TVM's generated kernels include); the kernel's own ``#include`` lines follow it and cost
nothing more, since the headers are guarded. On an H100 machine (16 CPUs, CUDA 13.0) 13
candidates (wgmma, mma.sync, stock Dlight, softmax) took 5.4 s this way, 11.2 s through nvcc
and 15.3 s through NVRTC without the precompiled header. NVRTC's code is not nvcc's (it keeps
shared-memory addresses in 64-bit registers): register counts were equal for the wgmma and
softmax kernels and 208-222 against 216-217 for the mma.sync ones. The tuner times what it
builds. A compilation has no timeout of its own: the build pool's per-candidate one applies.

Used by :func:`fastdlight.compiler.compile.compile_cubin` where ``cuda-bindings`` and libnvrtc are
installed (the ``nvrtc`` extra); otherwise, or with ``FASTDLIGHT_CUDA_COMPILER=nvcc``, nvcc runs.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

#: the line of TVM's NVRTC prelude that costs most of a compile: ``<cuda/std/type_traits>`` is all
#: of libcu++'s traits (0.9 s a compile under NVRTC 13.0, 0.8 s of a 128x256 wgmma kernel's 1.6 s
#: without a precompiled header); the prelude only aliases the eight below into ``std``
FULL_TRAITS = "#include <cuda/std/type_traits>"
#: the headers of exactly those eight traits: the same definitions, so the machine code is the same
LIGHT_TRAITS = "".join(f"#include <cuda/std/__type_traits/{name}.h>\n" for name in (
    "is_same", "is_integral", "is_signed", "is_unsigned", "is_floating_point", "enable_if", "conditional"))

#: the include lines every source starts with, so that one precompiled header serves them all
PREFIX = f"""#include <cuda/std/cstdint>
{LIGHT_TRAITS}#include <cuda/std/limits>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
"""

#: what nvcc's host headers give TVM's kernels and NVRTC does not: the complete ``CUtensorMap``
#: (TMA kernels take it by value; ``cuda.h``'s layout) and ``INFINITY``
_DEVICE_DEFINITIONS = """struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef struct CUtensorMap_st CUtensorMap;
#ifndef INFINITY
#define INFINITY (::cuda::std::numeric_limits<float>::infinity())
#endif
"""

#: each process keeps its precompiled headers (64 MB per option set) in ``<tmp>/PCH_PREFIX<pid>``,
#: removed at exit; a killed build worker's is removed by the next process that sets one up
#: (NVRTC's own default folder, ``/tmp/__nvrtc_auto_pch_<pid>_0``, stays behind a killed process)
PCH_PREFIX = "fastdlight_pch_"

#: the oldest NVRTC with automatic precompiled headers
MIN_VERSION = (12, 8)
#: from this version NVRTC caches results on disk (``~/.nv``); tuning asks for cold compiles,
#: so that a second run's tuning time is not a cache's
CACHE_VERSION = (12, 9)

#: the language options of every CUDA compile, NVRTC's and nvcc's (:func:`compile.compile_cubin`):
#: fast math, and the fp16/bf16 operators and conversions TVM's kernels use
LANGUAGE_FLAGS = (
    "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
)
_OPTIONS = (
    *LANGUAGE_FLAGS, "-default-device", "--device-int128", "--ptxas-options=-v", "--pch",
    # vector_types.h leaves these undefined in some include orders under NVRTC
    "-D__NV_SILENCE_DEPRECATION_BEGIN=", "-D__NV_SILENCE_DEPRECATION_END=",
    "-D__NV_SILENCE_HOST_DEPRECATION_BEGIN=", "-D__NV_SILENCE_HOST_DEPRECATION_END=",
)  # fmt: skip


class NvrtcError(RuntimeError):
    """NVRTC rejected a source; the message carries its log."""


def cuda_home() -> str | None:
    """The CUDA toolkit whose headers NVRTC compiles against."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            return os.environ[env]
    if os.path.isdir("/usr/local/cuda/include"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None


def include_dirs(home: str | None) -> tuple[str, ...]:
    """The toolkit's include folders (CUDA 13 keeps libcu++ under ``cccl``)."""
    if not home:
        return ()
    found = [os.path.join(home, "include"), os.path.join(home, "include", "cccl"),
             *glob.glob(os.path.join(home, "targets", "*", "include")),
             *glob.glob(os.path.join(home, "targets", "*", "include", "cccl"))]
    return tuple(p for p in found if os.path.isdir(p))


def driver_version() -> tuple[int, int] | None:
    """The CUDA version the installed driver supports, or None without a driver."""
    try:
        from cuda.bindings import driver

        status, version = driver.cuDriverGetVersion()
    except Exception:  # noqa: BLE001 - no driver library on this machine
        return None
    if status != driver.CUresult.CUDA_SUCCESS:
        return None
    return version // 1000, version % 1000 // 10


@dataclass(frozen=True)
class _Nvrtc:
    lib: object  # cuda.bindings.nvrtc
    options: tuple[str, ...]  # every compilation's, the architecture aside


@functools.cache
def nvrtc_library() -> _Nvrtc | str:
    """NVRTC where it loads, is new enough and finds the toolkit's headers, else the reason it
    is not used."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return "cuda-bindings is not installed"
    try:
        status, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 - libnvrtc missing or unloadable
        return f"libnvrtc does not load: {e}"
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS or (major, minor) < MIN_VERSION:
        return f"NVRTC {major}.{minor} has no precompiled headers (needs {MIN_VERSION[0]}.{MIN_VERSION[1]})"
    driver = driver_version()
    if driver is not None and (major, minor) > driver:
        return f"NVRTC {major}.{minor} is newer than the driver's CUDA {driver[0]}.{driver[1]}: its cubins may not load"
    dirs = include_dirs(cuda_home())
    if not any(os.path.isfile(os.path.join(d, "cuda_fp16.h")) for d in dirs):
        return "no CUDA toolkit headers found (set CUDA_HOME)"
    cache = ("--no-cache",) if (major, minor) >= CACHE_VERSION else ()
    return _Nvrtc(nvrtc, _OPTIONS + cache + (f"--pch-dir={_pch_dir()}",) + tuple(f"-I{d}" for d in dirs))


def _pch_dir() -> str:
    remove_stale_pch_dirs()
    path = os.path.join(tempfile.gettempdir(), f"{PCH_PREFIX}{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    atexit.register(shutil.rmtree, path, True)
    return path


def remove_stale_pch_dirs() -> None:
    """Remove the precompiled-header folders of processes that are gone (killed workers)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), PCH_PREFIX + "*")):
        pid = path.rsplit("_", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def unavailable_reason() -> str | None:
    """Why NVRTC is not used here, or None where it is."""
    lib = nvrtc_library()
    return lib if isinstance(lib, str) else None


def prepare(source: str) -> str:
    """``source`` as NVRTC compiles it: :data:`PREFIX` first, ``cuda.h`` (a host header) out, and
    the prelude's traits from their own headers (:data:`LIGHT_TRAITS`). A source that needs more
    of libcu++ than that fails under NVRTC and goes to nvcc (:func:`compile.compile_cubin`)."""
    lines = (LIGHT_TRAITS if line.strip() == FULL_TRAITS else line
             for line in source.splitlines() if line.strip() != "#include <cuda.h>")
    return PREFIX + _DEVICE_DEFINITIONS + "\n".join(lines)


def compile_source(source: str, arch: str, threads: int = 1) -> tuple[bytes, str]:
    """Compile TVM-generated CUDA ``source`` for ``arch`` (``sm_90a``). Returns (cubin, log, with
    ptxas' resource report). Raises :class:`NvrtcError`. ``threads`` > 1: the kernels optimized
    that many at a time (``--split-compile``; a model's module of many kernels)."""
    compiler = nvrtc_library()
    if isinstance(compiler, str):
        raise NvrtcError(compiler)
    nvrtc = compiler.lib
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    status, prog = nvrtc.nvrtcCreateProgram(prepare(source).encode(), b"kernel.cu", 0, None, None)
    if status != ok:
        raise NvrtcError(f"nvrtcCreateProgram: {status}")
    try:
        options = [f"--gpu-architecture={arch}", *compiler.options, *split_compile(threads)]
        with _stderr_kept(threads > 1) as printed:
            (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        text = log.decode(errors="replace").rstrip("\x00") + printed.text
        if status != ok:
            raise NvrtcError(f"NVRTC failed for {arch}:\n{text[-4000:]}")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        binary = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, binary)
        return bytes(binary), text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def split_compile(threads: int) -> list[str]:
    """The option (nvcc's and NVRTC's alike) that optimizes ``threads`` kernels of a source at a
    time: a model's module, all its kernels in one source, otherwise compiles them one after
    another (ResNet-18's 45 kernels: 14.9 s through NVRTC and 15.3 s through nvcc on one core,
    10.7 and 11.1 s with two threads on two; 44 of the 45 kernels the same machine code,
    2026-11-30)."""
    return [f"--split-compile={threads}"] if threads > 1 else []


class _Printed:
    text = ""


@contextlib.contextmanager
def _stderr_kept(keep: bool):
    """With ``keep``, what the process writes to its standard error meanwhile, as ``.text``:
    NVRTC's split-compile threads print ptxas' advisories there, not into the program's log
    (whatever else the process prints meanwhile lands in the log too, not on the terminal)."""
    printed = _Printed()
    if not keep:
        yield printed
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield printed
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            printed.text = sink.read().decode(errors="replace")


#: picks the CUDA compiler: nvrtc, nvcc, or unset (NVRTC where it can be used, else nvcc)
COMPILER_ENV = "FASTDLIGHT_CUDA_COMPILER"


class CompilerChoiceError(ValueError):
    """:data:`COMPILER_ENV` asks for what cannot be used here."""


def compiler_choice() -> str:
    """``"nvrtc"`` or ``"nvcc"``: NVRTC (headers parsed once per process) where it is installed,
    unless :data:`COMPILER_ENV` asks for nvcc. Here, not in ``compile``, so that the command line
    can check the choice without importing TVM."""
    asked = os.environ.get(COMPILER_ENV, "").strip().lower()
    if asked not in ("", "nvrtc", "nvcc"):
        raise CompilerChoiceError(f"{COMPILER_ENV}={asked!r}: expected 'nvrtc' or 'nvcc'")
    if asked == "nvcc":
        return "nvcc"
    reason = unavailable_reason()
    if reason and asked == "nvrtc":
        raise CompilerChoiceError(f"{COMPILER_ENV}=nvrtc, but NVRTC cannot be used: {reason}")
    return "nvcc" if reason else "nvrtc"


def nvcc_command() -> str:
    """The nvcc the builds run: on PATH, else under ``$CUDA_HOME/bin`` (which may not exist:
    the caller says so)."""
    return shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
