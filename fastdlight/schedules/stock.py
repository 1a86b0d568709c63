"""TVM's stock Dlight rules as one more template (config kind ``"dlight"``).

Every tuning run measures stock Dlight's schedule beside the policy's candidates, so a tuned
function is never slower than what ``dlight.ApplyDefaultSchedule`` would have given it. The
config names the arch the rules schedule for: at ``sm_90a`` Dlight's Matmul rule uses no tensor
cores, at ``sm_90`` it does; the kernel is built for the tuning target either way (sm_90 code
runs on an sm_90a build).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from ..policies.config import Config
from .base import ScheduleTemplate


def rule_target(config: Config) -> Target:
    """The current target (the tuning target; the H100 tag outside any target scope) with its
    arch replaced by the config's."""
    base = Target.current(allow_none=True) or Target({"tag": "nvidia/nvidia-h100"})
    spec = dict(base.export())
    spec.pop("keys", None)
    spec["arch"] = config.arch
    return Target(spec)


class StockDlightTemplate(ScheduleTemplate):
    kinds = ("dlight",)
    name = "stock_dlight"

    def apply_config(self, func: tirx.PrimFunc, config: Config) -> s_tir.Schedule | None:
        if config.kind != "dlight":
            return None
        from .dispatch import default_schedule

        return default_schedule(func, rule_target(config))
