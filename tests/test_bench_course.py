"""benchmarks/bench_course.py: the MLC course's hand schedules (``course_schedules``) compile to
cubins (CPU, nvcc) and compute the right thing (GPU), MetaSchedule's failures are summarized
(``course_metaschedule``), and the script's dry run writes its table and JSON."""

import json
import os
import sys

import numpy as np
import pytest
import tvm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_course  # noqa: E402
import course_metaschedule  # noqa: E402
import course_schedules  # noqa: E402

from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.compiler.compile import build, compile_mod_to_cubin  # noqa: E402

#: small sizes every hand tile divides
SIZES = {"gemm": 256, "window": 4096}
IDS = [f"{h.workload}-{h.key}" for h in course_schedules.HAND]


@pytest.mark.parametrize("hand", course_schedules.HAND, ids=IDS)
def test_hand_schedule_compiles(hand):
    func = course_schedules.make_func(hand.workload, SIZES[hand.workload])
    src, cubin = compile_mod_to_cubin(hand.schedule(func).mod, bench_course.DRY_TARGET)
    assert "__global__" in src
    assert cubin.registers > 0 and cubin.spill_bytes == 0, cubin.log[-500:]
    if "shared" in hand.key:
        assert "__shared__" in src and cubin.shared_bytes > 0


def test_tile_must_divide():
    with pytest.raises(ValueError, match="not a multiple"):
        course_schedules.gemm_register_shared(course_schedules.gemm_func(96), micro=(8, 8), threads=(16, 16))


def test_ms_failures_are_summarized(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tvm.s_tir.meta_schedule.logging.task_0_main.log").write_text(
        "2026-11-25 10:00:00 [INFO] [task_scheduler.cc:134] [Task #0: main] Trial #1: Error in building:\n"
        "LocalBuilder: Timeout, killed after 30.0 seconds\n# from tvm.script import ir as I\n"
        "2026-11-25 10:00:00 [INFO] [task_scheduler.cc:134] [Task #0: main] Trial #2: Error in running:\n"
        "LocalRunner: An exception occurred\nTraceback (most recent call last):\n  File \"x\", line 1\n"
        "RuntimeError: boom\n\n# from tvm.script import ir as I\n")
    (logs / "tvm.s_tir.meta_schedule.logging.task_scheduler.log").write_text("Trial #9: Error in building:\nno\n")
    fails = course_metaschedule.ms_failures(str(tmp_path))
    assert fails == {"building: LocalBuilder: Timeout, killed after 30.0 seconds": 1,
                     "running: LocalRunner: An exception occurred … RuntimeError: boom": 1}
    reason = course_metaschedule.ms_reason({"tune_s": 5.0, "records": 2, "valid_records": 0, "failures": fails})
    assert reason.startswith("0/2 trials measured") and "Timeout" in reason


def test_dry_run_writes_table_and_json(tmp_path):
    rc = bench_course.main(["--dry-run", "--skip-ms", "--skip-fastdlight", "--n", "256", "--window-n", "4096",
                            "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "bench_course.json").read_text())
    rows = report["rows"]
    assert len(rows) == len(course_schedules.HAND) + 2  # + stock Dlight per workload
    assert all(r["error"] is None and r["cubin"]["registers"] > 0 for r in rows), rows
    table = (tmp_path / "bench_course.md").read_text()
    assert table.count("| built |") == len(rows) and "compile-only" in table


# -- on a GPU: every hand schedule against float64 numpy ----------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("hand", course_schedules.HAND, ids=IDS)
def test_hand_schedule_correct(hand):
    n = SIZES[hand.workload]
    func = course_schedules.make_func(hand.workload, n)
    kernel = build(hand.schedule(func).mod, auto_arch().target)["main"]
    dev = tvm.cuda(0)
    for seed in (0, 1):  # fresh inputs each time
        rng = np.random.default_rng(seed)
        if hand.workload == "gemm":
            inputs = [rng.uniform(-1, 1, (n, n)).astype("float32") for _ in range(2)]
            ref = inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
        else:
            inputs = [rng.uniform(-1, 1, n + 2).astype("float32")]
            a = inputs[0].astype(np.float64)
            ref = a[:-2] + a[1:-1] + a[2:]
        out = tvm.runtime.tensor(np.full(ref.shape, np.nan, "float32"), dev)  # unwritten elements fail
        kernel(*[tvm.runtime.tensor(x, dev) for x in inputs], out)
        dev.sync()
        got = out.numpy().astype(np.float64)
        assert np.all(np.isfinite(got)), f"{hand.key}: output not fully written"
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= course_schedules.TOL[hand.workload], f"{hand.key}: relative error {err:.3g}"
