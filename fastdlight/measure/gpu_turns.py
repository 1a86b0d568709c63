"""Whose turn it is on each GPU of this machine, and which GPU a function is tuned on.

A tuning run puts nothing on a GPU in the middle of another candidate's timing: the copies of a
function's inputs, a probe, a timing, the reference's launch and the checks each hold that GPU's
turn (:meth:`GpuTurns.turn`). Runs on several GPUs (``TuneOptions.devices``) give each function
one GPU for all of its candidates (:meth:`GpuTurns.function_device`), the one with the fewest
functions under way: its candidates are compared on one GPU, so two GPUs that differ slightly
never decide between them, and builds, shared by every function, keep all GPUs fed.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence


class GpuTurns:
    """A lock per GPU index and the count of functions each GPU is timing."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[int, threading.Lock] = {}
        self._functions: dict[int, int] = {}
        #: functions given to each GPU so far
        self.given: dict[int, int] = {}

    def turn(self, index: int) -> threading.Lock:
        """GPU ``index``'s turn. Never wait while holding it for a thread that may take it."""
        with self._guard:
            return self._locks.setdefault(index, threading.Lock())

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


#: this process's GPUs
GPU_TURNS = GpuTurns()
