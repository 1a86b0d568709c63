"""Policies: turn a PrimFunc + hardware model into ranked tile configs.

* :class:`Config` – the contract with the schedule templates (:mod:`.config`).
* :class:`DefaultPolicy` – Roller on CUDA cores (:mod:`.default`), for every family.
* :class:`TensorCorePolicy`, :func:`get_tensorized_func_and_tags` – tensor-core matmul and
  implicit-GEMM convolution (:mod:`.tensorcore`, imported lazily: a missing or broken module
  only disables those two); on ``sm_90a`` it includes the Hopper wgmma tiles of
  :class:`.wgmma.WgmmaPolicy`. :mod:`.matmul_match` says what is a matmul.
* :func:`analyze` / :class:`FuncInfo` – the PrimFunc analysis both policies share.
"""

from __future__ import annotations

import importlib

from .analysis import FuncInfo, analyze
from .config import KINDS, Config
from .default import DefaultPolicy

_TENSORCORE_NAMES = ("TensorCorePolicy", "get_tensorized_func_and_tags")


def __getattr__(name: str):
    # Lazy: the tensor-core module is heavier; import it on first use.
    if name in _TENSORCORE_NAMES:
        value = getattr(importlib.import_module(".tensorcore", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KINDS", "Config", "DefaultPolicy", "FuncInfo", "TensorCorePolicy", "analyze", "get_tensorized_func_and_tags"]
