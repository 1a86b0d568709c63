"""ApplyFastTuning on a small Relax model: every PrimFunc scheduled, the database replayed, the
result compiles to cubin (CPU); on a GPU, the tuned model computes the right numbers."""

import dataclasses
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import fastdlight
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import compile_cubin, cuda_source
from fastdlight.config import Config, StockSchedule
from fastdlight.measure.inputs import known_input_values
from fastdlight.measure.timing import Timing
from fastdlight.policies.select import CandidateSet
from fastdlight.relax import apply_fast_tuning
from fastdlight.relax.apply_fast_tuning import best_of_first, policy_rank
from fastdlight.schedules.symbolic import DISPATCHER
from fastdlight.search import candidates
from fastdlight.search.candidates import SEEDED_OWN_TOP, Tuned, seeded
from fastdlight.search.database import TuningDatabase
from fastdlight.search.results import CompileResult
from fastdlight.search.runner import TuningError

H100 = CUDA("nvidia/nvidia-h100")


@I.ir_module
class Model:
    @R.function
    def main(x: R.Tensor((128, 256), "float16"), w: R.Tensor((256, 512), "float16"), b: R.Tensor((512,), "float16")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            s = R.sum(z, axis=[1])
            R.output(s)
        return s


@I.ir_module
class Dynamic:
    @R.function
    def main(x: R.Tensor(("n", 64), "float32")):
        with R.dataflow():
            y = R.exp(x)
            R.output(y)
        return y


def legalized(mod):
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])  # fmt: skip
    return seq(mod)


def prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


@pytest.fixture(scope="module")
def model():
    return legalized(Model)


def test_every_primfunc_is_scheduled_and_the_database_replays_it(model, tmp_path, monkeypatch):
    before = {name: f.script() for name, f in prim_funcs(model).items()}
    tuning = fastdlight.ApplyFastTuning(topk=2, target=H100, meta_database_dir=tmp_path, measure=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(model)
    funcs = prim_funcs(tuned)
    assert set(funcs) == {"fused_matmul_add", "sum"}
    for f in funcs.values():
        assert f.attrs["tirx.is_scheduled"]
        # bound to the GPU's blocks; an s_tir kernel stays private, a TIRx (wgmma) kernel names
        # its CTA with T.cta_id and keeps a global symbol: lowering gives it its packed entry
        if f.attrs.get("tirx.kernel"):
            assert "T.cta_id" in f.script() and "global_symbol" in f.attrs
        else:
            assert "blockIdx.x" in f.script() and "global_symbol" not in f.attrs
    assert {e.function: e.status for e in tuning.report} == {"fused_matmul_add": "tuned", "sum": "tuned"}
    # unmeasured, the best estimate wins: for this small GEMM the two tensor-core templates' best
    # tiles estimate within 1% of each other
    assert next(e.config for e in tuning.report if e.function == "fused_matmul_add").kind in ("matmul_tc",
                                                                                             "matmul_wgmma")
    # the caller's module is untouched
    assert {name: f.script() for name, f in prim_funcs(model).items()} == before
    # nothing was verified (no GPU), so nothing was stored
    assert len(TuningDatabase(tmp_path)) == 0

    # verified records (as a GPU run stores them) are replayed without tuning
    db = TuningDatabase(tmp_path)
    for name, func in prim_funcs(model).items():
        config = next(e.config for e in tuning.report if e.function == name)
        db.commit(func, H100, config, 0.01, True, reference="test")

    def no_tuning(*args, **kwargs):
        raise AssertionError("tuned although the database has the function")

    monkeypatch.setattr(candidates, "candidate_sets", no_tuning)
    replay = fastdlight.ApplyFastTuning(topk=2, target=H100, meta_database_dir=tmp_path, measure=False)
    again = replay(model)
    assert {e.status for e in replay.report} == {"database"}
    tvm.ir.assert_structural_equal(again, tuned)

    # the tuned model compiles; its kernels go through nvcc to a cubin
    ex = fastdlight.build(tuned, H100.target)
    src = cuda_source(ex)
    assert src.count("__global__") >= 2
    assert compile_cubin(src, H100.target).registers > 0


def test_unknown_keyword_is_refused_when_the_pass_is_made():
    with pytest.raises(TypeError, match="unknown tuning option.*tile_size"):
        fastdlight.ApplyFastTuning(topk=2, target=H100, tile_size=4)


def test_a_symbolic_function_gets_a_dispatcher_at_default_values():
    tuning = fastdlight.ApplyFastTuning(topk=2, target=H100, measure=False)
    out = tuning(legalized(Dynamic))  # symbolic n, no opt_shapes: values from the hardware model
    (entry,) = tuning.report
    assert entry.status == "tuned" and "(default values for n)" in entry.dispatch
    assert entry.dispatch.count("n<=") + entry.dispatch.count("n=") == 4
    (f,) = prim_funcs(out).values()
    assert f.attrs["tirx.is_scheduled"] and DISPATCHER in f.attrs and "blockIdx.x" in f.script()
    # the Relax model with its symbolic sequence length builds with the dispatcher in it
    src = cuda_source(fastdlight.build(out, H100.target))
    assert src.count("__global__") >= 4 and compile_cubin(src, H100.target).binary


def test_a_function_nothing_can_schedule_is_left_with_a_warning(monkeypatch):
    def nothing(*_args, **_kwargs):
        raise TuningError("no candidate could be used (3 tried, none compiled)")

    monkeypatch.setattr(apply_fast_tuning, "tune_dispatch", nothing)
    tuning = fastdlight.ApplyFastTuning(topk=2, target=H100, measure=False)
    with pytest.warns(UserWarning, match="left unscheduled: no candidate could be used"):
        out = tuning(legalized(Dynamic))
    (entry,) = tuning.report
    assert entry.status == "untuned" and entry.error and entry.winner is None
    (f,) = prim_funcs(out).values()
    assert "tirx.is_scheduled" not in f.attrs


def test_bad_topk_is_refused():
    with pytest.raises(ValueError, match="topk"):
        fastdlight.ApplyFastTuning(topk=0)


@pytest.mark.gpu
def test_tuned_model_runs_correctly_on_the_gpu(model):
    dev = tvm.cuda(0)
    arch = CUDA.from_device(dev)
    tuning = fastdlight.ApplyFastTuning(topk=4, target=arch)
    tuned = tuning(model)
    assert {e.status for e in tuning.report} == {"tuned"}
    assert all(e.verified for e in tuning.report)
    vm = relax.VirtualMachine(fastdlight.build(tuned, arch.target), dev)
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-1, 1, s).astype("float16") for s in ((128, 256), (256, 512), (512,)))
    out = vm["main"](*(tvm.runtime.tensor(a, dev) for a in (x, w, b))).numpy().astype(np.float64)
    ref = ((x.astype(np.float64) @ w.astype(np.float64)) + b).sum(axis=1)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-2


@I.ir_module
class Siblings:
    @R.function
    def main(x: R.Tensor((128, 256), "float16"), w1: R.Tensor((256, 512), "float16"),
             w2: R.Tensor((256, 512), "float16"), b: R.Tensor((512,), "float16")):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w1))
            z = R.add(R.matmul(x, w2), b)
            R.output(y, z)
        return (y, z)


def test_a_sibling_with_the_same_matmul_is_tuned_after_it_from_its_best_configs(monkeypatch):
    """Two functions with the same matmul and different epilogues: the second is tuned once the
    first is done, its candidates seeded with the first's best configs."""
    calls = []
    real = apply_fast_tuning.tune_function

    def recording(func, arch, topk, opts, db=None, seeds=()):
        calls.append((len(calls), seeds))
        return real(func, arch, topk, opts, db=db, seeds=seeds)

    monkeypatch.setattr(apply_fast_tuning, "tune_function", recording)
    # without a GPU nothing is timed: stand in for "the fastest" with the winner
    monkeypatch.setattr(apply_fast_tuning, "best_configs", lambda tuned, n: (tuned.config,))
    tuning = fastdlight.ApplyFastTuning(topk=4, target=H100, measure=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuning(legalized(Siblings))
    report = {e.function: e for e in tuning.report}
    assert len(report) == 2 and all(e.status == "tuned" for e in report.values())
    assert [bool(seeds) for _, seeds in calls] == [False, True]
    leader = next(e for e in report.values() if not e.seeded)
    assert calls[1][1] == (leader.config,)
    assert sum(e.seeded for e in report.values()) == 1


def test_seeding_cuts_a_candidate_set_to_the_seeds_and_its_own_best_ranked():
    own = tuple(Config("matmul_tc", block=(64 * (i + 1), 64), warp=(32, 32), rstep=(32,)) for i in range(8))
    stock = StockSchedule("sm_90a")
    cand = CandidateSet("TensorCorePolicy", None, own + (stock,))
    cut = seeded(cand, (own[5], own[7]))
    assert cut.configs == own[:SEEDED_OWN_TOP] + (own[5], own[7], stock)
    other = Config("matmul_tc", block=(16, 16), warp=(16, 16), rstep=(16,))
    assert seeded(cand, (other,)) is cand  # no seed applies: the full set


def _scaled_calls():
    """A PrimFunc with two 0-d inputs, called twice: the exponent 0.5 at both sites, the scale
    0.125 at one and 0.25 at the other (a cast constant stays such an input after fusion)."""
    @T.prim_func(private=True, s_tir=True)
    def scaled(x: T.Buffer((64, 128), "float16"), e: T.Buffer((), "float16"), s: T.Buffer((), "float16"),
               y: T.Buffer((64, 128), "float16")):
        for i, j in T.grid(64, 128):
            with T.sblock("y"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.pow(x[vi, vj], e[()]) * s[()]

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 128), "float16"))
    with bb.function("main", [x]):
        gv = bb.add_func(scaled, "scaled")
        out_ty = relax.TensorType((64, 128), "float16")
        a = bb.emit(relax.call_tir(gv, (x, relax.const(0.5, "float16"), relax.const(0.125, "float16")), out_ty))
        b = bb.emit(relax.call_tir(gv, (a, relax.const(0.5, "float16"), relax.const(0.25, "float16")), out_ty))
        bb.emit_func_output(b)
    return bb.get()


def test_scalar_constants_a_model_passes_reach_the_tuning_inputs(monkeypatch):
    mod = _scaled_calls()
    constants = apply_fast_tuning.scalar_constant_inputs(mod)
    assert list(constants.values()) == [{"e": 0.5}]  # the scale differs between the calls: random
    seen = []

    def tune_function(func, *args, **kwargs):
        seen.append(known_input_values(func))
        raise ValueError("not tuned here")

    monkeypatch.setattr(apply_fast_tuning, "tune_function", tune_function)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fastdlight.ApplyFastTuning(topk=2, target=H100)(mod)
    assert seen == [{"e": 0.5}]


def test_parameters_that_share_a_name_are_told_apart():
    """FuseTIR names parameters after the Relax values passed in, and two may share a name
    (EfficientNet's squeeze-excite: a [1, C] scale and the [1, H, W, C] map it scales, both
    ``lv9``); the analysis keyed their accesses by name and failed (tuple index out of range)."""
    scale = te.placeholder((1, 32), "float32", name="lv9")
    x = te.placeholder((1, 14, 14, 32), "float32", name="lv9")
    y = te.compute((196, 32), lambda i, c: (scale[0, c] * x[0, i // 14, i % 14, c]).astype("float16"), name="y")
    func = te.create_prim_func([scale, x, y])
    assert [str(p.name) for p in func.params[:2]] == ["lv9", "lv9"]
    mod = tvm.IRModule({"scaled": func.with_attr("global_symbol", "scaled")})
    tuning = fastdlight.ApplyFastTuning(topk=1, target=H100, measure=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(mod)
    assert [(e.function, e.status) for e in tuning.report] == [("scaled", "tuned")], tuning.report
    assert [str(p.name) for p in tuned["scaled"].params] == ["lv9", "lv9_1", "y"]
    assert "scaled_kernel" in cuda_source(fastdlight.build(tuned, H100.target))


def test_the_report_says_where_the_winner_ranked_and_what_a_smaller_top_k_had_won():
    def row(i, ms, stock=False):
        config = StockSchedule("sm_90a") if stock else Config("elementwise", (1, 64 * (i + 1)), (1, 1))
        return CompileResult(config, i, artifact={}, timing=Timing(ms, (ms,)))

    rows = [row(0, 0.02, stock=True)] + [row(i, 0.01 - i * 0.001) for i in range(1, 10)]
    tuned = Tuned(rows[-1].config, "tuned", "DefaultPolicy", tuple(rows), rows[-1])
    assert policy_rank(tuned) == 8  # the policy's ninth config (the stock row does not count)
    assert best_of_first(tuned) == ((4, 0.006), (8, 0.002))
    assert best_of_first(dataclasses.replace(tuned, source="database")) == ()
