"""A CUDA graph held through the driver API (ctypes; the tuner never imports torch): whatever
``fn()`` launches on a stream, captured once and instantiated, then replayed on a stream, or
added whole to a graph another caller is capturing.

The tuner's timing graphs (:class:`~fastdlight.measure.graph_timing.LaunchGraph`) are held so,
and so is a torch backend program's own graph. Inside a graph the caller captures, running that
program's kernels had TVM's memory pool allocate under capture, which CUDA refuses (BERT and
LLaMA failed so in ``torch.cuda.graph`` on the H200); the program's graph goes into the
caller's as one child-graph node instead (``cuGraphAddChildGraphNode`` on the capture's current
dependencies), with the static buffers a replay uses: nothing is allocated.
"""

from __future__ import annotations

import ctypes

from fastdlight.measure.cuda_events import check_status, driver_library

#: CU_STREAM_CAPTURE_MODE_RELAXED: other threads may use CUDA meanwhile, and TVM's pool may
#: allocate while a program's call is captured
_CAPTURE_RELAXED = 2
#: CU_STREAM_CAPTURE_STATUS_ACTIVE; CU_STREAM_SET_CAPTURE_DEPENDENCIES
_CAPTURE_ACTIVE, _SET_DEPENDENCIES = 1, 1


class DriverGraph:
    """``fn()``'s launches on ``stream`` (a CUstream handle), captured once and instantiated."""

    def __init__(self, fn, stream: int):
        self.lib = driver_library()
        self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
        lib, s = self.lib, ctypes.c_void_p(stream)
        check_status(lib, lib.cuStreamBeginCapture_v2(s, _CAPTURE_RELAXED), "cuStreamBeginCapture")
        try:
            fn()
        finally:
            status = lib.cuStreamEndCapture(s, ctypes.byref(self.graph))
        check_status(lib, status, "cuStreamEndCapture (did every launch go to the capturing stream?)")
        try:
            check_status(lib, lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), self.graph,
                                                              ctypes.c_ulonglong(0)), "cuGraphInstantiateWithFlags")
        except BaseException:
            self.close()
            raise

    def launch(self, stream: int) -> None:
        check_status(self.lib, self.lib.cuGraphLaunch(self.exec, ctypes.c_void_p(stream)), "cuGraphLaunch")

    def add_to_capture(self, stream: int) -> None:
        """Add the graph as one node of the graph ``stream`` is capturing, after the work
        captured so far; work captured later follows it."""
        lib, s = self.lib, ctypes.c_void_p(stream)
        status, capture_id, captured = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_void_p()
        deps, n_deps = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_size_t()
        check_status(lib, lib.cuStreamGetCaptureInfo_v2(s, ctypes.byref(status), ctypes.byref(capture_id),
                                                        ctypes.byref(captured), ctypes.byref(deps),
                                                        ctypes.byref(n_deps)), "cuStreamGetCaptureInfo")
        if status.value != _CAPTURE_ACTIVE:
            raise RuntimeError("the stream is not capturing a graph")
        node = ctypes.c_void_p()
        check_status(lib, lib.cuGraphAddChildGraphNode(ctypes.byref(node), captured, deps, n_deps, self.graph),
                     "cuGraphAddChildGraphNode")
        check_status(lib, lib.cuStreamUpdateCaptureDependencies(s, ctypes.byref(node), ctypes.c_size_t(1),
                                                                ctypes.c_uint(_SET_DEPENDENCIES)),
                     "cuStreamUpdateCaptureDependencies")

    def close(self) -> None:
        if self.exec:
            self.lib.cuGraphExecDestroy(self.exec)
        if self.graph:
            self.lib.cuGraphDestroy(self.graph)
        self.exec = self.graph = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
