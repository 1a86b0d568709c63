"""Each function's GPU among several, and each GPU's turn (compile-only here; the GPU test
tunes a model on two GPUs where the machine has them)."""

import threading
import time
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import fastdlight
from fastdlight.arch import CUDA, auto_arch
from fastdlight.measure import gpu_turns
from fastdlight.measure.gpu_turns import GPU_TURNS, GpuTurns
from fastdlight.search.options import TuneOptions

H100 = CUDA("nvidia/nvidia-h100")


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


def test_a_function_goes_to_the_gpu_timing_the_fewest_and_gives_it_back():
    turns = GpuTurns()
    with turns.function_device((0, 1)) as first, turns.function_device((0, 1)) as second:
        assert (first, second) == (0, 1)
        with turns.function_device((0, 1)) as third:
            assert third == 0 and turns.busy(0) == 2
    with turns.function_device((1, 0)) as again:
        assert again == 1  # equals: the first listed
    assert turns.busy(0) == turns.busy(1) == 0 and turns.given == {0: 2, 1: 2}
    with pytest.raises(ValueError, match="no GPU"), turns.function_device(()):
        pass


def test_a_failed_function_still_gives_its_gpu_back():
    turns = GpuTurns()
    with pytest.raises(RuntimeError), turns.function_device((0, 1)):
        raise RuntimeError("tuning failed")
    assert turns.busy(0) == 0


def test_each_gpu_has_a_turn_of_its_own():
    turns = GpuTurns()
    assert turns.turn(1) is turns.turn(1) and turns.turn(0) is not turns.turn(1)
    held = threading.Event()
    with turns.turn(0):  # GPU 1's turn is free while GPU 0's is held
        assert turns.turn(0).locked() and not turns.turn(0).acquire(timeout=0.01)
        threading.Thread(target=lambda: turns.turn(1).acquire(timeout=5) and held.set()).start()
        assert held.wait(5)
        time.sleep(0.02)
    assert turns.held_s()[0] >= 0.02 and not turns.turn(0).locked()


def test_devices_are_checked():
    assert TuneOptions(devices="0,1").devices == (0, 1)
    with pytest.raises(ValueError, match="not both"):
        TuneOptions(devices=(0, 1), rpc="host:9000")
    with pytest.raises(ValueError, match="distinct GPU indices"):
        TuneOptions(devices="0,0")


def test_a_model_on_two_gpus_schedules_every_function(model):
    tuning = fastdlight.ApplyFastTuning(topk=2, target=H100, measure=False, max_workers=1, devices=(0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(model)
    funcs = [f for _, f in tuned.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert funcs and all(f.attrs is not None and f.attrs.get("tirx.is_scheduled") for f in funcs)


@pytest.mark.gpu
def test_gpu_a_model_tuned_on_two_gpus_uses_both_and_computes_what_stock_dlight_s_build_does(model, tmp_path):
    if not tvm.cuda(1).exist:
        pytest.skip("needs two GPUs")
    given = dict(GPU_TURNS.given)
    tuning = fastdlight.ApplyFastTuning(topk=4, devices=(0, 1), meta_database_dir=tmp_path)
    tuned = tuning(model)
    assert all(GPU_TURNS.given.get(i, 0) > given.get(i, 0) for i in (0, 1))
    assert all(e.status == "tuned" for e in tuning.report)
    dev, target = tvm.cuda(0), auto_arch().target
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-0.1, 0.1, s).astype("float16"), dev)
            for s in ((128, 256), (256, 512), (256, 512), (512,))]
    outs = [relax.VirtualMachine(fastdlight.build(m, target), dev)["main"](*args).numpy() for m in (tuned, model)]
    np.testing.assert_allclose(outs[0].astype("float32"), outs[1].astype("float32"), rtol=2e-2, atol=1e-3)


def test_a_gpu_the_machine_has_not_is_one_line(monkeypatch):
    class Device:
        def __init__(self, index):
            self.exist = index < 2

    monkeypatch.setattr(gpu_turns.tvm, "cuda", Device)
    gpu_turns.check_devices((0, 1))
    with pytest.raises(ValueError, match=r"^devices 0,3,5: GPU 3,5 is not on this machine \(2 GPUs visible\)$"):
        gpu_turns.check_devices((0, 3, 5))
