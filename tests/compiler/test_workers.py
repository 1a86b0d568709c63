"""The crash-proof worker pool on its own."""

import threading
import time
from types import SimpleNamespace

import pytest

from fastdlight.arch import CUDA
from fastdlight.compiler import build_task
from fastdlight.compiler.workers import Outcome, Task, WorkerPool
from fastdlight.measure.gpu_turns import GPU_TURNS
from fastdlight.measure.timing import Timing
from fastdlight.search import stages
from fastdlight.search.options import TuneOptions

# the tasks live in a module of their own: a worker imports it to unpickle a task, and this
# one imports TVM (seconds on a busy machine, counted in a task's timeout)
from worker_tasks import abort, fail, hold_gil, note, pid, slow_note, slow_pid, square, torch_module


@pytest.fixture
def pool():
    with WorkerPool(2) as p:
        yield p


def test_results_keyed_and_complete(pool):
    outs = {o.key: o for o in pool.imap_unordered([Task(i, square, (i,)) for i in range(6)])}
    assert {k: o.value for k, o in outs.items()} == {i: i * i for i in range(6)}


def test_exception_crash_and_hang_are_isolated(pool):
    tasks = [Task("ok", square, (3,)), Task("raise", fail, (1,)), Task("abort", abort, (0,)),
             Task("hang", hold_gil, (0,)), Task("after", square, (4,))]
    t0 = time.monotonic()
    outs = {o.key: o for o in pool.imap_unordered(tasks, timeout=3)}
    assert time.monotonic() - t0 < 60
    assert outs["ok"].value == 9 and outs["after"].value == 16
    assert outs["raise"].error == "ValueError: bad input 1" and "Traceback" in outs["raise"].log
    assert outs["abort"].error == "worker crashed (SIGABRT)"
    assert outs["hang"].error.startswith("timeout after 3 s")


def test_dead_worker_is_replaced():
    with WorkerPool(1) as p:
        before = next(iter(p.imap_unordered([Task(0, pid, (0,))]))).value
        list(p.imap_unordered([Task(1, abort, (0,))]))
        after = next(iter(p.imap_unordered([Task(2, pid, (0,))]))).value
    assert before != after


def test_the_initializer_runs_once_per_worker_process(tmp_path):
    log = tmp_path / "init.log"
    with WorkerPool(1, initializer=note, initargs=(str(log),)) as p:
        outs = list(p.imap_unordered([Task(i, pid, (0,)) for i in range(3)]))
        assert all(o.ok for o in outs) and log.read_text().split() == [str(outs[0].value)]
        list(p.imap_unordered([Task(3, abort, (0,))]))  # a fresh worker runs it again
        (after,) = p.imap_unordered([Task(4, pid, (0,))])
    assert log.read_text().split() == [str(outs[0].value), str(after.value)]


def test_workers_block_the_torch_import_tvm_ffi_would_make(monkeypatch):
    # tvm_ffi imports torch when it is installed (seconds per worker); workers never need it
    with WorkerPool(1) as p:
        (out,) = p.imap_unordered([Task(0, torch_module, (0,))])
    assert out.value == "None"
    monkeypatch.setenv("FASTDLIGHT_WORKER_TORCH", "1")
    with WorkerPool(1) as p:
        (out,) = p.imap_unordered([Task(0, torch_module, (0,))])
    assert out.ok and out.value != "None"


def test_reset_restarts_every_worker(pool):
    (before,) = pool.imap_unordered([Task(0, pid, (0,))])
    pool.reset()
    (after,) = pool.imap_unordered([Task(0, pid, (0,))])
    assert before.ok and after.ok and before.value != after.value


def test_post_runs_on_each_outcome_and_its_errors_are_recorded(pool):
    def post(out):
        if out.key == 2:
            raise RuntimeError("post failed")
        return Outcome(out.key, out.ok, out.value + 1, seconds=out.seconds)

    outs = {o.key: o for o in pool.imap_unordered([Task(i, square, (i,)) for i in range(4)], post=post)}
    assert {k: o.value for k, o in outs.items() if k != 2} == {0: 1, 1: 2, 3: 10}
    assert not outs[2].ok and "post failed" in outs[2].error


def test_stopping_early_with_post_returns(pool):
    gen = pool.imap_unordered([Task(i, square, (i,)) for i in range(6)], post=lambda o: o)
    assert next(gen).ok
    closer = threading.Thread(target=gen.close)
    closer.start()
    closer.join(60)
    assert not closer.is_alive()


def test_calls_made_at_once_share_the_workers():
    """Two functions' builds at once: every task runs as soon as any worker is free, so three
    tasks from two calls on three workers run side by side, in three processes."""
    with WorkerPool(3) as pool:
        pool.warm_up()
        pids = []

        def call(n):
            pids.extend(o.value for o in pool.imap_unordered([Task(i, slow_pid, (1.0,)) for i in range(n)]))

        calls = [threading.Thread(target=call, args=(n,)) for n in (1, 2)]
        for th in calls:
            th.start()
        for th in calls:
            th.join(120)
        assert len(pids) == 3 and len(set(pids)) == 3


def test_stopping_early_waits_for_the_call_s_running_tasks(tmp_path):
    path = tmp_path / "notes"
    with WorkerPool(2) as pool:
        gen = pool.imap_unordered([Task(i, slow_note, (str(path),)) for i in range(6)])
        assert next(gen).ok
        gen.close()  # the running tasks have written their notes by now; the rest never run
        written = len(path.read_text().splitlines())
        time.sleep(1.5)
        assert 2 <= written < 6 and len(path.read_text().splitlines()) == written


def test_the_probe_keeps_the_inputs_of_functions_tuned_side_by_side(monkeypatch):
    """Probes of several functions interleave when a model is tuned; each function's random
    inputs are made once, and the cache stays within its entry and byte bounds."""
    monkeypatch.setattr(build_task, "PROBE_INPUTS", build_task.OrderedDict())
    monkeypatch.setattr(build_task, "PROBE_CACHE_ENTRIES", 3)
    monkeypatch.setattr(build_task, "PROBE_CACHE_BYTES", 100)
    made = []

    def maker(name, nbytes=10):
        return lambda: made.append(name) or SimpleNamespace(bytes=nbytes)

    for name in ["a", "b", "a", "b", "c", "a"]:
        build_task.probe_workload(name, 0, maker(name))
    assert made == ["a", "b", "c"]
    build_task.probe_workload("d", 0, maker("d"))  # a fourth: the least recently used (b) goes
    build_task.probe_workload("a", 0, maker("a"))
    build_task.probe_workload("b", 0, maker("b"))
    assert made == ["a", "b", "c", "d", "b"]
    build_task.probe_workload("big", 0, maker("big", 95))  # over the byte bound: all but it go
    assert list(k[0] for k in build_task.PROBE_INPUTS) == ["big"]


def test_the_probe_process_makes_a_functions_inputs_without_the_gpu_turn():
    """``Prober.prepare`` sends the inputs task ahead of the first probe, and it does not hold
    the GPU turn (timing another candidate may go on meanwhile); probes still take turns."""
    seen = []

    class Pool:
        def imap_unordered(self, tasks, timeout=None):
            seen.extend((t.fn, t.args, GPU_TURNS.turn(0).locked()) for t in tasks)
            return iter(())

    prober = stages.Prober.__new__(stages.Prober)
    prober.seed, prober.device, prober.pool, prober.lock = 7, 0, Pool(), threading.Lock()
    prober.prepare('{"func": 1}').join(timeout=10)
    assert seen == [(build_task.prepare_probe_inputs, ('{"func": 1}', 7), False)]


def test_a_refused_launch_keeps_the_probe_process_and_a_fault_replaces_it():
    errors = iter(["RuntimeError: CUDALaunch Error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                   "RuntimeError: CUDA Runtime Error: cudaErrorMisalignedAddress (716): misaligned address"])
    resets = []

    class Pool:
        def imap_unordered(self, tasks, timeout=None):
            return iter([SimpleNamespace(ok=False, error=next(errors), log="")])

        def reset(self):
            resets.append(True)

    prober = stages.Prober.__new__(stages.Prober)
    prober.seed, prober.device, prober.pool, prober.lock = 7, 0, Pool(), threading.Lock()
    refused = prober.run("a.so", "{}")
    assert refused is not None and "OUT_OF_RESOURCES" in refused.message and resets == []
    faulted = prober.run("b.so", "{}")
    assert faulted is not None and "misaligned" in faulted.message and resets == [True]


def test_a_timing_waits_for_its_workload_before_it_takes_the_gpu_turn(monkeypatch):
    """The workload's copies to the GPU take the GPU turn (a copy queued between another
    function's timing events would count in it), so a timing must not hold the turn while it
    waits for its workload: that wait would never end."""
    copied = threading.Event()

    def make():  # the workload maker's copies
        with GPU_TURNS.turn(0):
            copied.set()

    maker = threading.Thread(target=make, daemon=True)

    def get_workload():
        if not maker.is_alive() and not copied.is_set():
            maker.start()
        maker.join(timeout=5)
        return object()

    monkeypatch.setattr(stages.Timer, "_time", lambda self, module, budget_ms, graph_ms=None, give_up_ms=None: Timing.of([1.0]))
    timer = stages.Timer(CUDA("nvidia/nvidia-h100"), get_workload, TuneOptions())
    assert timer.time(module=None, budget_ms=1.0).median_ms == 1.0
    assert copied.is_set() and not GPU_TURNS.turn(0).locked()
