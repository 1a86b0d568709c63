"""The CUDA toolkit a run needs, checked before any work starts: a compiler (nvcc, or NVRTC), one
that builds for the target's arch, and a target that names a GPU where none is here to ask.

Without these checks a missing nvcc showed after 8 s as ten copies of one line, and CUDA 13's
nvcc, which has no sm_50 to sm_72, failed every candidate of a V100 with "nvcc failed for sm_70:".
Nothing here imports TVM: ``fastdlight.compiler.compile`` does, so its choice of compiler
(:func:`compiler_choice`) is made again here the same way, and a test holds the two together.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess

from fastdlight.arch.table import GPUS_BY_TAG
from fastdlight.cli.args import UsageError
from fastdlight.compiler import nvrtc

COMPILER_ENV = nvrtc.COMPILER_ENV


def compiler_choice() -> str:
    """``"nvrtc"`` or ``"nvcc"``, as the builds will pick it; UsageError for a choice that
    cannot be honoured."""
    try:
        return nvrtc.compiler_choice()
    except nvrtc.CompilerChoiceError as e:
        raise UsageError(str(e)) from None


def compiler_name() -> str:
    return {"nvrtc": "NVRTC", "nvcc": "nvcc"}[compiler_choice()]


def nvcc_path() -> str | None:
    """nvcc where ``compiler.compile`` runs it from: PATH, else ``$CUDA_HOME/bin``."""
    found = nvrtc.nvcc_command()
    return found if os.path.isfile(found) and os.access(found, os.X_OK) else None


@functools.cache
def nvcc_facts(path: str) -> tuple[str, frozenset[int] | None]:
    """(nvcc's release, e.g. "13.0"; the sm numbers it builds for, None where it cannot list them)."""
    def run(*flags):
        try:
            return subprocess.run([path, *flags], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    release = re.search(r"release (\d+\.\d+)", run("--version"))
    archs = {int(n) for n in re.findall(r"compute_(\d+)", run("--list-gpu-arch"))}
    return (release.group(1) if release else "?"), (frozenset(archs) or None)


def nvrtc_archs() -> frozenset[int] | None:
    """The sm numbers NVRTC builds for, None where NVRTC is not used or cannot list them."""
    lib = nvrtc.nvrtc_library()
    if isinstance(lib, str):
        return None
    try:
        status, archs = lib.lib.nvrtcGetSupportedArchs()
        ok = status == lib.lib.nvrtcResult.NVRTC_SUCCESS
        return frozenset(int(a) for a in archs) if ok and archs else None
    except Exception:  # noqa: BLE001 - bindings without the call: the compile says what it can build
        return None


def target_arch(target: str) -> tuple[bool, str | None]:
    """(whether ``target`` names a GPU or an arch, its ``sm_..`` arch where that is known without
    TVM). A bare ``cuda`` names neither: TVM then asks the GPU, and without one says sm_50."""
    text = target.strip()
    if text in GPUS_BY_TAG:
        return True, GPUS_BY_TAG[text].arch
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except ValueError:
            return True, None  # CUDA() says what is wrong with it
        if not isinstance(spec, dict) or spec.get("kind", "cuda") != "cuda" or "tag" in spec:
            return True, None
        return "arch" in spec, spec.get("arch")
    kind, *opts = text.split() or [""]
    if kind != "cuda":
        return True, None  # a tag TVM knows, or not CUDA: CUDA() decides
    arch = next((o.partition("=")[2] for o in opts if o.lstrip("-").startswith("arch=")), None)
    return arch is not None, arch


def check_target_names_gpu(target: str | None, gpu: bool) -> None:
    """Refuse a target that leaves the arch to a GPU this machine does not have."""
    if target is not None and not gpu and not target_arch(target)[0]:
        raise UsageError(f"--target {target!r} names no GPU, and there is no GPU here to read the arch from: "
                         "give a tag (e.g. nvidia/nvidia-h100) or an arch ('cuda -arch=sm_90a')")


def check_toolkit(arch: str | None, shown: str) -> None:
    """Refuse (one line) a run whose kernels cannot be compiled: no compiler, or none that builds
    for ``arch`` (``sm_90a``; None: not known yet, only the compiler is checked). ``shown`` names
    where the arch came from, for the message."""
    choice = compiler_choice()
    parsed = re.fullmatch(r"sm_(\d+)[a-z]?", str(arch or ""))
    number = int(parsed.group(1)) if parsed else None  # an arch that does not parse: CUDA() says so
    if choice == "nvrtc":
        archs = nvrtc_archs()
        if number is None or archs is None or number in archs:
            return  # else NVRTC rejects it and nvcc is tried: its verdict stands
    path = nvcc_path()
    if path is None:
        reason = nvrtc.unavailable_reason()
        why = f"{COMPILER_ENV}=nvcc" if os.environ.get(COMPILER_ENV, "").strip().lower() == "nvcc" else \
            f"NVRTC is not used: {reason}" if reason else f"NVRTC does not build {arch}"
        raise UsageError(f"nvcc not found on PATH nor in $CUDA_HOME/bin ({why}): "
                         "install the CUDA toolkit or set CUDA_HOME")
    release, archs = nvcc_facts(path)
    if number is not None and archs is not None and number not in archs:
        raise UsageError(f"nvcc {release} ({path}) cannot compile for {arch} ({shown}): it builds sm_{min(archs)} "
                         f"to sm_{max(archs)}; use a CUDA toolkit that still has {arch}, or another --target")
