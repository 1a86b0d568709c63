"""Schedule templates: a :class:`~fastdlight.policies.config.Config` → ``tvm.s_tir.Schedule``.

``apply_config(func, config)`` picks the template(s) for ``config.kind`` (see :mod:`.dispatch`);
``default_schedule(func, target)`` is TVM's stock Dlight baseline.
"""

from .base import ScheduleTemplate
from .dispatch import (
    IMPORT_ERRORS,
    ScheduleError,
    ScheduleResult,
    apply_config,
    default_schedule,
    dispatch_config,
    register,
    templates_for,
)

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
