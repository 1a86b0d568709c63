"""A MetaSchedule database tuned elsewhere: its records become candidates the tuner measures."""

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.config import MetaScheduleRecord
from fastdlight.schedules import apply_config, default_schedule
from fastdlight.schedules.ms_record import trace_text
from fastdlight.search.candidates import tune_function
from fastdlight.search.database import TuningDatabase
from fastdlight.search.options import TuneOptions

H100 = CUDA("nvidia/nvidia-h100")


def write_foreign_database(directory, func):
    """What another tool (ms.tune_tir, say) leaves in its work dir: a workload and a record whose
    trace is a schedule of that workload (here Dlight's, so the test needs no tuning run)."""
    sch = default_schedule(func, H100.target)
    db = ms.database.JSONDatabase(work_dir=str(directory))
    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
    workload = db.commit_workload(normalize(func))
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [1e-5], H100.target,
                                                     ms.arg_info.ArgInfo.from_prim_func(func)))
    return sch


def test_a_record_replays_as_the_schedule_it_was():
    func = ops.softmax(512, 1024, "float16").func
    sch = default_schedule(func, H100.target)
    config = MetaScheduleRecord(trace_text(sch.trace))
    with H100.target:
        again = apply_config(func, config)
    assert tvm_ffi.structural_equal(again.mod, sch.mod)


def test_the_tuner_measures_a_foreign_databases_records(tmp_path):
    func = ops.softmax(512, 1024, "float16").func
    sch = write_foreign_database(tmp_path, func)
    db = TuningDatabase(tmp_path)
    (config,) = db.meta_schedule.records(func)
    assert config.kind == "ms_record" and config.trace == trace_text(sch.trace)
    tuned = tune_function(func, H100, 2, TuneOptions(measure=False, parallel_build=False), db=db)
    built = [r for r in tuned.results if r.config.kind == "ms_record"]
    assert len(built) == 1 and built[0].compiled and built[0].failure is None


def test_no_database_or_another_functions_records_give_nothing(tmp_path):
    func = ops.softmax(512, 1024, "float16").func
    assert TuningDatabase(tmp_path / "empty").meta_schedule.records(func) == ()
    write_foreign_database(tmp_path, ops.softmax(256, 1024, "float16").func)
    assert TuningDatabase(tmp_path).meta_schedule.records(func) == ()
    # a trace that is not this function's does not schedule it (no fallback stands in)
    other = default_schedule(ops.elementwise((64, 64), "float32").func, H100.target)
    with H100.target:
        try:
            apply_config(func, MetaScheduleRecord(trace_text(other.trace)))
            raise AssertionError("another function's trace scheduled this one")
        except Exception as e:  # noqa: BLE001 - ScheduleError naming the template
            assert "ms_record" in str(e)
