"""Hardware model: what a policy needs to know about the GPU it tunes for.

``CUDA``, ``auto_arch`` and ``has_gpu`` (:mod:`.cuda`) import TVM, so they load on first use:
the command line checks its arguments against the table of GPUs (:mod:`.table`, no TVM) before
paying for that import.
"""

import importlib

__all__ = ["CUDA", "auto_arch", "has_gpu"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'fastdlight.arch' has no attribute {name!r}")
    value = getattr(importlib.import_module("fastdlight.arch.cuda"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
