"""Whose turn it is on each GPU of this machine, and which GPU a function is tuned on.

A tuning run puts nothing on a GPU in the middle of another candidate's timing: the copies of a
function's inputs, a probe, a timing, the reference's launch and the checks each hold that GPU's
turn (:meth:`GpuTurns.turn`). Runs on several GPUs (``TuneOptions.devices``) give each function a
home GPU (:meth:`GpuTurns.function_device`: the one with the fewest functions under way) for its
inputs and probes; its first-pass timings go to whichever GPU is free first and its finalists'
hot turns all to one GPU, the first free when they start (:meth:`GpuTurns.first_free`): the winner
is picked among timings of one GPU, so two GPUs that differ slightly never decide it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator, Sequence

import tvm

from fastdlight.measure import clock


class Turn:
    """One GPU's turn: a lock that also counts the seconds it was held (how busy the tuning
    kept the GPU: ``held_s`` over a run's wall time)."""

    def __init__(self, on_release=None):
        self._lock = threading.Lock()
        self._since = 0.0
        self._on_release = on_release
        self.held_s = 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._since = time.perf_counter()
        return got

    def release(self) -> None:
        self.held_s += time.perf_counter() - self._since
        self._lock.release()
        if self._on_release is not None:
            self._on_release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> Turn:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class GpuTurns:
    """A :class:`Turn` per GPU index and the count of functions each GPU is timing."""

    def __init__(self):
        self._guard = threading.Lock()
        self._freed = threading.Condition(threading.Lock())
        self._turns: dict[int, Turn] = {}
        self._functions: dict[int, int] = {}
        #: functions given to each GPU so far
        self.given: dict[int, int] = {}

    def turn(self, index: int) -> Turn:
        """GPU ``index``'s turn. Never wait while holding it for a thread that may take it."""
        with self._guard:
            if index not in self._turns:
                self._turns[index] = Turn(self._notify)
            return self._turns[index]

    def _notify(self) -> None:
        with self._freed:
            self._freed.notify_all()

    @contextlib.contextmanager
    def first_free(self, devices: Sequence[int], name: str) -> Iterator[int]:
        """The turn of whichever of ``devices`` is free first (the earliest listed among free
        ones), held for the block; the wait booked as "gpu wait", the turn as ``name``."""
        turns = {i: self.turn(i) for i in devices}
        t0 = time.perf_counter()
        with self._freed:  # a turn released between the tries and the wait notifies after it
            index = next((i for i, t in turns.items() if t.acquire(blocking=False)), None)
            while index is None:
                self._freed.wait()
                index = next((i for i, t in turns.items() if t.acquire(blocking=False)), None)
        t1 = time.perf_counter()
        clock.add("gpu wait", t1 - t0)
        try:
            yield index
        finally:
            clock.add(name, time.perf_counter() - t1)
            turns[index].release()

    def held_s(self) -> dict[int, float]:
        """Seconds each GPU's turn has been held so far."""
        with self._guard:
            return {i: t.held_s for i, t in self._turns.items()}

    def busy(self, index: int) -> int:
        """Functions GPU ``index`` is timing now."""
        with self._guard:
            return self._functions.get(index, 0)

    @contextlib.contextmanager
    def function_device(self, devices: Sequence[int]) -> Iterator[int]:
        """One of ``devices`` for a function's whole tuning: the one timing the fewest functions
        (the earliest listed among equals), counted as busy with it until the block ends."""
        if not devices:
            raise ValueError("no GPU to tune on")
        with self._guard:
            index = min(devices, key=lambda i: self._functions.get(i, 0))
            self._functions[index] = self._functions.get(index, 0) + 1
            self.given[index] = self.given.get(index, 0) + 1
        try:
            yield index
        finally:
            with self._guard:
                self._functions[index] -= 1


def check_devices(devices: Sequence[int]) -> None:
    """ValueError (one line) if a GPU index of ``devices`` is not on this machine."""
    count = next((i for i in range(max(devices) + 1) if not tvm.cuda(i).exist), max(devices) + 1)
    missing = [i for i in devices if i >= count]
    if missing:
        raise ValueError(f"devices {','.join(map(str, devices))}: GPU {','.join(map(str, missing))} is not on this "
                         f"machine ({count} GPU{'s' if count != 1 else ''} visible)")


#: this process's GPUs
GPU_TURNS = GpuTurns()
