"""``tune(func)``: arch → policy → apply_and_build in one call."""

from __future__ import annotations

import warnings

from ..arch import CUDA, auto_arch
from .runner import TuningError, apply_and_build


def emit_configs(func, arch: CUDA, topk: int = 20):
    """``(func_to_schedule, configs, policy_name)`` candidates, tensor-core first when eligible.
    Yields one entry per policy to try, in order."""
    try:
        from ..policies.tensorcore import TensorCorePolicy, get_tensorized_func_and_tags
    except ImportError as e:  # tensor-core policy unavailable: CUDA cores only
        warnings.warn(f"fastdlight: tensor-core policy unavailable ({e}); using DefaultPolicy", stacklevel=2)
    else:
        tc_func, tags = get_tensorized_func_and_tags(func, arch)
        if tags:
            configs = list(TensorCorePolicy(tc_func, arch, tags).emit_config(topk))
            if configs:
                yield tc_func, configs, "TensorCorePolicy"
    from ..policies.default import DefaultPolicy

    yield func, list(DefaultPolicy(func, arch).emit_config(topk)), "DefaultPolicy"


def prewarm(func, arch: CUDA, max_workers: int | None = None) -> None:
    """Start the shared build workers now (importing the tensor-core intrinsics in them when
    ``func`` is tensor-core eligible) so they are ready when the policy's configs arrive."""
    from .pool import shared_pool

    features = ()
    try:
        from ..policies.tensorcore import get_tensorized_func_and_tags

        if get_tensorized_func_and_tags(func, arch)[1]:
            features = ("tensor_intrin",)
    except Exception:  # noqa: BLE001 - only a head start; emit_configs reports real problems
        pass
    shared_pool(max_workers).warm_up(features)


def tune(func, target=None, topk: int = 20, **kwargs):
    """Tune ``func`` for ``target`` (a Target, tag, :class:`CUDA`; default: the live GPU, else
    the H100 model). Tensor-core eligible matmuls use :class:`TensorCorePolicy`; if none of
    its configs works, the CUDA-core :class:`DefaultPolicy` is tried. ``kwargs`` go to
    :func:`apply_and_build`. Returns ``(ranked results, best)``."""
    arch = target if isinstance(target, CUDA) else auto_arch(target)
    if kwargs.get("parallel_build", True) and kwargs.get("pool") is None:
        prewarm(func, arch, kwargs.get("max_workers"))
    errors = []
    for sched_func, configs, policy in emit_configs(func, arch, topk):
        try:
            return apply_and_build(sched_func, configs, arch, **kwargs)
        except TuningError as e:
            errors.append(f"{policy}: {e}")
            if policy != "DefaultPolicy":
                warnings.warn(f"fastdlight: every {policy} candidate failed; falling back to DefaultPolicy",
                              stacklevel=2)
    raise TuningError("\n".join(errors))
