"""The process-wide pool of build workers.

Importing this module does not import TVM, so the CLI can start the workers first thing and
let them import TVM while its own process does the same (each import costs seconds).
"""

from __future__ import annotations

import atexit
import glob
import os
import threading

from fastdlight.compiler.nvrtc import remove_stale_pch_dirs
from fastdlight.compiler.workers import WorkerPool

#: build workers run at lower CPU priority than the process timing kernels: a sample's queue
#: of launches must not wait for the CPU while nvcc runs on every core
WORKER_NICENESS = 5

_POOLS: dict[int, WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


#: CPUs left to the tuning process (its policy, the timed launches' queue) and the probe
#: process, where there are more than ``4``. On the 16-CPU H100 machines the CLI's first tune of
#: a 4096³ GEMM took 9.4-10.3 s with 16 workers, 8.7-9.5 s with 14 and 9.1 s with 12 (in turns):
#: every worker imports TVM at once and makes its own NVRTC header, for one or two builds each
SPARE_CPUS = 2


def default_workers() -> int:
    """A build worker per CPU but ``SPARE_CPUS``, bounded (each holds a TVM import, ~0.5 GB)."""
    cpus = os.cpu_count() or 1
    return max(1, min(cpus - SPARE_CPUS if cpus > 4 else cpus, 32))


def init_build_worker() -> int:
    """Runs once in each worker process (pickled by reference: this module has no TVM import)."""
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # not permitted: only a nicety
        pass
    from fastdlight.compiler.build_task import init_worker

    return init_worker(cuda_only=True)


def shared_pool(max_workers: int | None = None) -> WorkerPool:
    """A process-wide pool, reused across calls so workers import TVM (and register the
    tensor-core intrinsics they are asked for) once per process lifetime rather than once per
    tuning run."""
    n = max_workers or default_workers()
    with _POOLS_LOCK:
        pool = _POOLS.get(n)
        if pool is None or pool.closed:
            pool = WorkerPool(n, initializer=init_build_worker)
            _POOLS[n] = pool
        return pool


def init_probe_worker(device: int = 0) -> int:
    from fastdlight.compiler.build_task import init_probe_worker as init

    return init(device)


#: the probe processes, by GPU index
_PROBES: dict[int, WorkerPool] = {}


def gpu_device_nodes() -> bool:
    """Whether this machine exposes an NVIDIA GPU (``/dev/nvidia0`` ...): a hint, before TVM is
    imported, that a tuning run will time kernels and so needs the probe process."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def probe_pool(device: int = 0) -> WorkerPool:
    """One process for GPU ``device`` that runs each candidate once before the tuning process
    times it there: a candidate that faults or hangs is lost there, not here (see
    :func:`build_task.probe_candidate`)."""
    with _POOLS_LOCK:
        pool = _PROBES.get(device)
        if pool is None or pool.closed:
            pool = _PROBES[device] = WorkerPool(1, initializer=init_probe_worker, initargs=(device,))
        return pool


@atexit.register
def _close_pools() -> None:
    for pool in [*_POOLS.values(), *_PROBES.values()]:
        pool.close(grace=0)  # idle build workers hold nothing worth a clean shutdown
    if _POOLS:
        remove_stale_pch_dirs()  # the killed workers' precompiled headers
