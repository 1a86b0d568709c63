"""fastdlight: hardware-aware, seconds-fast GPU kernel tuning for Apache TVM (Roller-style).

    from fastdlight import CUDA, DefaultPolicy, apply_and_build
    arch = CUDA("nvidia/nvidia-h100")
    cpresults, best = apply_and_build(func, DefaultPolicy(func, arch).emit_config(20), arch)

or in one call: ``fastdlight.tune(func)``. Exports are resolved lazily (importing fastdlight
does not import TVM).
"""

__version__ = "0.1.0"

_LAZY = {
    "CUDA": "fastdlight.arch",
    "auto_arch": "fastdlight.arch",
    "has_gpu": "fastdlight.arch",
    "Config": "fastdlight.policies.config",
    "DefaultPolicy": "fastdlight.policies.default",
    "TensorCorePolicy": "fastdlight.policies.tensorcore",
    "get_tensorized_func_and_tags": "fastdlight.policies.tensorcore",
    "apply_and_build": "fastdlight.tune.runner",
    "CompileResult": "fastdlight.tune.candidate",
    "TuneOptions": "fastdlight.tune.options",
    "TuningError": "fastdlight.tune.runner",
    "ApplyFastTuning": "fastdlight.relax",
    "build": "fastdlight.relax.pipeline",
    "compile_model": "fastdlight.relax.pipeline",
    "TuningDatabase": "fastdlight.tune.database",
    "tune_dispatch": "fastdlight.tune.tuner",
    "autotune": "fastdlight.tune.autotune",
    "export": "fastdlight.export",
}

__all__ = sorted([*_LAZY, "tune"])


def __getattr__(name):
    import importlib

    if name == "tune":  # the callable subpackage: fastdlight.tune(func) and fastdlight.tune.tune(func)
        return importlib.import_module("fastdlight.tune")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fastdlight' has no attribute {name!r}")
