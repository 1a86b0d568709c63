"""A drop-in for ``tvm.s_tir.dlight``: swap one import line and a Dlight pipeline can tune.

    import fastdlight.dlight as dl             # was: import tvm.s_tir.dlight as dl

    mod = dl.ApplyFastTuning(topk=20, target=target, parallel_build=True, meta_database_dir="tuned/")(mod)
    mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                  dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)

Every name of ``tvm.s_tir.dlight`` is here unchanged (the same objects); ``ApplyFastTuning`` is
:class:`fastdlight.relax.ApplyFastTuning`, which marks what it tuned ``tirx.is_scheduled`` so the
Dlight rules after it schedule only what is left.
"""

from tvm.s_tir import dlight as _dlight
from tvm.s_tir.dlight import (  # noqa: F401 - re-exported
    ApplyDefaultSchedule,
    IterInfo,
    SBlockInfo,
    ScheduleRule,
    adreno,
    analysis,
    base,
    cpu,
    gpu,
    normalize_prim_func,
    try_inline,
    try_inline_contiguous_spatial,
)

from .relax.apply_fast_tuning import ApplyFastTuning

__all__ = sorted([n for n in vars(_dlight) if not n.startswith("_")] + ["ApplyFastTuning"])


def __getattr__(name):
    """Names a later TVM adds to ``tvm.s_tir.dlight`` resolve here too."""
    return getattr(_dlight, name)
