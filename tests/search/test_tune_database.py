"""``results, best = tune(func, database=DIR)``: a database hit is ``best`` like a tuned winner
(its stored config and time, ``origin="database"``), so the documented pattern works on every
run, with or without a GPU."""

import warnings

import pytest
import tvm_ffi
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.analysis.prepare import specialize
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.measure.timing import Timing
from fastdlight.measure.verify import Verdict
from fastdlight.policies.select import CandidateSet
from fastdlight.search import candidates, tuner
from fastdlight.search.database import TuningDatabase
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult
from fastdlight.search.tuner import tune

H100 = CUDA("nvidia/nvidia-h100")
QUICK = {"measure": False, "max_workers": 2}


@T.prim_func(s_tir=True)
def scale(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(256)), "float32")
    B = T.match_buffer(b, (n, T.int64(256)), "float32")
    for i, j in T.grid(n, T.int64(256)):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)


def quiet_tune(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: "compiled, not timed"
        return tune(*args, **kwargs)


def test_a_database_hit_is_best_with_the_stored_config_and_time(tmp_path, monkeypatch, capsys):
    func = ops.elementwise((256, 256), "float16", "add").func
    results, best = quiet_tune(func, H100, topk=2, database=tmp_path, **QUICK)
    assert best.origin == "tuned" and best.compiled and all(r.origin == "tuned" for r in results)
    assert len(TuningDatabase(tmp_path)) == 0  # compile-only: nothing verified, nothing stored
    TuningDatabase(tmp_path).commit(func, H100, best.config, 0.0123, True, reference="test")
    stored = best.config

    monkeypatch.setattr(candidates, "candidate_sets", lambda *a, **k: pytest.fail("tuned despite a database hit"))
    for _ in range(2):  # the pattern works on every run, not only the first
        results, best = tune(func, H100, database=str(tmp_path), **QUICK)
        assert best.origin == "database" and best.config == stored and best.latency_ms == 0.0123
        assert results == [best] and not best.compiled and best.verified is None
        print(best.config, best.latency_ms)
    assert capsys.readouterr().out.splitlines() == [f"{stored} 0.0123"] * 2


def test_a_database_hit_in_a_tuning_database_object_and_without_a_stored_time(tmp_path):
    func = ops.elementwise((256, 256), "float16", "add").func
    db = TuningDatabase(tmp_path)
    config = Config("elementwise", (1, 128), (1, 1))
    db.commit(func, H100, config, None, True)
    results, best = tune(func, H100, database=db, **QUICK)
    assert results == [best] and best.origin == "database" and best.config == config and best.latency_ms is None


def test_the_readme_pattern_twice_in_a_row_then_from_a_record(tmp_path, monkeypatch):
    """``results, best = tune(func, opt_shapes=..., database="tuned/")`` with the default target:
    without a GPU nothing is stored and the second run tunes again; with a record, both replay."""
    tuned = tmp_path / "tuned"
    monkeypatch.setattr(tuner, "auto_arch", lambda target: H100)  # the default target, GPU or not
    firsts = []
    for _ in range(2):
        results, best = quiet_tune(scale, opt_shapes={"n": 512}, database=str(tuned), max_workers=2)
        print(best.config, best.latency_ms)
        assert best in results
        firsts.append(best)
    if firsts[1].origin == "tuned":  # no GPU: the first run stored nothing; store one now
        TuningDatabase(tuned).commit(specialize(scale, {"n": 512}), H100, firsts[0].config, 0.004, True)
    for _ in range(2):
        results, best = quiet_tune(scale, opt_shapes={"n": 512}, database=str(tuned), max_workers=2)
        print(best.config, best.latency_ms)
        assert best.origin == "database" and results == [best] and best.latency_ms is not None


def test_tune_function_callers_see_the_hit_as_best(tmp_path):
    """``Tuned.best`` of a hit is the stored row; the stock and sibling-seed views leave it out
    (nothing was measured beside it in this run)."""
    func = ops.elementwise((256, 256), "float16", "add").func
    config = Config("elementwise", (1, 128), (1, 1))
    TuningDatabase(tmp_path).commit(func, H100, config, 0.01, True)
    hit = candidates.tune_function(func, H100, 4, TuneOptions(measure=False), db=TuningDatabase(tmp_path))
    assert hit.source == "database" and hit.best.origin == "database" and hit.results == (hit.best,)
    assert hit.best.latency_ms == 0.01 and hit.best.config == config
    assert hit.stock is None and candidates.best_configs(hit, 4) == ()
    with H100.target:
        assert hit.best.schedule is not None  # the row carries the function its config schedules


def test_a_rechecked_hit_is_the_fresh_row_marked_as_from_the_database(tmp_path, monkeypatch):
    """With ``recheck_database`` on a GPU the stored config is built and timed again: its fresh
    row is ``best`` (this run's time), still marked ``origin="database"``."""
    func = ops.elementwise((256, 256), "float16", "add").func
    config = Config("elementwise", (1, 128), (1, 1))
    TuningDatabase(tmp_path).commit(func, H100, config, 0.01, True)
    fresh = CompileResult(config, 0, timing=Timing(0.5))
    monkeypatch.setattr(candidates, "measures", lambda opts: True)  # as on a GPU
    monkeypatch.setattr(candidates, "apply_and_build", lambda f, configs, arch, options: ([fresh], fresh))
    tuned = candidates.tune_function(func, H100, 4, TuneOptions(recheck_database=True), db=TuningDatabase(tmp_path))
    assert tuned.source == "database" and tuned.results == (tuned.best,) and tuned.best.origin == "database"
    assert tuned.best.latency_ms == 0.5 and tuned.best.timing == fresh.timing and tuned.kernel is None


def test_a_verified_winner_of_any_kind_stores_its_kernel_and_its_replay_loads_it(tmp_path, monkeypatch):
    """A tensor-core winner (not only a wgmma one) is stored with its scheduled function; the
    replay hands that function back without scheduling anything."""
    func = ops.matmul(256, 256, 256, "float16").func
    config = Config("matmul_tc", block=(64, 64), warp=(32, 32), rstep=(32,), pipeline_stages=2, use_async_copy=True)
    winner = CompileResult(config, 0, timing=Timing(0.01), verdict=Verdict.passed("test", "ok"))
    monkeypatch.setattr(candidates, "candidate_sets",
                        lambda *a, **k: iter([CandidateSet("TensorCorePolicy", func, (config,))]))
    monkeypatch.setattr(candidates, "apply_and_build", lambda f, configs, arch, options: ([winner], winner))
    tuned = candidates.tune_function(func, H100, 1, TuneOptions(measure=False), db=TuningDatabase(tmp_path))
    assert tuned.kernel is not None
    monkeypatch.setattr(candidates, "scheduled_function", lambda *a: pytest.fail("scheduled again"))
    hit = candidates.tune_function(func, H100, 1, TuneOptions(measure=False), db=TuningDatabase(tmp_path))
    assert hit.source == "database" and hit.config == config
    tvm_ffi.structural_equal(hit.kernel, tuned.kernel) or pytest.fail("another kernel came back")
