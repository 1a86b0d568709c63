"""The build-measure-pick loop: matching, crash/timeout isolation, errors, compile-only ranking."""

import dataclasses
import warnings

import pytest
import standins
import tvm

import fastdlight
from fastdlight import ops
from fastdlight.arch import CUDA, auto_arch, has_gpu
from fastdlight.compiler.artifacts import BuildArtifact
from fastdlight.config import Config, StockSchedule
from fastdlight.measure.timing import Timing
from fastdlight.measure.verify import Verdict
from fastdlight.policies.default import DefaultPolicy
from fastdlight.policies.wgmma import WgmmaPolicy
from fastdlight.search import runner, stages
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult, Failure
from fastdlight.search.runner import (
    CLUSTER_TIE_FRACTION,
    HOT_TIE_FRACTION,
    TIE_FRACTION,
    TuningError,
    apply_and_build,
    format_table,
    pick_order,
    rank,
)
from fastdlight.search.stages import (
    ESTIMATE_FINALIST_FRACTION,
    OWN_HEAT_MIN_MS,
    OWN_HEAT_MS,
    RETIME_BY_ESTIMATE,
    RETIME_ROUNDS,
    RETIME_WITHIN,
    Timer,
    pick_finalists,
)

H100 = CUDA("nvidia/nvidia-h100")


def flat_configs(threads=(64, 128, 256, 512)):
    # Different thread counts give different sources (__launch_bounds__), so a mismatch shows.
    return [Config("elementwise", (1, t), (1, 1), cost=float(i)) for i, t in enumerate(threads)]


def quiet(**kw):
    kw.setdefault("measure", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw.setdefault("max_workers", 2)
        return apply_and_build(kw.pop("func"), kw.pop("configs"), H100, **kw)


def test_results_match_configs_under_out_of_order_completion():
    configs = flat_configs()
    results, best = quiet(func=standins.add_op().func, configs=configs, template=standins.flat_template,
                          hook=standins.delay_early_ones)
    assert sorted(r.index for r in results) == [0, 1, 2, 3]
    for r in results:
        assert r.config == configs[r.index]
        assert r.compiled, r.error
        assert f"__launch_bounds__({r.config.num_threads})" in r.source
    assert best.index == 0  # lowest predicted cost


def test_crashing_candidates_are_recorded_and_the_run_completes():
    configs = flat_configs()
    results, best = quiet(func=standins.add_op().func, configs=configs, template=standins.flat_template,
                          hook=standins.abort_on_odd)
    by_index = {r.index: r for r in results}
    for i in (1, 3):
        assert by_index[i].error == "worker crashed (SIGABRT)"
        assert not by_index[i].compiled
    for i in (0, 2):
        assert by_index[i].compiled and by_index[i].error is None
    assert best.index == 0
    assert [r.index for r in results][-2:] == [1, 3]  # failures rank last


def test_hanging_candidate_times_out_and_others_build():
    configs = flat_configs((64, 128))
    results, best = quiet(func=standins.add_op().func, configs=configs, template=standins.flat_template,
                          hook=standins.sleep_on_first, timeout=4)
    by_index = {r.index: r for r in results}
    assert by_index[0].error.startswith("timeout after 4 s")
    assert by_index[1].compiled
    assert best.index == 1


def test_all_failing_raises_tuning_error_with_reasons():
    with pytest.raises(TuningError) as info:
        quiet(func=standins.add_op().func, configs=flat_configs((64, 128, 256)), template=standins.failing_template)
    msg = str(info.value)
    assert "3 × schedule" in msg
    assert "rejects every config" in msg


def test_no_configs_raises():
    with pytest.raises(TuningError, match="no candidate configs"):
        quiet(func=standins.add_op().func, configs=[])


def test_bad_check_value():
    with pytest.raises(ValueError, match="check must be"):
        quiet(func=standins.add_op().func, configs=flat_configs((64,)), check="sometimes")


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU default")
def test_default_without_gpu_warns_and_compiles_only():
    with pytest.warns(UserWarning, match="no GPU was found: nothing was timed"):
        results, best = apply_and_build(standins.add_op().func, flat_configs((64, 128)), H100,
                                        template=standins.flat_template, max_workers=2)
    assert all(r.latency_ms is None for r in results)
    assert best.compiled


@pytest.mark.parametrize("make_op", [lambda: ops.elementwise((1024, 1024), "float16", "add"),
                                     lambda: ops.matmul(256, 256, 256, "float32")], ids=["add", "matmul"])
def test_compile_only_ranks_by_predicted_cost_with_real_cubins(make_op):
    op = make_op()
    configs = DefaultPolicy(op.func, H100).emit_config(4)
    results, best = quiet(func=op.func, configs=configs)
    compiled = [r for r in results if r.compiled]
    assert compiled, format_table(results)
    costs = [r.predicted_cost for r in compiled]
    assert costs == sorted(costs)
    assert results[: len(compiled)] == compiled  # failures after every compiled candidate
    assert best is compiled[0]
    assert best.registers > 0 and "__global__" in best.source
    for r in results:
        assert r.config == configs[r.index]


def test_parallel_and_serial_give_the_same_ranking():
    op = ops.reduce((1024, 1024), "float16", "sum")
    configs = DefaultPolicy(op.func, H100).emit_config(3)
    par, _ = quiet(func=op.func, configs=configs)
    ser, _ = quiet(func=op.func, configs=configs, parallel_build=False)
    assert [r.index for r in par] == [r.index for r in ser]
    assert [r.compiled for r in par] == [r.compiled for r in ser]
    assert [r.registers for r in par] == [r.registers for r in ser]


def _row(index, latency=None, verified=None, compiled=True, error=None):
    art = BuildArtifact(index, "x", 1, 0, 0, b"") if compiled else None
    return CompileResult(
        flat_configs((64,))[0], index, artifact=art, failure=Failure("nvcc", error) if error else None,
        timing=Timing(latency, (latency,)) if latency is not None else None,
        verdict=None if verified is None else (Verdict.passed("test", "ok") if verified else
                                               Verdict.failed("wrong", "test")))


def test_rank_puts_timed_first_then_wrong_then_untimed():
    fast_wrong, slow_ok = _row(0, 1.0, verified=False), _row(1, 2.0, verified=True)
    untimed, failed = _row(2), _row(3, compiled=False, error="nvcc: boom")
    assert [r.index for r in rank([failed, untimed, fast_wrong, slow_ok])] == [1, 0, 2, 3]


def test_unknown_option_is_refused_before_building():
    with pytest.raises(TypeError, match="unknown tuning option.*opt_shape"):
        quiet(func=standins.add_op().func, configs=flat_configs((64,)), opt_shape={"n": 4})


@pytest.mark.parametrize("bad", [{"timeout": 0}, {"budget_ms": -5}, {"screen_ms": 0}, {"max_workers": 0},
                                 {"timing": "x"}])
def test_bad_option_values_are_refused(bad):
    with pytest.raises(ValueError):
        quiet(func=standins.add_op().func, configs=flat_configs((64,)), **bad)


def test_a_module_of_one_function_is_tuned_and_anything_else_is_one_line():
    func = standins.add_op().func
    results, best = fastdlight.tune(tvm.IRModule({"main": func}), H100, topk=2)
    assert best.config.kind == "elementwise"
    two = tvm.IRModule({"a": func, "b": func})
    for call in (lambda arg: fastdlight.tune(arg, H100), lambda arg: apply_and_build(arg, flat_configs((64,)), H100),
                 lambda arg: fastdlight.tune_dispatch(arg, H100)):
        with pytest.raises(TypeError, match=r"expected a tirx.PrimFunc \(or an IRModule holding one\), got str"):
            call("not a function")
        with pytest.raises(TypeError, match="this IRModule holds 2 PrimFuncs"):
            call(two)


# -- GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("make_op", [lambda: ops.elementwise((2048, 2048), "float16", "add"),
                                     lambda: ops.matmul(512, 512, 512, "float32")], ids=["add", "matmul"])
def test_gpu_measures_verifies_and_picks_fastest_verified(make_op):
    op = make_op()
    arch = auto_arch()
    configs = DefaultPolicy(op.func, arch).emit_config(6)
    results, best = apply_and_build(op.func, configs, arch, ref=op.reference, check="all", budget_ms=30)
    timed = [r for r in results if r.latency_ms is not None]
    assert timed
    assert best.verified is True and best.latency_ms > 0

    # the finalists' hot timings rank before every first-pass one (a cold GPU's time is no rival)
    assert best.timing.hot
    fastest = min(r.latency_ms for r in timed if r.verified and r.timing.hot)
    assert fastest <= best.latency_ms <= fastest * (1 + TIE_FRACTION)  # a tie of the fastest goes to the estimate
    assert best.module is not None and "__global__" in best.source


@pytest.mark.gpu
def test_gpu_wrong_candidate_is_never_best():
    op = standins.add_op(2048)
    configs = [Config("elementwise", (1, 256), (1, 1)), Config("elementwise", (2, 128), (1, 1)),
               Config("elementwise", (4, 64), (1, 1))]
    for check in ("winner", "all"):
        results, best = apply_and_build(op.func, configs, auto_arch(), template=standins.wrong_add_template,
                                        check=check, budget_ms=20)
        wrong = next(r for r in results if r.index == 0)
        assert best.index != 0 and best.verified is True
        if check == "all" or wrong.latency_ms < best.latency_ms:
            assert wrong.verified is False


@pytest.mark.gpu
def test_gpu_faulting_candidate_is_isolated_in_the_probe():
    # candidate 0 stores to an illegal address: it may poison only the probe process's CUDA
    # context; every other candidate is still timed and checked in this one
    op = standins.add_op(1024)
    configs = [Config("elementwise", (1, 256), (1, 1)), Config("elementwise", (2, 128), (1, 1)),
               Config("elementwise", (4, 64), (1, 1))]
    results, best = apply_and_build(op.func, configs, auto_arch(), template=standins.faulting_add_template,
                                    ref=op.reference, check="all", budget_ms=20)
    bad = next(r for r in results if r.index == 0)
    assert bad.latency_ms is None and "probe process" in bad.error
    assert best.index != 0 and best.verified is True
    assert all(r.latency_ms is not None and r.verified for r in results if r.index != 0)


@pytest.mark.gpu
def test_gpu_naive_float64_reference_is_used_without_ref():
    op = standins.add_op(1024)
    results, best = apply_and_build(op.func, flat_configs((128, 256)), auto_arch(),
                                    template=standins.flat_template, budget_ms=20)
    assert best.verified is True and "naive" in best.verdict.reference


def test_tune_uses_tensor_cores_for_fp16_matmul_compile_only():
    op = ops.matmul(256, 256, 256, "float16", "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, best = fastdlight.tune(op.func, H100, topk=2, measure=False, max_workers=2)
    # nothing timed: stock Dlight's schedules are not built (they could not win); on the H100
    # (sm_90a) the Hopper wgmma template and mma.sync share the top-k
    assert {r.config.kind for r in results} == {"matmul_tc", "matmul_wgmma"}
    assert best.compiled and "mma" in best.source


def test_public_import_paths_give_the_function():
    # README's import: the submodule must not shadow the function of the same name
    import fastdlight
    from fastdlight.search.runner import apply_and_build as via_tune

    assert callable(via_tune) and via_tune.__name__ == "apply_and_build"
    assert fastdlight.apply_and_build is via_tune


def test_retime_takes_the_fastest_by_median_and_by_best_sample_in_turns_on_a_hot_gpu(monkeypatch):
    # a first timing taken while builds ran can be high in most samples (its median), so the
    # finalists timed again also include the fastest by best sample; they are timed after a
    # heat, in turns, so that all of them see the GPU in the same (sustained) state
    monkeypatch.setattr(stages, "OWN_HEAT_MIN_MS", float("inf"))  # see the next test
    results = []
    for i, (median, best) in enumerate([(1.0, 0.95), (1.1, 1.05), (1.2, 1.15), (1.3, 0.4), (2.0, 1.9)]):
        results.append(_row(i, median).replace(timing=Timing(median, (best, median, median)), module=i))
    timer = Timer(H100, lambda: None, TuneOptions(budget_ms=90, screen_ms=15))
    retimed, heated = [], []

    def fake_time(module, budget_ms):
        retimed.append((module, budget_ms))
        median = results[module].latency_ms
        return Timing(median * 0.5, (median * 0.5,))

    timer._time = fake_time
    timer._heat = lambda r: heated.append(r.index)
    out = timer.retime_fastest(results)
    assert heated == [0]
    # in turns, the budget split; after the first round, the two 20% and 30% behind sit out
    assert retimed == [(i, 30) for i in (0, 1, 2, 3)] + [(i, 30) for i in (0, 1)] * (RETIME_ROUNDS - 1)
    assert out[3].latency_ms == 0.65 and out[4].latency_ms == 2.0
    assert out[0].timing.samples_ms == (0.5,) * RETIME_ROUNDS  # the hot timing replaces the first
    assert out[3].timing.samples_ms == (0.65,)  # its one hot turn is its timing
    assert [r.timing.hot for r in out] == [True] * 4 + [False]


def test_long_finalists_run_alone_before_each_turn():
    """A finalist of a tenth of a millisecond or more draws enough power to set the clock: it
    runs untimed before each of its turns (but the first finalist's first, right after the
    GPU was heated with it); shorter ones are timed at once."""
    results = [_row(i, ms).replace(module=i) for i, ms in enumerate([OWN_HEAT_MIN_MS * 1.1, OWN_HEAT_MIN_MS * 0.95])]
    timer = Timer(H100, lambda: None, TuneOptions(budget_ms=90))
    calls = []
    timer._time = lambda module, budget_ms: calls.append((module, budget_ms)) or Timing(1.0, (1.0,))
    timer._heat = lambda r: None
    timer.retime_fastest(results)
    turn = [(0, OWN_HEAT_MS), (0, 30), (1, 30)]
    assert calls == turn[1:] + turn * (RETIME_ROUNDS - 1)


def test_candidates_far_behind_the_fastest_are_not_retimed():
    """Only candidates whose first timing is within ``RETIME_WITHIN`` of the fastest's are timed
    hot (the retime reorders by up to 13%); stock Dlight's fastest is, as the baseline, unless it
    is ``STOCK_FINALIST_BEHIND`` times behind."""
    results = [_row(0, 1.0), _row(1, 1.0 + RETIME_WITHIN / 2), _row(2, 1.0 + 2 * RETIME_WITHIN)]
    stock = dataclasses.replace(_row(3, 3.5), config=StockSchedule("sm_90a"))
    assert {r.index for r in pick_finalists(results + [stock])} == {0, 1, 3}
    hopeless = dataclasses.replace(_row(3, 4.5), config=StockSchedule("sm_90a"))  # cannot win: not retimed
    assert {r.index for r in pick_finalists(results + [hopeless])} == {0, 1}


def test_light_kernels_are_not_heated():
    heated = []
    timer = stages.Timer(H100, lambda: heated.append("workload"), TuneOptions())
    timer._heat(_row(0, stages.HEAT_LIGHT_MS / 2))
    assert heated == []  # returned before it even asked for the workload


def test_a_first_pass_time_never_beats_the_finalists_hot_times():
    """A hot timing runs 5-15% slower than the first pass's on an H100: after the retime, the
    pick compares finalists with each other, and a candidate left out of the finalists comes
    after them however fast its first (cold) timing was."""
    finalists = [_row(0, 1.00), _row(1, 1.01)]
    finalists = [r.replace(timing=Timing(r.latency_ms * 1.1, (r.latency_ms * 1.1,), hot=True)) for r in finalists]
    cold = _row(2, 1.02)  # its first pass beat both finalists' hot times
    ranked = rank([cold, *finalists])
    assert [r.index for r in ranked] == [0, 1, 2]
    assert [r.index for r in pick_order(sorted([cold, *finalists], key=lambda r: r.speed_key))][-1] == 2
    # without a retime (one candidate, no GPU inputs), first-pass times rank as before
    assert [r.index for r in rank([_row(4, 2.0), _row(3, 1.0)])] == [3, 4]


def test_the_best_estimated_candidates_near_the_fastest_are_finalists_too():
    """The first pass times each candidate at whatever clock the GPU has then: a candidate the
    policy ranks first, a little behind there, gets the hot retime too; one far behind does not."""
    def row(i, ms, cost):
        r = _row(i, ms)
        return r.replace(config=dataclasses.replace(r.config, cost=cost))

    # five fastest (policy's estimate 9..5), then a best-estimated one inside the window (on an
    # H100 the first pass put 8192³'s best-estimated tile 5-13% behind), then one outside it
    near, far = 1 + 0.8 * ESTIMATE_FINALIST_FRACTION, 1 + 1.5 * ESTIMATE_FINALIST_FRACTION
    results = [row(i, 1.0 + 0.001 * i, 9 - i) for i in range(5)] + [row(5, near, 1), row(6, far, 0.5)]
    picked = {r.index for r in pick_finalists(results)}
    assert {0, 1, 2, 5} <= picked and 6 not in picked
    assert len(picked) == 3 + RETIME_BY_ESTIMATE  # the fastest three, by median and by best sample


def test_the_first_pass_times_each_candidate_for_the_screen_budget(monkeypatch):
    budgets = []
    monkeypatch.setattr(stages, "load_module", lambda art, arch: "module")
    timer = stages.Timer(H100, lambda: object(), TuneOptions(budget_ms=80, screen_ms=15))
    monkeypatch.setattr(timer, "time", lambda module, budget_ms: budgets.append(budget_ms) or Timing(1.0, (1.0,)))
    timer.measure(_row(0, None))
    assert budgets == [15]
    timer = stages.Timer(H100, lambda: object(), TuneOptions(budget_ms=10, screen_ms=15))
    monkeypatch.setattr(timer, "time", lambda module, budget_ms: budgets.append(budget_ms) or Timing(1.0, (1.0,)))
    timer.measure(_row(0, None))
    assert budgets == [15, 10]  # never more than the full budget


@pytest.mark.parametrize("given, options, expected", [(None, False, False), (None, True, True), (False, True, False)])
def test_parallel_build_comes_from_options_unless_given(monkeypatch, given, options, expected):
    seen = []

    def record(func, configs, arch, opts, out_dir):
        seen.append(opts.parallel_build)
        raise TuningError("stop here")

    monkeypatch.setattr(runner, "plan", record)
    op = ops.elementwise((64, 64), "float32")
    kwargs = {} if given is None else {"parallel_build": given}
    with pytest.raises(TuningError, match="stop here"):
        runner.apply_and_build(op.func, [], "nvidia/nvidia-h100", options=TuneOptions(parallel_build=options), **kwargs)
    assert seen == [expected]


def test_ties_of_the_fastest_go_to_the_policys_estimate():
    """Within 2% of the fastest (first-pass timings), the candidate the policy ranked better is
    checked first; a slower one, one of another kind, and stock Dlight's (no estimate) keep
    latency order; hot-retimed finalists keep their hot order."""
    def row(index, latency, cost, kind="elementwise"):
        r = _row(index, latency)
        config = StockSchedule("sm_90a") if kind == "dlight" else dataclasses.replace(
            r.config, kind=kind, cost=cost)
        return r.replace(config=config)

    fastest, tie, slow = row(0, 1.000, 3.0), row(1, 1.0 + TIE_FRACTION / 2, 1.0), row(2, 1.05, 0.5)
    other_kind = row(3, 1.001, 0.1, kind="reduction")
    assert [r.index for r in pick_order([fastest, other_kind, tie, slow])] == [1, 0, 3, 2]
    stock_first = [row(4, 0.99, 0.0, kind="dlight"), fastest, tie]
    assert [r.index for r in pick_order(stock_first)] == [4, 0, 1]
    assert pick_order([]) == [] and [r.index for r in pick_order([slow])] == [2]
    # hot-retimed finalists go by their hot times alone: no tie goes to the estimate there
    def hot(r):
        return r.replace(timing=Timing(r.latency_ms, (r.latency_ms,), hot=True))

    assert [r.index for r in pick_order([hot(fastest), hot(tie), hot(slow)])] == [0, 1, 2]


def test_a_cluster_tiles_hot_tie_with_a_plain_tile_goes_to_the_plain_one():
    """Hot finalists: a plain wgmma tile within ``CLUSTER_TIE_FRACTION`` of a faster 2-CTA
    cluster tile is checked first (a cluster spends more energy a GEMM, which shows only at the
    power limit); a plain one further behind, a first-pass time, or a fastest tile without a
    cluster change nothing."""
    def row(index, latency, cluster=1, hot=True):
        config = Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4,
                        use_async_copy=True, rasterization=8 + index, cluster=cluster)
        return dataclasses.replace(_row(index, latency), config=config,
                                   timing=Timing(latency, (latency,), hot=hot))

    cluster, near, far = row(0, 1.0, cluster=2), row(1, 1.0 + CLUSTER_TIE_FRACTION / 2), row(2, 1.0 + 2 * CLUSTER_TIE_FRACTION)
    other_cluster = row(3, 1.001, cluster=2)
    assert [r.index for r in pick_order([cluster, other_cluster, near, far])] == [1, 0, 3, 2]
    assert [r.index for r in pick_order([cluster, far])] == [0, 2]
    assert [r.index for r in pick_order([near, cluster, far])] == [1, 0, 2]
    cold_near = row(4, 1.0 + CLUSTER_TIE_FRACTION / 2, hot=False)  # only a first-pass time
    assert [r.index for r in pick_order([cluster, cold_near])] == [0, 4]


def test_plain_tiles_in_a_cluster_tiles_hot_tie_go_by_the_policys_estimate():
    """The plain finalists within ``CLUSTER_TIE_FRACTION`` of a faster cluster tile go first in
    the policy's order, not by their hot times (which cannot rank them there): the
    8192³ NT finalists of an H100 tune (2026-11-27), where 192x192 timed 0.7% behind the
    cluster tile and 128x192 2.8%, and 192x192 then ran 4.5% behind 128x192 at the power limit."""
    policy = WgmmaPolicy(ops.matmul(8192, 8192, 8192, "float16", "float16", "NT", acc_dtype="float32").func, H100)
    cluster, wide, narrow = (policy.config(policy.tile(128, 256, 64, 2)), policy.config(policy.tile(192, 192, 64)),
                             policy.config(policy.tile(128, 192, 64)))
    assert narrow.cost < wide.cost  # 1849 192x192 tiles fill 14 waves of 132 SMs and one more

    def row(index, config, latency):
        return dataclasses.replace(_row(index, latency), config=config, timing=Timing(latency, (latency,), hot=True))

    finalists = [row(0, cluster, 1.6549), row(1, wide, 1.6664), row(2, narrow, 1.7013)]
    assert [r.index for r in pick_order(finalists)] == [2, 1, 0]
    far = row(3, narrow, 1.6549 * 1.06)  # outside the window: the hot order stands
    assert [r.index for r in pick_order([finalists[0], far])] == [0, 3]


def test_plain_wgmma_finalists_within_the_hot_tie_go_by_the_policys_estimate():
    """A plain wgmma tile's hot tie (``HOT_TIE_FRACTION``) goes to the policy's estimate: a
    4096³ NN tune on an H100 (2026-11-27) where 256x128 timed 1.6% ahead of 128x256 hot (a
    128x256 turn met the power cap settling) and then ran 0.5-0.9% behind it at the power limit. A tile further
    behind, or one of another kind, keeps its hot place; the cluster tile stays after the plain ones."""
    policy = WgmmaPolicy(ops.matmul(4096, 4096, 4096, "float16", "float16", "NN", acc_dtype="float32").func, H100)
    wide, tall, cluster = (policy.config(policy.tile(128, 256, 64)), policy.config(policy.tile(256, 128, 128)),
                           policy.config(policy.tile(128, 256, 64, 2)))
    assert wide.cost < tall.cost  # the shared-memory term: 256x128 moves 144 bytes a cycle, 128x256 128

    def row(index, config, latency):
        return dataclasses.replace(_row(index, latency), config=config, timing=Timing(latency, (latency,), hot=True))

    finalists = [row(0, tall, 0.2035), row(1, cluster, 0.2055), row(2, wide, 0.2068)]
    assert [r.index for r in pick_order(finalists)] == [2, 0, 1]
    far = row(3, wide, 0.2035 * (1 + 2 * HOT_TIE_FRACTION))  # outside the window: the hot order stands
    assert [r.index for r in pick_order([finalists[0], far])] == [0, 3]
    mma = row(4, Config("matmul_tc", block=(128, 256), warp=(64, 64), rstep=(64,), pipeline_stages=4,
                        use_async_copy=True, rasterization=16, cost=wide.cost / 2), 0.2040)
    assert [r.index for r in pick_order([finalists[0], mma])] == [0, 4]


@pytest.mark.gpu
def test_gpu_a_short_kernel_is_timed_from_a_cuda_graph(monkeypatch):
    graphed = []

    class RecordedGraph(stages.LaunchGraph):
        def time(self, budget_ms):
            graphed.append(super().time(budget_ms))
            return graphed[-1]

    monkeypatch.setattr(stages, "LaunchGraph", RecordedGraph)
    op = ops.elementwise((256, 256), "float16", "add")  # a few microseconds
    configs = [Config("elementwise", (1, 256), (1, 1)), Config("elementwise", (2, 128), (1, 1))]
    results, best = apply_and_build(op.func, configs, auto_arch(), ref=op.reference, budget_ms=20)
    # both candidates in the first pass, then each finalist's hot rounds
    assert len(graphed) >= len(configs) and all(t.median_ms < 0.05 for t in graphed)
    assert best.verified and best.latency_ms < 0.05
