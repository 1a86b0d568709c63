"""Memory-bound templates on a real GPU: every family (incl. non-divisible shapes) builds, runs
on random inputs with a NaN-poisoned output and matches the float64 reference.
Configs: DefaultPolicy's top 3 (when the policy module exists) plus the hand-written ones."""

from __future__ import annotations

import pytest
import tvm
from gpu_util import run_and_check
from mb_cases import CASES, case_ids

from fastdlight import ops
from fastdlight.compiler.compile import build
from fastdlight.config import Config
from fastdlight.schedules import default_schedule, dispatch_config
from fastdlight.schedules.fallback import FallbackTemplate

pytestmark = pytest.mark.gpu

TOPK = 3


def live_target():
    return tvm.target.Target.from_device(tvm.cuda(0))


def policy_configs(func, k=TOPK):
    try:
        # the policy module is optional here (see the module's docstring)
        from fastdlight.arch import CUDA
        from fastdlight.policies.default import DefaultPolicy
    except ImportError:
        return []

    return DefaultPolicy(func, CUDA.from_device(tvm.cuda(0))).emit_config(k)


@pytest.mark.parametrize("case", CASES, ids=case_ids())
def test_family_matches_reference(case):
    op = case.make()
    target = live_target()
    configs = list(dict.fromkeys(policy_configs(op.func) + case.configs))
    errors = {}
    for cfg in configs:
        res = dispatch_config(op.func, cfg)
        built = build(res.schedule.mod, target)
        errors[repr(cfg)] = (res.template, run_and_check(built, op))
    assert all(t == case.template for t, _ in errors.values()), errors


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("max_outer_999x1000_f32", "softmax_37x4095_f32")])
def test_fallback_matches_reference(case):
    op = case.make()
    sch = FallbackTemplate().apply_config(op.func, Config("elementwise", block=(128,), thread=(1,)))
    run_and_check(build(sch.mod, live_target()), op)


def test_default_dlight_baseline_runs():
    for op in (ops.softmax(64, 1000), ops.gemv(1024, 4096), ops.reduce((999, 1000), axis=0, dtype="float32")):
        target = live_target()
        run_and_check(build(default_schedule(op.func, target).mod, target), op)
