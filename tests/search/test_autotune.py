"""@fastdlight.autotune: the space and its constraints, pruning before any build (the arch's
limits on threads and shared memory), ranking by the Roller cost model, failures as data, the
database cache (this process and a new one), bad input; the guide's example runs as written
(compile-only). Builds are stood in for by a recorder except in the guide's example."""

import json
import pathlib
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import tvm_ffi
from tvm import s_tir
from tvm.script import tirx as T

import fastdlight
from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.measure.timing import Timing
from fastdlight.measure.verify import Verdict
from fastdlight.policies.default import DefaultPolicy
from fastdlight.policies.roller import blocks_per_sm
from fastdlight.search import autotune as at
from fastdlight.search.autotune import AutotuneError, Pruned, Resources, autotune, over_limits, read_tile
from fastdlight.search.database import TuningDatabase
from fastdlight.search.results import CompileResult
from fastdlight.search.runner import TIE_FRACTION

A100 = CUDA("nvidia/nvidia-a100")  # 48 KB static shared memory per block, 163 KB opt-in
N = 256
GUIDE = pathlib.Path(__file__).parents[2] / "docs" / "guide.md"


@T.prim_func(s_tir=True)
def gemm(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")):
    for i, j, k in T.grid(N, N, N):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]


def gemm_schedule(bm, bn, bk, tm=4, tn=4, scope="shared"):
    """bm×bn of C per block (bm/tm × bn/tn threads), A and B staged in ``scope`` bk at a time."""
    sch = s_tir.Schedule(gemm)
    c = sch.get_sblock("C")
    i, j, k = sch.get_loops(c)
    bi, ti, ii = sch.split(i, [None, bm // tm, tm])
    bj, tj, jj = sch.split(j, [None, bn // tn, tn])
    ko, ki = sch.split(k, [None, bk])
    sch.reorder(bi, bj, ti, tj, ko, ki, ii, jj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    sch.reverse_compute_at(sch.cache_write(c, 0, "local"), tj)
    for operand in (0, 1):
        shared = sch.cache_read(c, operand, scope)
        sch.compute_at(shared, ko)
        _, ty, tx = sch.split(sch.fuse(*sch.get_loops(shared)[-2:]), [None, bm // tm, bn // tn])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(c, ko)
    return sch.mod["main"]


def tuner(space, fn=gemm_schedule, **kw):
    kw.setdefault("reference", gemm)
    kw.setdefault("target", A100)
    return autotune(space=space, **kw)(fn)


class Builds:
    """Stands in for ``apply_and_build``: records every kernel handed to the build and returns
    rows without compiling: verified, timed ``index + 1`` ms (the top-ranked wins), or failed in
    nvcc for the candidates numbered in ``fail``."""

    def __init__(self, fail=()):
        self.fail, self.funcs, self.calls = set(fail), [], 0

    def __call__(self, func, configs, arch, parallel_build=True, options=None, **_):
        self.calls += 1
        self.funcs += [options.template(func, c) for c in configs]
        rows = []
        for c in configs:
            n = c.block[0]
            if n in self.fail:
                rows.append(CompileResult(c, n).failed("nvcc", "ptxas error: Entry function uses too much data"))
            else:
                rows.append(CompileResult(c, n, timing=Timing(float(n + 1)),
                                          verdict=Verdict.passed("naive float64 schedule of the function", "ok")))
        best = min((r for r in rows if r.failure is None), key=lambda r: r.latency_ms)
        return rows, best

    def built(self, func) -> bool:
        return any(tvm_ffi.structural_equal(f, func) for f in self.funcs)


class NoBuild:
    def __call__(self, *args, **kwargs):
        raise AssertionError("nothing may be built")


@pytest.fixture
def builds(monkeypatch):
    spy = Builds()
    monkeypatch.setattr(at, "apply_and_build", spy)
    return spy


# -- pruning -----------------------------------------------------------------------------------
def test_points_over_the_threads_or_shared_memory_limit_are_cut_before_any_build(builds):
    # threads = (bm/4)·(bn/4); static shared memory = (bm + bn)·bk·4 bytes
    t = tuner({"bm": [64, 256], "bn": [64, 256], "bk": [8, 128]}, topk=8)
    result = t.tune(measure=False)
    cut = {p.params: p for p in result.screening.pruned}
    assert result.screening.cut_counts() == {"shared_memory": 3, "threads": 2}
    assert cut[(("bm", 256), ("bn", 256), ("bk", 8))].stage == "threads"
    assert "4096 threads per block > 1024" in cut[(("bm", 256), ("bn", 256), ("bk", 8))].reason
    why = cut[(("bm", 64), ("bn", 64), ("bk", 128))]
    assert why == Pruned((("bm", 64), ("bn", 64), ("bk", 128)), "shared_memory", why.reason)
    assert why.reason.startswith("65536 B of static shared memory > 49152 B")
    assert len(builds.funcs) == 3 and builds.calls == 1
    for params in cut:
        assert not builds.built(t.schedule(**dict(params))), params
    assert "8 points; 5 cut before building (shared_memory: 3; threads: 2)" in result.report()


def test_dynamic_shared_memory_is_held_to_the_opt_in_limit_static_to_48_kb(builds):
    # the same 64×64 tile with bk=128: 64 KB, over the static limit, under the A100's opt-in one
    t = tuner({"bm": [64], "bn": [64], "bk": [128], "scope": ["shared", "shared.dyn"]})
    screening = t.screen()
    assert [p.params[-1] for p in screening.pruned] == [("scope", "shared")]
    (survivor,) = screening.survivors
    assert survivor.resources.dynamic_smem == 65536 and survivor.resources.static_smem == 0
    assert over_limits(Resources(1, 256, (("threadIdx.x", 256),), (), 0, 200_000), A100)[0] == "shared_memory"
    assert over_limits(Resources(1, 128, (("threadIdx.z", 128),), (), 0, 0), A100) == (
        "threads", "threadIdx.z = 128 > 64")
    assert over_limits(Resources(1, 128, (), (("blockIdx.y", 70000),), 0, 0), A100)[0] == "grid"


def test_constraints_reject_points_by_name_or_source_before_the_function_runs(builds):
    calls = []

    def fits(bm, bn):
        return max(bm, bn) <= 64

    def counted(bm, bn, bk):
        calls.append((bm, bn, bk))
        return gemm_schedule(bm, bn, bk)

    t = tuner({"bm": [32, 64, 128], "bn": [32, 64], "bk": [8, 16]}, fn=counted,
              constraints=[fits, lambda bk, bm: bm // bk >= 4, lambda bm: 1 // (bm - 128)])
    screening = t.screen()
    counts = screening.cut_counts()
    assert counts["rejected by `fits`"] == 4  # bm=128 (2 bn × 2 bk)
    assert counts["rejected by `bm // bk >= 4`"] == 2  # bm=32 with bk=16
    # the function ran on the accepted points only; the third constraint (which raises at
    # bm=128) never saw bm=128: `fits` had cut it
    assert sorted(calls) == sorted(tuple(v for _, v in s.params) for s in screening.survivors)
    assert len(screening.survivors) == 6 and not [p for p in screening.pruned if "raised" in p.reason]
    t2 = tuner({"bm": [128], "bn": [32], "bk": [8]}, constraints=[lambda bm: 1 // (bm - 128)])
    (p,) = t2.screen().pruned
    assert p.stage == "constraint"
    assert p.reason == "`1 // (bm - 128)` raised ZeroDivisionError: integer division or modulo by zero"


def test_failures_are_data_with_their_stage(monkeypatch):
    spy = Builds(fail={1})
    monkeypatch.setattr(at, "apply_and_build", spy)

    def flaky(bm, bn, bk, unused=0):
        if bk == 32:
            raise ValueError("bk=32 is not supported")
        if bm == 16:
            return None  # does not apply
        if bm == 128:
            return gemm  # no thread bound: lowering refuses it
        return gemm_schedule(bm, bn, bk)

    t = tuner({"bm": [16, 64, 128], "bn": [64], "bk": [8, 16, 32], "unused": [0, 1]}, fn=flaky)
    result = t.tune(measure=False)
    stages = result.screening.cut_counts()
    # bk=32 raises (6), bm=16 gives None (4); bm=128 is the same unbound kernel whatever bk and
    # unused are (1 lowered and refused, 3 duplicates: checked before lowering), and unused=1
    # repeats each bm=64 kernel (2)
    assert stages == {"schedule": 10, "duplicate": 5, "lower": 1}
    lower = next(p for p in result.screening.pruned if p.stage == "lower")
    assert "no device kernel" in lower.reason and "bound to blockIdx/threadIdx" in lower.reason
    dup = next(p for p in result.screening.pruned if p.stage == "duplicate")
    assert dup.reason.startswith("the same kernel as bm=64, bn=64, bk=")
    failed = [t for t in result.trials if t.failure is not None]
    assert [f.failure.stage for f in failed] == ["nvcc"] and result.params != failed[0].params
    assert len(result.failures) == 16 + 1


# -- ranking -----------------------------------------------------------------------------------
def test_survivors_are_ranked_by_the_roller_cost_model_and_only_the_top_k_built(builds):
    t = tuner({"bm": [32, 64, 128], "bn": [32, 64, 128], "bk": [16]}, topk=2)
    result = t.tune(measure=False)
    screening = result.screening
    assert screening.ranking == "Roller cost model of DefaultPolicy (matmul)"
    costs = [s.predicted_cost for s in screening.survivors]
    assert None not in costs and costs == sorted(costs)
    # 128×128 tiles of a 256² output: 4 blocks of 1024 threads for 108 SMs: ranked last
    assert screening.survivors[-1].params == (("bm", 128), ("bn", 128), ("bk", 16))
    assert [s.params for s in screening.chosen] == [s.params for s in screening.survivors[:2]]
    assert len(builds.funcs) == 2 and len(screening.not_built) == 7
    assert result.params == screening.survivors[0].params  # the stand-in times the top-ranked fastest
    # the score is the policy's own for the tiles read off the schedule
    top = screening.survivors[0]
    bm, bn, bk = (v for _, v in top.params)
    assert read_tile(top.func, analyze(gemm)) == at.Tile((bm, bn), (4, 4), (bk,))
    threads, smem = bm * bn // 16, (bm + bn) * bk * 4
    assert (top.resources.threads, top.resources.static_smem) == (threads, smem)
    planner = DefaultPolicy(gemm, A100).planner
    expected = planner.cost((bm, bn), (4, 4), (bk,), threads, blocks_per_sm(A100, threads, 0, smem),
                            (N // bm) * (N // bn))
    assert top.predicted_cost == pytest.approx(expected)


def test_without_a_reference_nothing_is_ranked_and_every_survivor_is_built(builds):
    t = tuner({"bm": [32, 64], "bn": [64], "bk": [8, 16]}, reference=None, topk=1)
    result = t.tune(measure=False)
    assert result.screening.ranking.startswith("unranked: no reference")
    assert all(s.predicted_cost is None for s in result.screening.survivors)
    assert len(builds.funcs) == 4  # topk applies to ranked survivors only


# -- the cache ---------------------------------------------------------------------------------
def test_a_verified_winner_is_stored_and_a_second_call_builds_nothing(tmp_path, monkeypatch, builds):
    space = {"bm": [32, 64], "bn": [64], "bk": [8, 16]}
    first = tuner(space, key="gemm_256", database=tmp_path, topk=4)
    result = first.tune(measure=False)
    assert result.verified is True and result.stored and result.source == "tuned" and builds.calls == 1
    (row,) = [json.loads(line) for line in open(tmp_path / "fastdlight_records.jsonl")]
    assert row["autotune"] == "gemm_256" and row["params"] == dict(result.params)
    assert first() is result.func and builds.calls == 1  # this process: the memo

    monkeypatch.setattr(at, "apply_and_build", NoBuild())
    again = tuner(space, key="gemm_256", database=TuningDatabase(tmp_path))  # a fresh reader
    hit = again.tune()
    assert hit.source == "database" and hit.params == result.params and hit.stored is False
    assert tvm_ffi.structural_equal(hit.func, result.func)
    assert TuningDatabase(tmp_path).lookup_key("gemm_256", CUDA("nvidia/nvidia-h100")) is None  # per GPU
    reader = TuningDatabase(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a keyed row is a record, not a garbled line
        assert reader.lookup(gemm, A100) is None and len(reader) == 1 and reader.stats.records == 1
    with pytest.raises(ValueError, match="not verified"):
        reader.commit_key("gemm_256", A100, {"bm": 32}, gemm, 1.0, verified=None)


def test_a_new_process_reads_the_winner_without_building(tmp_path, builds):
    tuner({"bm": [32, 64], "bn": [64], "bk": [8]}, key="gemm_256", database=tmp_path).tune(measure=False)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        import test_autotune as t
        from fastdlight.search import autotune as at

        def no_build(*args, **kwargs):
            raise SystemExit("a build was started")

        at.apply_and_build = no_build
        hit = t.tuner({{"bm": [32, 64], "bn": [64], "bk": [8]}}, key="gemm_256", database={str(tmp_path)!r}).tune()
        print(hit.source, dict(hit.params))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"database {dict(builds_winner(tmp_path))}"


def builds_winner(db_dir):
    (row,) = [json.loads(line) for line in open(pathlib.Path(db_dir) / "fastdlight_records.jsonl")]
    return row["params"]


def test_a_record_the_space_or_the_function_no_longer_makes_is_tuned_afresh(tmp_path, builds):
    tuner({"bm": [32], "bn": [64], "bk": [8]}, key="k", database=tmp_path).tune(measure=False)
    with pytest.warns(UserWarning, match="stale .*not a point of the space"):
        tuner({"bm": [64], "bn": [64], "bk": [8]}, key="k", database=tmp_path).tune(measure=False)
    assert builds.calls == 2

    def changed(bm, bn, bk):
        return gemm_schedule(bm, bn, bk, tm=2)

    with pytest.warns(UserWarning, match="no longer makes the kernel stored"):
        tuner({"bm": [64], "bn": [64], "bk": [8]}, fn=changed, key="k", database=tmp_path).tune(measure=False)
    assert builds.calls == 3


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"space": {}}, "the space is empty"),
    ({"space": [("bm", [64])]}, r"the space must be a dict \{name: \[values, ...\]\}, got list"),
    ({"space": {"bm": []}}, "parameter 'bm' has no values"),
    ({"space": {"bm": 64}}, "the values of 'bm' must be a list"),
    ({"space": {"bm": [64], "bn": [64], "bk": [8]}, "constraints": [lambda bm, bq: bm > bq]},
     r"constraint `bm > bq` names unknown parameter\(s\) bq; the space has bm, bn, bk"),
    ({"space": {"bm": [64], "bn": [64], "bk": [8], "bz": [1]}}, r"gemm_schedule\(\) takes no parameter bz"),
    ({"space": {"bm": [64], "bn": [64]}}, r"gemm_schedule\(\) needs bk, which the space does not give"),
    ({"space": {"bm": [64], "bn": [64], "bk": [8]}, "key": ""}, "key must be a non-empty string"),
    ({"space": {"bm": [64], "bn": [64], "bk": [8]}, "database": "x"}, "a database needs key="),
    ({"space": {"bm": [64], "bn": [64], "bk": [8]}, "reference": "gemm"}, "reference must be the unscheduled"),
    ({"space": {"bm": [64], "bn": [64], "bk": [8]}, "topk": 0}, "topk must be a positive integer"),
    ({"space": {"bm": [object()], "bn": [64], "bk": [8]}, "key": "k"}, "must be JSON values"),
])
def test_bad_input_is_one_clear_line(kwargs, match):
    with pytest.raises(AutotuneError, match=match) as info:
        autotune(**kwargs)(gemm_schedule)
    assert "\n" not in str(info.value)


def test_a_function_returning_something_else_than_a_primfunc_is_one_clear_line(builds):
    t = tuner({"bm": [64], "bn": [64], "bk": [8]}, fn=lambda bm, bn, bk: 42)
    with pytest.raises(AutotuneError, match=r"returned int, not a PrimFunc") as info:
        t.tune(measure=False)
    assert "\n" not in str(info.value) and builds.calls == 0
    with pytest.raises(TypeError, match="unknown tuning option"):
        autotune(space={"bm": [64]}, budget=3)
    # a Schedule or a one-function IRModule is accepted
    as_schedule = tuner({"bm": [64], "bn": [64], "bk": [8]}, fn=lambda **p: s_tir.Schedule(gemm_schedule(**p)))
    assert as_schedule.screen().survivors


def test_every_point_cut_is_a_tuning_error_listing_why(builds):
    t = tuner({"bm": [64], "bn": [64], "bk": [8]}, constraints=[lambda bm: bm > 64])
    with pytest.raises(fastdlight.TuningError, match=r"every point was cut before building\n1 points; 1 cut") as info:
        t.tune(measure=False)
    assert builds.calls == 0 and info.value.screening.pruned[0].stage == "constraint"


# -- as written in the guide -----------------------------------------------------------------------
def test_the_guides_example_runs_as_written(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    example = next(b for b in blocks if "@fastdlight.autotune" in b)
    path = tmp_path / "autotune_example.py"  # TVMScript reads the function's source from its file
    path.write_text(example.replace("topk=8", "topk=2, max_workers=2, measure=False"))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    result = namespace["result"]
    assert result.source == "compiled" and result.stored is False  # nothing verified: nothing stored
    assert len(TuningDatabase(tmp_path / "tuned")) == 0
    assert [t.result.compiled and t.registers > 0 for t in result.trials] == [True, True]
    assert namespace["kernel"] is result.func
    assert result.screening.cut_counts() == {"rejected by `bm * bn <= 128 * 128`": 3}


# -- GPU -----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_a_small_space_is_timed_verified_and_stored(tmp_path):
    space = {"bm": [32, 64], "bn": [64, 128], "bk": [8, 16]}
    t = autotune(space=space, key="gemm_256_gpu", reference=gemm, database=tmp_path, topk=4,
                 budget_ms=20)(gemm_schedule)
    result = t.tune()
    assert result.source == "tuned" and result.verified is True and result.stored
    timed = [tr for tr in result.trials if tr.latency_ms is not None]
    # a tie of the fastest goes to the estimate
    fastest = min(tr.latency_ms for tr in timed if tr.verified)
    assert len(timed) >= 2 and fastest <= result.latency_ms <= fastest * (1 + TIE_FRACTION)
    again = autotune(space=space, key="gemm_256_gpu", reference=gemm, database=tmp_path)(gemm_schedule)
    hit = again.tune()
    assert hit.source == "database" and hit.params == result.params
