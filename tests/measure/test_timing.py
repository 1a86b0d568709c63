"""Inputs, poisoning and timing, exercised on the CPU (llvm) so CI can run them."""

import math

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build
from fastdlight.config import Config
from fastdlight.measure import inputs, workload
from fastdlight.measure import timing as measure
from fastdlight.measure.gpu_turns import GPU_TURNS
from fastdlight.measure.verify import check_outputs, expected_from_numpy
from fastdlight.schedules import dispatch_config
from fastdlight.search import runner


def cpu_build(func):
    return tvm.compile(tvm.IRModule({"main": func}), target="llvm").mod


def test_output_indices():
    assert workload.output_indices(ops.matmul(32, 32, 32, "float32").func) == [2]
    assert workload.output_indices(ops.softmax(8, 16).func) == [1]
    assert workload.output_indices(ops.elementwise((4, 4), "float16", "copy").func) == [1]


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8"])
def test_integer_inputs_are_never_zero(dtype):
    arr = workload.random_array((64, 64), dtype, np.random.default_rng(0))
    assert arr.dtype == np.dtype(dtype) and np.all(arr != 0)
    assert len(np.unique(arr)) > 2


def test_float_and_bf16_inputs():
    rng = np.random.default_rng(0)
    a = workload.random_array((128,), "float16", rng)
    assert a.dtype == np.float16 and np.all(np.abs(a) <= 1) and np.std(a) > 0.3
    b = workload.random_array((128,), "bfloat16", rng)
    # bf16 values: the low 16 bits of the float32 pattern are zero
    assert np.all(b.view(np.uint32) & 0xFFFF == 0)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_workload_checks_a_built_kernel_and_catches_poison(dtype):
    op = ops.elementwise((64, 64), dtype, "add")
    mod = cpu_build(op.func)
    wl = workload.Workload(op.func, tvm.cpu(0))
    expected = expected_from_numpy(op.reference, wl.host_inputs, op.func)
    name = measure.function_name(mod, op.func)
    assert check_outputs(wl.run_outputs(mod[name]), expected, [dtype]).ok
    # A kernel that writes nothing leaves the poison in place: every element must fail.
    res = check_outputs(wl.run_outputs(lambda *args: None), expected, [dtype])
    assert not res.ok and res.bad == 64 * 64


def test_the_inputs_are_made_without_the_device_lock_and_copied_with_it(monkeypatch):
    """A tuning run passes its GPU turn: the copies hold it, the slow host work does not."""
    class Lock:
        held = False

        def __enter__(self):
            self.held = True

        def __exit__(self, *exc):
            self.held = False

    lock, made, copied = Lock(), [], []
    random_array, to_device = workload.random_array, workload.to_device
    monkeypatch.setattr(workload, "random_array", lambda *a: made.append(lock.held) or random_array(*a))
    monkeypatch.setattr(workload, "to_device", lambda *a: copied.append(lock.held) or to_device(*a))
    op = ops.matmul(16, 16, 16, "float32")
    wl = workload.Workload(op.func, tvm.cpu(0), seed=3, device_lock=lock)
    assert made == [False, False] and copied == [True, True] and not lock.held
    plain = workload.Workload(op.func, tvm.cpu(0), seed=3)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(wl.args[:2], plain.args[:2]))


def test_a_copy_on_another_device_has_the_same_inputs_without_making_them_again(monkeypatch):
    op = ops.matmul(16, 16, 16, "float32")
    wl = workload.Workload(op.func, tvm.cpu(0), seed=3)
    monkeypatch.setattr(workload, "random_array", lambda *a: pytest.fail("inputs made again"))
    copy = wl.copy(tvm.cpu(0))
    assert copy.args[0] is not wl.args[0] and copy.out_idx == wl.out_idx
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(wl.args[:2], copy.args[:2]))
    maker = workload.Workload.background(op.func, None, 0, tvm.cpu(0), source=lambda: wl)
    assert np.array_equal(maker.get().args[0].numpy(), wl.args[0].numpy())
    failed = workload.Workload.background(op.func, None, 0, tvm.cpu(0), source=lambda: None)
    assert failed.get() is None and "not made" in failed.error


def test_a_candidates_check_run_holds_the_gpu_turn(monkeypatch):
    op = ops.elementwise((8, 8), "float32", "add")
    mod = cpu_build(op.func)
    wl = workload.Workload(op.func, tvm.cpu(0))
    seen = []
    run_outputs = wl.run_outputs
    monkeypatch.setattr(wl, "run_outputs", lambda fn: seen.append(GPU_TURNS.turn(0).locked()) or run_outputs(fn))
    verdict = runner.verify_module(mod, wl, expected_from_numpy(op.reference, wl.host_inputs, op.func))
    assert verdict.ok and seen == [True] and not GPU_TURNS.turn(0).locked()


def test_time_module_budget_and_median():
    op = ops.elementwise((256, 256), "float32", "add")
    mod = cpu_build(op.func)
    wl = workload.Workload(op.func, tvm.cpu(0))
    t = measure.time_module(mod, measure.function_name(mod, op.func), wl.args, tvm.cpu(0), budget_ms=20,
                            flush_bytes=1 << 20)
    assert len(t.samples_ms) >= 10
    assert t.median_ms > 0 and math.isfinite(t.median_ms)
    assert t.min_ms <= t.median_ms


def test_flush_is_larger_than_l2():
    assert measure.flush_bytes_for(50 << 20) > 50 << 20


def test_rotation_copies_cover_twice_the_l2():
    l2 = 50 << 20
    for nbytes in (32 << 20, 128 << 20, 3 << 20):
        n = measure.rotation_copies(nbytes, l2)
        assert (n - 1) * nbytes >= 2 * l2  # the other copies read in between evict this one
        assert (n - 2) * nbytes < 2 * l2  # and no more copies than that
    assert measure.rotation_copies(1, l2) == measure.MAX_COPIES
    assert measure.rotation_copies(3 << 30, l2) == 1  # a second copy would not fit the memory cap


def test_timing_arg_sets_copy_inputs_and_share_outputs():
    op = ops.elementwise((256, 256), "float32", "add")
    wl = workload.Workload(op.func, tvm.cpu(0))
    sets = wl.timing_arg_sets(l2_bytes=1 << 20)
    assert len(sets) == measure.rotation_copies(2 * 256 * 256 * 4, 1 << 20) > 2
    assert sets[0] == wl.args and wl.timing_arg_sets(1 << 20) is sets  # made once
    out = wl.out_idx[0]
    for args in sets[1:]:
        assert args[out].same_as(wl.args[out])
        for i in range(len(args)):
            if i != out:
                assert not args[i].same_as(wl.args[i])
                np.testing.assert_array_equal(args[i].numpy(), wl.args[i].numpy())


def test_time_module_rotates_through_every_set():
    op = ops.elementwise((64, 64), "float32", "add")
    mod = cpu_build(op.func)
    wl = workload.Workload(op.func, tvm.cpu(0))
    sets = wl.timing_arg_sets(l2_bytes=64 << 10)
    assert len(sets) > 5
    sets = sets[:5]  # at least 10 launches are timed, whatever the CPU's load: every set is reached
    seen = []
    fn = mod[measure.function_name(mod, op.func)]
    t = measure.time_launches(lambda *a: (seen.append(a[0]), fn(*a)), sets, tvm.cpu(0), budget_ms=5)
    assert t.median_ms > 0
    for args in sets:
        assert any(a.same_as(args[0]) for a in seen)


def test_time_module_rejects_unknown_method():
    op = ops.elementwise((64, 64), "float32", "add")
    mod = cpu_build(op.func)
    wl = workload.Workload(op.func, tvm.cpu(0))
    with pytest.raises(ValueError, match="rotate"):
        measure.time_module(mod, measure.function_name(mod, op.func), wl.args, tvm.cpu(0), 5, method="bogus")


@pytest.mark.gpu
def test_rotated_timing_reads_from_dram_not_l2():
    """A 16 MB copy fits in L2. Timed on one argument set, back-to-back launches find their
    input in L2 and beat DRAM bandwidth; rotated through copies they must not."""
    dev = tvm.cuda(0)
    arch = CUDA.from_device(dev)
    op = ops.elementwise((2048, 4096), "float16", "copy")  # 16 MB in, 16 MB out
    sch = dispatch_config(op.func, Config("elementwise", block=(1, 2048), thread=(1, 8))).schedule
    mod = build(sch.mod, tvm.target.Target.from_device(dev))
    wl = workload.Workload(op.func, dev)
    name = measure.function_name(mod, op.func)
    rotated = measure.time_module(mod, name, wl.timing_arg_sets(arch.l2_bytes), dev, budget_ms=50)
    same = measure.time_module(mod, name, [wl.args], dev, budget_ms=50)
    def gbps(t):
        return op.bytes / (t.median_ms * 1e-3) / 1e9
    assert gbps(rotated) <= 1.1 * arch.dram_bandwidth_gbs, (gbps(rotated), arch.dram_bandwidth_gbs)
    assert gbps(same) > gbps(rotated)


def test_integer_inputs_that_index_another_buffer_stay_inside_it():
    @T.prim_func(s_tir=True)
    def gather(table: T.Buffer((32, 64), "float16"), idx: T.Buffer((128,), "int32"),
               out: T.Buffer((128, 64), "float16")):
        for i, j in T.grid(128, 64):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = table[idx[vi], vj]

    assert inputs.index_bounds(gather) == {"idx": 32}
    wl = workload.Workload(gather, tvm.cpu(0))
    idx = wl.host_inputs[1]
    assert idx.min() >= 0 and idx.max() < 32 and len(np.unique(idx)) > 8


def _gather_of(rows: int):
    @T.prim_func(s_tir=True)
    def gather(table: T.Buffer((rows, 8), "float16"), idx: T.Buffer((4, 32), "int32"),
               out: T.Buffer((4, 32, 8), "float16")):
        for b, i, j in T.grid(4, 32, 8):
            with T.sblock("out"):
                vb, vi, vj = T.axis.remap("SSS", [b, i, j])
                out[vb, vi, vj] = table[idx[vb, vi], vj]

    return gather


def test_indices_marked_distinct_repeat_no_value_and_too_many_are_refused():
    """A page table: drawn with repeats, some pages were read twice (the second time from the
    L2) and a paged kernel timed faster than the cache it stands for."""
    plain = workload.host_inputs(_gather_of(160))[1]
    assert len(np.unique(plain)) < plain.size  # 128 draws below 160: repeats, as before
    marked = _gather_of(160).with_attr(inputs.DISTINCT_INDICES, ["idx"])
    idx = workload.host_inputs(marked)[1]
    assert idx.shape == (4, 32) and len(np.unique(idx)) == 128 and idx.min() >= 0 and idx.max() < 160
    with pytest.raises(ValueError, match="128 distinct indices asked below 100"):
        workload.host_inputs(_gather_of(100).with_attr(inputs.DISTINCT_INDICES, ["idx"]))


def test_a_paged_decode_ops_page_table_has_no_page_twice():
    op = ops.decode_attention(2, 4, 1, 1000, 64, splits=4, page_size=16)
    table = workload.host_inputs(op.func)[3]
    assert table.shape == (2, 63) and len(np.unique(table)) == table.size


def test_an_index_copied_through_intermediate_buffers_is_bounded_too():
    # torch.export's advanced indexing: the index tensors are broadcast into intermediates
    # (which print under one name) before the gather reads through them
    @T.prim_func(s_tir=True)
    def advanced_index(table: T.Buffer((2, 512), "int64"), rows: T.Buffer((1, 1), "int64"),
                       cols: T.Buffer((1, 512), "int64"), out: T.Buffer((1, 512), "int64")):
        b0 = T.sblock_alloc_buffer((1, 512), "int64")
        b1 = T.sblock_alloc_buffer((1, 512), "int64")
        for i, j in T.grid(1, 512):
            with T.sblock("T_broadcast_to"):
                vi, vj = T.axis.remap("SS", [i, j])
                b0[vi, vj] = rows[vi, 0]
        for i, j in T.grid(1, 512):
            with T.sblock("T_broadcast_to_1"):
                vi, vj = T.axis.remap("SS", [i, j])
                b1[vi, vj] = cols[vi, vj] + T.int64(0)
        for i, j in T.grid(1, 512):
            with T.sblock("gather"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = table[b0[vi, vj], b1[vi, vj]]

    assert inputs.index_bounds(advanced_index) == {"rows": 2, "cols": 512}
    wl = workload.Workload(advanced_index, tvm.cpu(0))
    rows, cols = wl.host_inputs[1], wl.host_inputs[2]
    assert rows.min() >= 0 and rows.max() < 2 and cols.min() >= 0 and cols.max() < 512


def test_a_0d_buffer_parameter_gets_a_random_scalar_on_the_cpu():
    @T.prim_func(s_tir=True)
    def scaled(a: T.Buffer((8, 16), "float16"), s: T.Buffer((), "float16"), b: T.Buffer((8, 16), "float16")):
        for i, j in T.grid(8, 16):
            with T.sblock("b"):  # attention's 1/sqrt(d) arrives in a model as a 0-d constant
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * s[()]

    wl = workload.Workload(scaled, dev=tvm.cpu(0))
    assert [tuple(b.shape) for b in workload.param_buffers(scaled)] == [(8, 16), (), (8, 16)]
    assert [h.shape for h in wl.host_inputs] == [(8, 16), ()]
    # on the device it stays 0-d (np.ascontiguousarray would make it shape (1,), and the
    # kernel's ndim check rejects that)
    assert tuple(workload.to_device(wl.host_inputs[1], "float16", tvm.cpu(0)).shape) == ()


def test_inputs_a_model_passes_as_constants_hold_its_values():
    @T.prim_func(s_tir=True)
    def cube(x: T.Buffer((64,), "float16"), p: T.Buffer((), "float16"), y: T.Buffer((64,), "float16")):
        for i in range(64):
            with T.sblock("y"):
                vi = T.axis.spatial(64, i)
                y[vi] = T.pow(x[vi], p[()])

    assert inputs.known_input_values(cube) == {}
    known = cube.with_attr(inputs.INPUT_VALUES, {"p": 3.0})
    assert inputs.known_input_values(known) == {"p": 3.0}
    x, p, out = workload.host_inputs(known, seed=1)
    assert out is None and p.shape == () and float(p) == 3.0 and p.dtype == np.float16
    assert np.array_equal(x, workload.host_inputs(cube, seed=1)[0])  # the other inputs as before
    wl = workload.Workload(known, tvm.cpu(0), seed=1)
    assert float(wl.host_inputs[1]) == 3.0


class FakeClock:
    """A GPU whose launches each take ``ms``: CUDA events read this clock."""

    def __init__(self, ms: float):
        self.ms, self.now, self.launches = ms, 0.0, 0

    def launch(self, *args):
        self.now += self.ms
        self.launches += 1

    def event(self):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def synchronize(self):
                pass

            def elapsed_ms(self, end):
                return end.t - self.t

        return Event()


@pytest.fixture
def fake_gpu(monkeypatch):
    def install(ms: float):
        clock = FakeClock(ms)
        monkeypatch.setattr(measure, "Event", clock.event)
        monkeypatch.setattr(measure, "ensure_context", lambda index: None)
        dev = tvm.cuda(0)
        monkeypatch.setattr(measure, "_CLOCKS_UP", {dev.index})
        monkeypatch.setattr(type(dev), "sync", lambda self: None)
        return clock, dev

    return install


def test_a_launch_past_the_give_up_time_stops_at_the_probe_and_a_long_one_is_its_own_probe(fake_gpu):
    """A naive kernel of a second a launch: the warm-up, one probe launch (a long launch needs
    no four more to hide the host's latency) and no samples when the caller gives up at 8 ms,
    nor where the launch outlasts the budget; within a budget longer than the launch it gets
    its samples, at least five; a short kernel's probe queues four launches after one."""
    clock, dev = fake_gpu(1000.0)
    timing = measure.time_launches(clock.launch, [[]], dev, budget_ms=5, give_up_ms=8.0)
    assert timing.samples_ms == (1000.0,) and clock.launches == 1 + 1
    clock.launches = 0
    timing = measure.time_launches(clock.launch, [[]], dev, budget_ms=5)
    assert timing.samples_ms == (1000.0,) and clock.launches == 1 + 1
    clock.launches = 0
    timing = measure.time_launches(clock.launch, [[]], dev, budget_ms=1500)
    assert timing.median_ms == pytest.approx(1000.0) and clock.launches == 1 + 1 + 5
    medium, dev = fake_gpu(20.0)  # long, but inside the budget: sampled
    timing = measure.time_launches(medium.launch, [[]], dev, budget_ms=100)
    assert len(timing.samples_ms) >= 5
    short, dev = fake_gpu(0.01)
    measure.time_launches(short.launch, [[]], dev, budget_ms=5, give_up_ms=8.0)
    assert short.launches > 1 + 1 + 4
