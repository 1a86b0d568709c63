"""Schedule templates: a :class:`~fastdlight.config.Config` → ``tvm.s_tir.Schedule``.

``apply_config(func, config)`` picks the template(s) for ``config.kind`` (see :mod:`.dispatch`);
``default_schedule(func, target)`` is TVM's stock Dlight baseline.
"""

from fastdlight.schedules.base import ScheduleError, ScheduleTemplate
from fastdlight.schedules.dispatch import (
    IMPORT_ERRORS,
    ScheduleResult,
    apply_config,
    dispatch_config,
    register,
    templates_for,
)
from fastdlight.schedules.stock import default_schedule

__all__ = [
    "IMPORT_ERRORS",
    "ScheduleError",
    "ScheduleResult",
    "ScheduleTemplate",
    "apply_config",
    "default_schedule",
    "dispatch_config",
    "register",
    "templates_for",
]
