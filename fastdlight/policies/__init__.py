"""Policies: turn a PrimFunc and a hardware model into ranked tile configs.

* :class:`DefaultPolicy` – Roller on CUDA cores (:mod:`.default`, with the planners of
  :mod:`.planner`, :mod:`.planner_matmul`, :mod:`.planner_memory` and :mod:`.roller`), every family.
* :class:`TensorCorePolicy` – tensor-core matmul and implicit-GEMM convolution
  (:mod:`.tensorcore`); on ``sm_90a`` it includes the Hopper wgmma tiles of :mod:`.wgmma`.
* :mod:`.transpose`, :mod:`.gather` – tiles for layout changes and gathers.
* :mod:`.select` – which policies a function gets, in which order (the tensor-core match once).
"""

from fastdlight.policies.default import DefaultPolicy
from fastdlight.policies.tensorcore import TensorCorePolicy, get_tensorized_func_and_tags

__all__ = ["DefaultPolicy", "TensorCorePolicy", "get_tensorized_func_and_tags"]
