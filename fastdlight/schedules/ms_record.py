"""A MetaSchedule tuning record's schedule as a candidate: :class:`~fastdlight.config.MetaScheduleRecord`.

The trace (``Trace.as_json()``, saved with ``tvm.ir.save_json``) travels inside the config, so a
build worker replays it with nothing but the config; a trace that does not replay on the function
(another function's record, an instruction this TVM lacks) makes the template return None.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleTemplate
from fastdlight.schedules.matmul_tensorcore import register_intrinsics


def trace_text(trace) -> str:
    """A schedule trace as the text an ``ms_record`` config carries."""
    return tvm.ir.save_json(trace.as_json())


class MetaScheduleRecordTemplate(ScheduleTemplate):
    kinds = ("ms_record",)
    name = "ms_record"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        if config.kind != "ms_record":
            return None
        if "tensorize" in config.trace:  # the record may use our mma intrinsics besides TVM's
            register_intrinsics()
        sch = s_tir.Schedule(func)
        try:
            s_tir.schedule.Trace.apply_json_to_schedule(tvm.ir.load_json(config.trace), sch)
        except Exception:  # noqa: BLE001 - TVM's ScheduleError: the trace is not this function's
            return None
        return sch
