"""CUDA events through the driver API (``libcuda``, via ctypes), for timing without syncs.

TVM 0.27 exposes no event or timer calls to Python, and its ``time_evaluator`` synchronizes
the device before every timed launch, so a short kernel's measured time includes the host's
launch latency (several microseconds: a third of a 15 µs reduction). Recording events
ourselves lets :mod:`.measure` queue many launches between two events. ``libcuda.so.1`` is
part of every NVIDIA driver install, so this adds no dependency.

Events are recorded on the legacy default stream (handle 0), the stream TVM and torch launch
on unless told otherwise, so they are ordered with those launches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

_LIB: list = []
_LOCK = threading.Lock()


class CudaDriverError(RuntimeError):
    pass


def driver_library() -> ctypes.CDLL:
    with _LOCK:
        if not _LIB:
            name = ctypes.util.find_library("cuda") or "libcuda.so.1"
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError:
                try:
                    lib = ctypes.CDLL(name)
                except OSError as e:
                    raise CudaDriverError(f"the CUDA driver library (libcuda) cannot be loaded: {e}") from None
            check_status(lib, lib.cuInit(0), "cuInit")
            _LIB.append(lib)
        return _LIB[0]


def check_status(lib, status: int, what: str) -> None:
    if status == 0:
        return
    msg = ctypes.c_char_p()
    lib.cuGetErrorString(status, ctypes.byref(msg))
    text = msg.value.decode() if msg.value else f"error {status}"
    raise CudaDriverError(f"{what} failed: {text}")


def ensure_context(device_id: int = 0) -> None:
    """Make GPU ``device_id``'s primary context (the one TVM's and torch's runtime calls use)
    this thread's current one, unless it already is: a tuning thread times functions on
    whichever GPU each was given, and a stream or event made in another GPU's context fails."""
    lib = driver_library()
    ctx = ctypes.c_void_p()
    check_status(lib, lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    dev = ctypes.c_int()
    if ctx.value:
        check_status(lib, lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
        if dev.value == device_id:
            return
    check_status(lib, lib.cuDeviceGet(ctypes.byref(dev), device_id), "cuDeviceGet")
    primary = ctypes.c_void_p()
    check_status(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "cuDevicePrimaryCtxRetain")
    check_status(lib, lib.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


class Event:
    """One CUDA event with timing enabled."""

    def __init__(self):
        self._lib = driver_library()
        self.handle = ctypes.c_void_p()
        check_status(self._lib, self._lib.cuEventCreate(ctypes.byref(self.handle), 0), "cuEventCreate")

    def record(self, stream=None) -> None:
        """Record on ``stream`` (a CUstream handle; None: the legacy default stream)."""
        check_status(self._lib, self._lib.cuEventRecord(self.handle, stream), "cuEventRecord")

    def synchronize(self) -> None:
        check_status(self._lib, self._lib.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, end: Event) -> float:
        ms = ctypes.c_float()
        check_status(self._lib, self._lib.cuEventElapsedTime(ctypes.byref(ms), self.handle, end.handle),
               "cuEventElapsedTime")
        return float(ms.value)

    def __del__(self):
        try:
            if self.handle:
                self._lib.cuEventDestroy_v2(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
