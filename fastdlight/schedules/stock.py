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

from fastdlight.config import Config
from fastdlight.schedules.base import ScheduleError, ScheduleTemplate, error_line, func_name


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
        return default_schedule(func, rule_target(config))


def default_schedule(func: tirx.PrimFunc, target) -> s_tir.Schedule:
    """Schedule ``func`` with TVM's stock Dlight GPU rules (Matmul, GEMV, LowBatchGEMV,
    Reduction, GeneralReduction, Fallback; first that applies), the tuning baseline.
    Note: with the ``nvidia/nvidia-h100`` tag (``sm_90a``) Dlight's Matmul uses no tensor cores."""
    from tvm.s_tir import dlight

    target = target if isinstance(target, Target) else Target(target)
    rules = [
        dlight.gpu.Matmul(),
        dlight.gpu.GEMV(),
        dlight.gpu.LowBatchGEMV(),
        dlight.gpu.Reduction(),
        dlight.gpu.GeneralReduction(),
        dlight.gpu.Fallback(),
    ]
    failures = []
    with target:
        for rule in rules:
            try:
                space = rule.apply(func, target, False)
            except Exception as e:  # noqa: BLE001 - same policy as dispatch: try the next rule
                failures.append((type(rule).__name__, f"{type(e).__name__}: {error_line(e)}"))
                continue
            if space is None:
                continue
            return space[0] if isinstance(space, list) else space
    raise ScheduleError(f"no Dlight rule applies to {func_name(func)}", failures)
