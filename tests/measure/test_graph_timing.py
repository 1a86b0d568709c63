"""CUDA-graph timing: graph sizing (CPU); a real kernel timed in a graph agrees with queued
timing and the launch stream is restored (GPU)."""

import pytest
import tvm
import tvm_ffi

from fastdlight import ops
from fastdlight.arch import auto_arch
from fastdlight.compiler.compile import build
from fastdlight.config import Config
from fastdlight.measure import graph_timing
from fastdlight.measure.timing import function_name, time_launches
from fastdlight.measure.workload import Workload
from fastdlight.schedules import apply_config


def test_a_graph_lasts_long_enough_and_covers_whole_rotations():
    n = graph_timing.launches_per_graph(0.005, 7)
    assert n % 7 == 0 and n * 0.005 >= graph_timing.MIN_GRAPH_MS
    assert graph_timing.launches_per_graph(5.0, 3) == 3  # one rotation of a long kernel is enough
    assert graph_timing.launches_per_graph(1e-6, 1) == graph_timing.MAX_GRAPH_LAUNCHES
    short = graph_timing.launches_per_graph(0.005, 7, min_ms=0.25)  # a first-pass graph
    assert short % 7 == 0 and 0.25 <= short * 0.005 < graph_timing.MIN_GRAPH_MS


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 8192])  # ~3 us and ~0.2 ms adds
def test_graph_timing_of_a_tvm_kernel(n):
    op = ops.elementwise((n, n), "float16", "add")
    arch = auto_arch()
    mod = build(apply_config(op.func, Config("elementwise", (1, 256), (1, 1))).mod, arch.target)
    dev = tvm.cuda(0)
    wl = Workload(op.func, dev)
    fn = mod[function_name(mod, op.func)]
    sets = wl.timing_arg_sets(arch.l2_bytes)
    before = tvm_ffi.get_raw_stream(dev)
    queued = time_launches(fn, sets, dev, 50).median_ms
    graph = graph_timing.time_graph(fn, sets, dev, 50, queued).median_ms
    assert tvm_ffi.get_raw_stream(dev) == before
    assert 0 < graph <= queued * 1.5 and graph >= queued / 3


def test_replays_are_queued_in_batches_of_a_few_milliseconds():
    assert graph_timing.replay_count(100.0, 1.0) == 100 and graph_timing.replay_count(1.0, 1.0) == 5
    assert graph_timing.replay_batches(20, 1.0) == [8, 8, 4]
    assert graph_timing.replay_batches(5, 0.25) == [5]  # a first-pass timing: one wait
    assert graph_timing.replay_batches(3, 20.0) == [1, 1, 1]  # a long replay: each one waited for
    assert sum(graph_timing.replay_batches(1000, 0.3)) == 1000
