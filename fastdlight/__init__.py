"""fastdlight: hardware-aware, seconds-fast GPU kernel tuning for Apache TVM (Roller-style).

    import fastdlight
    results, best = fastdlight.tune(func, "nvidia/nvidia-h100")

    from fastdlight import CUDA, DefaultPolicy, apply_and_build
    arch = CUDA("nvidia/nvidia-h100")
    results, best = apply_and_build(func, DefaultPolicy(func, arch).emit_config(20), arch)

The names below load on first use: ``import fastdlight`` does not import TVM, so the CLI checks
its arguments, and build workers start, without paying for it.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "CUDA": "fastdlight.arch",
    "has_gpu": "fastdlight.arch",
    "Config": "fastdlight.config",
    "DefaultPolicy": "fastdlight.policies.default",
    "TensorCorePolicy": "fastdlight.policies.tensorcore",
    "apply_and_build": "fastdlight.search.runner",
    "TuningError": "fastdlight.search.runner",
    "CompileResult": "fastdlight.search.results",
    "TuneOptions": "fastdlight.search.options",
    "TuningDatabase": "fastdlight.search.database",
    "tune": "fastdlight.search.tuner",
    "tune_dispatch": "fastdlight.search.tuner",
    "autotune": "fastdlight.search.autotune",
    "ApplyFastTuning": "fastdlight.relax.apply_fast_tuning",
    "build": "fastdlight.relax.pipeline",
    "compile_model": "fastdlight.relax.pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fastdlight' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
