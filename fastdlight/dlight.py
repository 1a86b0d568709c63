"""A drop-in for ``tvm.s_tir.dlight``: swap one import line and a Dlight pipeline can tune.

    import fastdlight.dlight as dl             # was: import tvm.s_tir.dlight as dl

    mod = dl.ApplyFastTuning(topk=20, target=target, parallel_build=True, meta_database_dir="tuned/")(mod)
    mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                  dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)

Every name of ``tvm.s_tir.dlight`` is here unchanged (the same objects), and so is every
submodule: ``fastdlight.dlight.gpu`` *is* ``tvm.s_tir.dlight.gpu``, whichever import form is used
(``from fastdlight.dlight.gpu import Matmul`` included), so a rule made here is a TVM
``ScheduleRule``. ``ApplyFastTuning`` is :class:`fastdlight.relax.ApplyFastTuning`, which marks
what it tuned ``tirx.is_scheduled`` so the Dlight rules after it schedule only what is left.
"""

import importlib
import pkgutil
import sys

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

from fastdlight.relax.apply_fast_tuning import ApplyFastTuning  # noqa: F401 - re-exported


def _alias_submodules() -> None:
    """Register TVM's Dlight submodules under this module's name. Without it, ``import
    fastdlight.dlight.gpu`` would load a second copy of TVM's files whose classes are not TVM's."""
    prefix = _dlight.__name__ + "."
    for info in pkgutil.walk_packages(_dlight.__path__, prefix):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # a target's optional dependency is missing: that rule set is absent in TVM too
            continue
        sys.modules.setdefault(__name__ + "." + info.name[len(prefix):], module)


_alias_submodules()

__all__ = sorted([n for n in vars(_dlight) if not n.startswith("_")] + ["ApplyFastTuning"])


def __getattr__(name):
    """Names a later TVM adds to ``tvm.s_tir.dlight`` resolve here too (not its module dunders:
    a borrowed ``__path__`` would make this module a package of TVM's files)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_dlight, name)
