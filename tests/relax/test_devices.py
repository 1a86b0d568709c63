"""Tuning a module on several GPUs, one worker process per GPU (compile-only here: the workers
see no GPU and rank by estimate, the same protocol a GPU run uses)."""

import os
import warnings
from pathlib import Path

import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import fastdlight
from fastdlight.arch import CUDA
from fastdlight.relax import devices
from fastdlight.search.options import TuneOptions

H100 = CUDA("nvidia/nvidia-h100")
HERE = Path(__file__).resolve().parent


@I.ir_module
class Model:
    @R.function
    def main(x: R.Tensor((128, 256), "float16"), w: R.Tensor((256, 512), "float16"), w2: R.Tensor((256, 512), "float16"),
             b: R.Tensor((512,), "float16")):
        with R.dataflow():
            y = R.add(R.matmul(x, w), b)
            g = R.nn.relu(R.matmul(x, w2))  # the same matmul, another epilogue: a sibling
            s = R.sum(R.multiply(y, g), axis=[1])
            e = R.exp(s)
            R.output(e)
        return e


@pytest.fixture(scope="module")
def model():
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])
    return seq(Model)


def tune(model, **kwargs):
    tuning = fastdlight.ApplyFastTuning(topk=2, target=H100, measure=False, max_workers=1, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuning, tuning(model)


def scheduled(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def test_functions_are_shared_out_between_the_gpus_and_come_back_scheduled(model):
    one, alone = tune(model)
    two, spread = tune(model, devices=(0, 1))
    rows = {e.function: e for e in two.report}
    assert {e.device for e in rows.values()} == {0, 1}  # both workers had work
    # a matmul and its sibling (seeded from it where timed) went to one worker together
    assert len({e.device for e in rows.values() if "matmul" in e.function}) == 1
    assert {n: f.script() for n, f in scheduled(spread).items()} == {n: f.script() for n, f in scheduled(alone).items()}
    assert {e.function: (e.status, e.config) for e in two.report} == {e.function: (e.status, e.config) for e in one.report}
    fastdlight.build(spread, H100.target)  # the workers' scheduled functions lower and build


@pytest.fixture
def dying(monkeypatch):
    """Workers die at once on the GPUs given (``tests/relax/dying_worker.py``)."""
    monkeypatch.setattr(devices, "WORKER", "dying_worker")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return lambda gpus: monkeypatch.setenv("DYING_GPUS", gpus)


def test_a_dead_worker_s_functions_go_to_the_worker_that_finished(model, dying):
    dying("1")
    _, alone = tune(model)
    two, spread = tune(model, devices=(0, 1))
    moved = [e for e in two.report if e.requeued]
    assert moved and all("GPU 1 exited with 3" in e.requeued and "simulated crash" in e.requeued for e in moved)
    assert {e.device for e in two.report} == {0}
    assert {n: f.script() for n, f in scheduled(spread).items()} == {n: f.script() for n, f in scheduled(alone).items()}


def test_a_hung_worker_is_stopped_and_its_functions_go_elsewhere(model, dying, monkeypatch):
    monkeypatch.setenv("HANGING_GPUS", "0")
    monkeypatch.setattr(devices, "WORKER_SILENCE_S", 45.0)  # the other worker must report first, on 2 CI cores
    two, spread = tune(model, devices=(0, 1))
    moved = [e for e in two.report if e.requeued]
    assert moved and all("GPU 0 finished nothing for 45 s and was stopped" in e.requeued for e in moved)
    assert {e.device for e in two.report} == {1} and len(scheduled(spread)) == len(two.report)


def test_when_every_worker_dies_the_pass_tunes_here(model, dying):
    dying("0,1")
    _, alone = tune(model)
    two, spread = tune(model, devices=(0, 1))
    assert all(e.device is None and "exited with 3" in e.requeued for e in two.report)
    assert {n: f.script() for n, f in scheduled(spread).items()} == {n: f.script() for n, f in scheduled(alone).items()}


def test_families_are_dealt_heaviest_first_to_the_least_loaded():
    families, weights = [[0, 1], [2], [3], [4]], [20, 20, 20, 4, 4]
    assert devices.shares(families, weights, 2) == [[0, 1], [2, 3, 4]]
    assert devices.shares([[0]], [5], 3) == [[0], [], []]


def test_devices_are_checked_and_local_hooks_keep_one_process():
    assert devices.spreads(TuneOptions(devices="0,1"))
    assert devices.spreads(TuneOptions(devices=(3,)))  # not this process's GPU 0: a worker on GPU 3
    assert not devices.spreads(TuneOptions(devices=(0,)))
    assert not devices.spreads(TuneOptions(devices=(0, 1), ref=len))  # a numpy reference cannot travel
    with pytest.raises(ValueError, match="not both"):
        TuneOptions(devices=(0, 1), rpc="host:9000")
    with pytest.raises(ValueError, match="distinct GPU indices"):
        TuneOptions(devices="0,0")


def test_one_function_is_tuned_on_this_process_s_gpu_only():
    from fastdlight import ops

    op = ops.elementwise((64, 64), "float16", "add")
    with pytest.raises(ValueError, match="one function is tuned in this process"):
        fastdlight.tune(op.func, H100, topk=1, devices=(1,), measure=False)


@pytest.mark.gpu
def test_gpu_a_model_tuned_on_two_gpus_computes_what_stock_dlight_s_build_does(model, tmp_path):
    import numpy as np

    from fastdlight.arch import auto_arch

    if not tvm.cuda(1).exist:
        pytest.skip("needs two GPUs")
    tuning = fastdlight.ApplyFastTuning(topk=4, devices=(0, 1), meta_database_dir=tmp_path)
    tuned = tuning(model)
    assert {e.device for e in tuning.report} == {0, 1} and all(e.status == "tuned" for e in tuning.report)
    dev, target = tvm.cuda(0), auto_arch().target
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-0.1, 0.1, s).astype("float16"), dev)
            for s in ((128, 256), (256, 512), (256, 512), (512,))]
    outs = [relax.VirtualMachine(fastdlight.build(m, target), dev)["main"](*args).numpy() for m in (tuned, model)]
    np.testing.assert_allclose(outs[0].astype("float32"), outs[1].astype("float32"), rtol=2e-2, atol=1e-3)
