"""Timing short kernels inside CUDA graphs, the same way for fastdlight's kernels and torch's.

For a kernel of a few microseconds the host's launch cost decides the measurement: torch's
eager launch path costs more CPU per call than a TVM packed call, so queued launches compare
the launchers, not the kernels. Inside a CUDA graph both sides replay pre-recorded launches.

:class:`LaunchGraph` captures ``n`` back-to-back launches (cycling through the rotated input
copies, so inputs stay out of L2, as in :func:`measure.time_launches`) into one graph through
the CUDA driver API (:class:`~fastdlight.measure.driver_graph.DriverGraph`), with TVM's launches sent to the
capturing stream via ``tvm_ffi.use_raw_stream``. :func:`time_torch_graph` does the same with
``torch.cuda.CUDAGraph``. Both replay the graph between CUDA events and report the median of
replay time / n over at least ``budget_ms``. A tuning run keeps a finalist's graph for all of
its hot turns: capturing costs the host as long as the replays it then times.
"""

from __future__ import annotations

import contextlib
import ctypes
import math

from fastdlight.measure.cuda_events import Event, check_status, driver_library, ensure_context
from fastdlight.measure.driver_graph import DriverGraph
from fastdlight.measure.timing import Timing

#: kernels faster than this (median of queued launches) are re-timed inside graphs
GRAPH_BELOW_MS = 0.05
#: a graph holds launches for at least this long (one replay's host cost, ~10 us, is then 1%)...
MIN_GRAPH_MS = 1.0
#: ...and at most this many launches (recording one costs the host a few microseconds)
MAX_GRAPH_LAUNCHES = 1000
#: CU_STREAM_NON_BLOCKING
_NON_BLOCKING = 1


def launches_per_graph(per_launch_ms: float, n_arg_sets: int, min_ms: float = MIN_GRAPH_MS) -> int:
    """Enough launches to last ``min_ms``, a whole number of rotations, at most the cap."""
    n = max(1, math.ceil(min_ms / max(per_launch_ms, 1e-4)))
    n = math.ceil(n / n_arg_sets) * n_arg_sets
    return max(1, min(n, MAX_GRAPH_LAUNCHES))


#: replays a timing takes at least: each already averages a millisecond of launches
MIN_REPLAYS = 5


#: replays queued on the GPU before the host waits for them: while the host is slow to come back
#: (a tuning process's other threads hold the interpreter; a thread that waited on the GPU gets
#: it back only at the interpreter's next switch, up to 5 ms later) the GPU still has replays to
#: run, where one wait a replay left it idle with its turn held. Two H200s tuning ResNet-18 held
#: their turns 1.6 times as long as one GPU for the same work (2026-11-29, one wait a replay)
QUEUED_REPLAY_MS = 8.0


def replay_count(budget_ms: float, per_replay_ms: float) -> int:
    """Replays a timing of ``budget_ms`` takes (:data:`MIN_REPLAYS` to 1000)."""
    return min(max(MIN_REPLAYS, int(budget_ms / max(per_replay_ms, 1e-3))), 1000)


def replay_batches(n: int, per_replay_ms: float) -> list[int]:
    """``n`` replays as batches queued together (each about :data:`QUEUED_REPLAY_MS` long)."""
    size = max(1, min(n, int(QUEUED_REPLAY_MS / max(per_replay_ms, 1e-3))))
    return [size] * (n // size) + ([n % size] if n % size else [])


def _replays(run_once, budget_ms: float, per_replay_ms: float) -> list[float]:
    return [run_once() for _ in range(replay_count(budget_ms, per_replay_ms))]


class LaunchGraph:
    """``n`` back-to-back launches of one kernel (``arg_sets`` rotated), captured once into a
    driver-API graph on a stream of its own; :meth:`time` replays it as often as asked.
    ``per_launch_ms``: a rough estimate (from queued timing) that sizes the graph to last
    ``min_ms``."""

    def __init__(self, launch, arg_sets, dev, per_launch_ms: float, min_ms: float = MIN_GRAPH_MS):
        self.lib = driver_library()
        ensure_context(dev.index)
        arg_sets = [list(a) for a in arg_sets]
        self.n = launches_per_graph(per_launch_ms, len(arg_sets), min_ms)
        self.per_launch_ms = per_launch_ms
        self.dev, self.stream = dev, ctypes.c_void_p()
        check_status(self.lib, self.lib.cuStreamCreate(ctypes.byref(self.stream), _NON_BLOCKING), "cuStreamCreate")
        self.graph: DriverGraph | None = None
        try:
            self._capture(launch, arg_sets)
            self._replay_ms()  # warm-up replay
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> LaunchGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _on_stream(self):
        import tvm_ffi

        with tvm_ffi.use_raw_stream(self.dev, self.stream.value):
            yield

    def _capture(self, launch, arg_sets) -> None:
        with self._on_stream():
            launch(*arg_sets[0])  # outside the capture: module load, first-launch setup
            check_status(self.lib, self.lib.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

            def launches():
                for i in range(self.n):
                    launch(*arg_sets[i % len(arg_sets)])

            self.graph = DriverGraph(launches, self.stream.value)

    def _replay_ms(self) -> float:
        start, end = Event(), Event()
        start.record(self.stream)
        self.graph.launch(self.stream.value)
        end.record(self.stream)
        end.synchronize()
        return start.elapsed_ms(end)

    def time(self, budget_ms: float) -> Timing:
        """Median ms per launch over at least ``budget_ms`` of replays (:data:`MIN_REPLAYS` at
        least), each between two events of its own, queued in batches (:func:`replay_batches`)."""
        per_replay_ms = self.n * self.per_launch_ms
        samples = []
        for size in replay_batches(replay_count(budget_ms, per_replay_ms), per_replay_ms):
            events = [(Event(), Event()) for _ in range(size)]
            for start, end in events:
                start.record(self.stream)
                self.graph.launch(self.stream.value)
                end.record(self.stream)
            events[-1][1].synchronize()
            samples += [start.elapsed_ms(end) for start, end in events]
        return Timing.of((s / self.n for s in samples), graph=True)

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
        if self.stream:
            self.lib.cuStreamDestroy_v2(self.stream)
        self.graph, self.stream = None, ctypes.c_void_p()


def time_graph(launch, arg_sets, dev, budget_ms: float = 100.0, per_launch_ms: float = 0.01) -> Timing:
    """Median ms per ``launch(*args)`` replayed from a CUDA graph (:class:`LaunchGraph`)."""
    with LaunchGraph(launch, arg_sets, dev, per_launch_ms) as graph:
        return graph.time(budget_ms)


def time_torch_graph(fns, budget_ms: float = 100.0, per_launch_ms: float = 0.01) -> Timing:
    """:func:`time_graph` for torch callables (one per input copy), via ``torch.cuda.CUDAGraph``."""
    import torch

    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    n = launches_per_graph(per_launch_ms, len(fns))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch's graph docs ask
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            fns[i % len(fns)]()

    def replay_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    replay_ms()
    samples = _replays(replay_ms, budget_ms, n * per_launch_ms)
    return Timing.of((s / n for s in samples), graph=True)
