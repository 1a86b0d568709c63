"""The candidate path shared by fastdlight.tune, the CLI and the pass: options, policy fallback,
database replay (CPU)."""

import warnings

import pytest
import standins
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.arch import CUDA, auto_arch
from fastdlight.config import Config
from fastdlight.measure.workload import param_buffers, static_shape
from fastdlight.search import candidates
from fastdlight.search.database import TuningDatabase
from fastdlight.search.options import TuneOptions
from fastdlight.search.runner import TuningError, compile_cost_estimate, plan

H100 = CUDA("nvidia/nvidia-h100")


def test_options_refuse_unknown_keywords_and_bad_values():
    with pytest.raises(TypeError, match="unknown tuning option.*budget"):
        TuneOptions.of(budget=5)
    for bad in ({"timeout": 0}, {"budget_ms": -5.0}, {"check": "maybe"}, {"max_workers": -1}):
        with pytest.raises(ValueError):
            TuneOptions(**bad)
    opts = TuneOptions(budget_ms=20)
    assert opts.replace(check="all").budget_ms == 20 and opts.check == "winner"


def test_tensor_core_failure_falls_back_to_the_default_policy(monkeypatch):
    op = standins.add_op(256)
    good = (Config("elementwise", (1, 128), (1, 1)),)
    sets = [candidates.CandidateSet("TensorCorePolicy", op.func, (Config("elementwise", (1, 64), (1, 1)),)),
            candidates.CandidateSet("DefaultPolicy", op.func, good)]
    monkeypatch.setattr(candidates, "candidate_sets", lambda f, a, k, *_, **__: iter(sets))
    seen = []
    opts = TuneOptions(measure=False, max_workers=2, template=standins.flat_template_except_64)
    with pytest.warns(UserWarning, match=r"every TensorCorePolicy candidate failed \(.*\); trying DefaultPolicy"):
        tuned = candidates.tune_function(op.func, H100, 1, opts, on_set=lambda c: seen.append(c.policy))
    assert seen == ["TensorCorePolicy", "DefaultPolicy"]
    assert tuned.policy == "DefaultPolicy" and tuned.config == good[0] and tuned.source == "tuned"
    assert len(tuned.fallbacks) == 1 and tuned.fallbacks[0].startswith("TensorCorePolicy: ")  # kept for the report


def test_every_policy_failing_lists_each_reason(monkeypatch):
    op = standins.add_op(256)
    sets = [candidates.CandidateSet("DefaultPolicy", op.func, (Config("elementwise", (1, 64), (1, 1)),))]
    monkeypatch.setattr(candidates, "candidate_sets", lambda f, a, k, *_, **__: iter(sets))
    opts = TuneOptions(measure=False, max_workers=2, template=standins.failing_template)
    with pytest.raises(TuningError, match="DefaultPolicy: no candidate could be used"):
        candidates.tune_function(op.func, H100, 1, opts)


def test_database_hit_without_gpu_replays_the_stored_config(tmp_path, monkeypatch):
    op = ops.elementwise((256, 256), "float16", "add")
    cfg = Config("elementwise", (1, 128), (1, 1))
    db = TuningDatabase(tmp_path)
    db.commit(op.func, H100, cfg, 0.01, True, reference="test")
    monkeypatch.setattr(candidates, "candidate_sets", lambda *a: pytest.fail("tuned despite a database hit"))
    tuned = candidates.tune_function(op.func, H100, 4, TuneOptions(measure=False), db=db)
    assert tuned.source == "database" and tuned.config == cfg


def test_symbolic_function_is_specialized_by_opt_shapes():
    @T.prim_func(s_tir=True)
    def scale(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n, T.int64(256)), "float32")
        B = T.match_buffer(b, (n, T.int64(256)), "float32")
        for i, j in T.grid(n, T.int64(256)):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj] * T.float32(2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = candidates.tune_function(scale, H100, 2, TuneOptions(measure=False, max_workers=2),
                                         opt_shapes={"n": 512})

    assert tuned.best.compiled
    assert [static_shape(b) for b in param_buffers(tuned.best._func)] == [(512, 256), (512, 256)]


@pytest.mark.parametrize("make", [lambda: ops.reduce((1024, 1), "float16", "sum"),
                                  lambda: ops.matmul(64, 64, 1, "float32"),
                                  lambda: ops.gemv(1024, 1, m=1, dtype="float16")], ids=["sum", "matmul", "gemv"])
def test_length_one_reductions_tune_normally(make):
    op = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = candidates.tune_function(op.func, H100, 2, TuneOptions(measure=False, max_workers=2))
    assert tuned.best.compiled and all(r.compiled for r in tuned.results)


def test_beyond_int32_indexing_builds_with_int64_or_is_refused_before_building():
    op = ops.matmul(65536, 65536, 16, "float32")  # 2^32 outputs: ops index them with int64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = candidates.tune_function(op.func, H100, 1, TuneOptions(measure=False, max_workers=2))
    assert tuned.best.compiled and "int64_t" in tuned.best.source

    @T.prim_func(s_tir=True)
    def big(A: T.Buffer((65536, 65536), "float16"), B: T.Buffer((65536, 65536), "float16")):
        for i, j in T.grid(65536, 65536):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj]

    with pytest.raises(ValueError, match="buffer A has 4294967296 elements, beyond int32 indexing"):
        candidates.tune_function(big, H100, 1, TuneOptions(measure=False, max_workers=2))


@pytest.mark.gpu
def test_gpu_length_one_reduction_is_verified():
    op = ops.matmul(256, 256, 1, "float16", "float32")
    tuned = candidates.tune_function(op.func, auto_arch(), 4, TuneOptions(ref=op.reference, budget_ms=20))
    assert tuned.best.verified is True


def test_gemv_candidates_include_matmul_template_configs_that_compete_by_measurement():
    op = ops.gemv(4096, 4096, m=4, dtype="float16", out_dtype="float32")
    (cand,) = [c for c in candidates.candidate_sets(op.func, H100, 8) if c.policy == "DefaultPolicy"]
    kinds = [c.kind for c in cand.configs]
    assert kinds[:8] == ["gemv"] * 8 and kinds[8:] == ["matmul"] * 2


def test_a_seeded_set_that_fails_as_a_whole_is_retried_in_full(monkeypatch):
    """A sibling's seeds cut the first set; when every config of the cut fails, the full set
    gets its chance before the next policy's (ResNet-18 b1 lost a follower's tensor cores so)."""
    op = standins.add_op(256)
    rejected = (Config("elementwise", (1, 64), (1, 1)), Config("elementwise", (2, 128), (1, 4)))  # 64 threads each
    good = Config("elementwise", (1, 128), (1, 1))
    full = candidates.CandidateSet("TensorCorePolicy", op.func, (*rejected, good))
    sets = [full, candidates.CandidateSet("DefaultPolicy", op.func, (Config("elementwise", (1, 256), (1, 1)),))]
    monkeypatch.setattr(candidates, "candidate_sets", lambda f, a, k, *_, **__: iter(sets))
    seen = []
    opts = TuneOptions(measure=False, max_workers=2, template=standins.flat_template_except_64)
    with pytest.warns(UserWarning, match="every TensorCorePolicy candidate failed"):
        tuned = candidates.tune_function(op.func, H100, 1, opts, seeds=rejected[:1],
                                         on_set=lambda c: seen.append(len(c.configs)))
    assert seen == [2, 3]  # the cut (the seed and the set's top 2), then the full set
    assert tuned.policy == "TensorCorePolicy" and tuned.config == good
    assert len(tuned.fallbacks) == 1 and tuned.fallbacks[0].startswith("TensorCorePolicy (seeded): ")


def test_tensorizing_builds_go_first_then_the_costliest(tmp_path):
    """Beside wgmma, the mma.sync and sm_90 stock candidates tensorize: the slowest builds, so
    they are submitted first, then the rest by compile-cost estimate, so the last builds to
    start are short ones."""
    arch = H100  # sm_90a
    func = ops.matmul(1024, 1024, 1024, "float16", "float16", "NT", acc_dtype="float32").func
    sets = list(candidates.candidate_sets(func, arch, 8, candidates.stock_configs(func, arch)))
    configs = sets[0].configs
    kinds = {c.kind for c in configs}
    assert {"matmul_wgmma", "matmul_tc", "dlight"} <= kinds, kinds
    p = plan(func, configs, arch, TuneOptions(measure=False), str(tmp_path))
    tensorizes = [r.config.kind == "matmul_tc" or (r.config.kind == "dlight" and r.config.arch == "sm_90")
                  for r in p.requests]
    first_plain = tensorizes.index(False)
    assert all(tensorizes[:first_plain]) and not any(tensorizes[first_plain:]), tensorizes
    costs = [compile_cost_estimate(r.config) for r in p.requests[first_plain:]]
    assert costs == sorted(costs, reverse=True)
