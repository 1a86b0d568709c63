"""A function's timings on several GPUs: each first-pass timing on whichever GPU is free first,
the finalists' hot turns all on one GPU, the winner checked there (a fake GPU per index)."""

import threading

import pytest

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.config import Config
from fastdlight.measure.gpu_turns import GpuTurns
from fastdlight.measure.timing import Timing
from fastdlight.search import stages
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult
from fastdlight.search.runner import SPREAD_MAX_BYTES, spare_devices

H200 = CUDA("nvidia/nvidia-h200")


class FakeWorkload:
    def __init__(self, dev):
        self.dev, self.func, self.args = dev, None, []

    def timing_arg_sets(self, l2_bytes):
        return [[]]


@pytest.fixture
def gpus(monkeypatch):
    """Two fake GPUs: ``seen`` lists the GPU of each timing and heat, in order."""
    seen, turns = [], GpuTurns()

    def time_module(module, name, arg_sets, dev, budget_ms, method, flush, give_up_ms=None):
        seen.append(dev)
        return Timing.of([module[name]] * 5)

    monkeypatch.setattr(stages, "GPU_TURNS", turns)
    monkeypatch.setattr(stages, "time_module", time_module)
    monkeypatch.setattr(stages, "heat", lambda launch, arg_sets, dev: seen.append(dev))
    monkeypatch.setattr(stages, "function_name", lambda module, func: "main")
    monkeypatch.setattr(stages, "load_module", lambda art, arch: art)
    return seen, turns


def row(index: int, ms: float) -> CompileResult:
    return CompileResult(Config("elementwise", (1, 64 << index), (1, 1), cost=float(index + 1)), index,
                         artifact={"main": ms})


def test_first_pass_timings_go_to_the_free_gpu_and_the_finalists_all_to_one(gpus):
    seen, turns = gpus
    wls = {0: FakeWorkload(0), 1: FakeWorkload(1)}
    timer = stages.Timer(H200, lambda: wls[0], TuneOptions(budget_ms=30, screen_ms=10), 0, {1: lambda: wls[1]})
    with turns.turn(0):  # GPU 0 busy with another function: the first candidate goes to GPU 1
        first = timer.measure(row(0, 1.0))
    with turns.turn(1):
        second = timer.measure(row(1, 1.1))
    assert seen == [1, 0] and first.latency_ms == 1.0 and second.latency_ms == 1.1
    seen.clear()
    held = threading.Event()
    release = threading.Event()

    def hold_gpu_0():
        with turns.turn(0):
            held.set()
            release.wait(10)

    other = threading.Thread(target=hold_gpu_0)
    other.start()
    held.wait(10)
    hot = timer.retime_fastest([first, second])
    release.set()
    other.join()
    assert set(seen) == {1} and all(r.timing.hot for r in hot)  # every hot turn on GPU 1, GPU 0 busy
    assert timer.workload() is wls[1]  # the winner is checked where the finalists were timed


def test_a_spare_gpu_whose_inputs_failed_is_left_out(gpus):
    seen, turns = gpus
    timer = stages.Timer(H200, lambda: FakeWorkload(0), TuneOptions(budget_ms=30, screen_ms=10), 0, {1: lambda: None})
    done = []
    with turns.turn(1):  # never waited for: GPU 1 has no inputs
        done.append(timer.measure(row(0, 1.0)))
    assert seen == [0] and done[0].latency_ms == 1.0


def test_first_free_waits_for_whichever_turn_is_released():
    turns = GpuTurns()
    got = []
    turns.turn(0).acquire()
    turns.turn(1).acquire()

    def wait_for_any():
        with turns.first_free((0, 1), "time") as index:
            got.append(index)

    waiter = threading.Thread(target=wait_for_any)
    waiter.start()
    turns.turn(1).release()
    waiter.join(10)
    assert got == [1] and turns.turn(0).locked() and not turns.turn(1).locked()
    turns.turn(0).release()


def test_large_functions_stay_on_their_home_gpu():
    small = ops.elementwise((64, 64), "float16", "add").func
    assert spare_devices(small, (0, 1, 2), 1) == (0, 2) and spare_devices(small, (1,), 1) == ()
    side = int((SPREAD_MAX_BYTES // 2) ** 0.5) + 64  # two fp16 inputs and the output: over the bound
    big = ops.elementwise((side, side), "float16", "add").func
    assert spare_devices(big, (0, 1), 0) == ()
