"""The expected outputs a tuning run verifies candidates against, independent of every candidate.

* A float64 numpy reference (``ref``, the built-in operators) runs on the host inputs and on
  their absolute values (the magnitudes that bound a sum of products).
* Any other PrimFunc: the function itself, widened to float64 under a naive schedule (one thread
  per output element, serial reduction; :func:`fastdlight.measure.widen.naive_reference_module`),
  built in the worker pool like a candidate, run once in the probe process, then run here on the
  same inputs (exactly widened) and on their absolute values, on a thread of its own from the
  moment it is built (:meth:`ReferenceRun.start_early`).

The reference's schedule is no template's: fastdlight's tiled reference schedule for plain
contractions, else stock Dlight's Fallback rule, which a stock candidate gets only where none of
Dlight's Matmul, GEMV and reduction rules applies (an elementwise function) and then in its own
dtypes, not float64.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import tvm

from fastdlight.arch import CUDA
from fastdlight.measure.timing import function_name
from fastdlight.measure.workload import Workload, param_buffers, static_shape, to_device, to_host
from fastdlight.measure import clock, host
from fastdlight.measure.widen import OWN_DTYPES
from fastdlight.measure.gpu_turns import GPU_TURNS
from fastdlight.search.stages import Built, load_module
from fastdlight.measure.check_kinds import absolute_inputs, output_kinds, take_absolute
from fastdlight.measure.verify import NAIVE_REFERENCE, Expected, expected_from_numpy, expected_from_outputs
from fastdlight.compiler.workers import one_line

class ReferenceRun:
    """Collects the reference build (when there is one) and computes :class:`Expected`."""

    def __init__(self, func, ref: Callable | None):
        self.func, self.ref = func, ref
        self._built: Built | None = None
        self._result: tuple[Expected | None, str | None] | None = None
        self._thread: threading.Thread | None = None

    def built(self, built: Built) -> None:
        self._built = built

    def start_early(self, get_workload: Callable[[], Workload | None], arch: CUDA) -> None:
        """Run the naive module now, on a thread of its own, while candidates still build and
        are timed: only its copies and launches take the GPU turn, and the host work around
        them (the widening) overlaps the rest of the run. A numpy reference waits for
        :meth:`expected`, after the timings: BLAS on every core would take the CPU from the
        thread queueing the timed launches."""
        if self.ref is not None or self._thread is not None:
            return

        def run():
            with clock.stage("reference"):
                wl = get_workload()
                self._result = self._compute(wl, arch) if wl is not None else None

        self._thread = threading.Thread(target=run, daemon=True, name="fastdlight-reference")
        self._thread.start()

    def expected(self, wl: Workload, arch: CUDA) -> tuple[Expected | None, str | None]:
        """(expected outputs, None), or (None, why the reference is unavailable)."""
        if self._thread is not None:
            with clock.stage("reference wait"):
                self._thread.join()
        if self._result is None:
            with clock.stage("reference"):
                self._result = self._compute(wl, arch)
        return self._result

    def _compute(self, wl: Workload, arch: CUDA) -> tuple[Expected | None, str | None]:
        try:
            if self.ref is not None:
                return expected_from_numpy(self.ref, wl.host_inputs, wl.func), None
            return self._from_naive_module(wl, arch), None
        except Exception as e:  # noqa: BLE001 - the run says no candidate could be verified
            return None, f"reference failed: {one_line(e)}"

    def _from_naive_module(self, wl: Workload, arch: CUDA) -> Expected:
        built = self._built
        if built is None:
            raise RuntimeError("the naive reference was not built")
        if built.failure is not None:
            raise RuntimeError(f"the naive reference did not build or run ({built.failure.message})")
        mod = load_module(built.artifact, arch)
        own = mod[OWN_DTYPES] if mod.implements_function(OWN_DTYPES) else None
        return naive_expected(mod[function_name(mod, wl.func)], wl, own)


def naive_expected(fn, wl: Workload, own_fn=None) -> Expected:
    """Expected outputs of ``wl.func`` from its naive float64 twin ``fn``: run on the inputs
    and, only where some output is a sum of products (whose bound needs their magnitudes), on
    their absolute values (a second run, its copies and its widening: 1 GB each way for a
    4096x32000 softmax, which needs none); ``own_fn``: the function in its own dtypes."""
    outputs = run_widened(fn, wl, absolute=False)
    needs_magnitudes = any(kind.sum_of_products for kind in output_kinds(wl.func))
    abs_outputs = run_widened(fn, wl, absolute=True) if needs_magnitudes else None
    own = run_own_dtypes(own_fn, wl) if own_fn is not None else None
    return expected_from_outputs(outputs, abs_outputs, wl.func, NAIVE_REFERENCE, own)


def run_own_dtypes(fn, wl: Workload) -> list[np.ndarray]:
    """Run the function in its own dtypes under the reference's naive schedule, on fresh
    copies of ``wl``'s inputs (the GPU turn held, as in :func:`run_widened`)."""
    host_inputs = iter(wl.host_inputs)
    return _run(fn, wl, [(static_shape(buf), str(buf.dtype), None if i in wl.out_idx else next(host_inputs))
                         for i, buf in enumerate(param_buffers(wl.func))])


def run_widened(fn, wl: Workload, absolute: bool) -> list[np.ndarray]:
    """Run the float64 twin of ``wl.func`` on ``wl``'s inputs (or their absolute values), exactly
    widened: every fp16/bf16/fp32 input value is representable in float64. The widening is host
    work; the copies and the launch hold the GPU turn, since a copy queued between a timing's
    two events would count in that timing (an 8192x8192 float64 input is 512 MB)."""
    host_inputs = iter(zip(wl.host_inputs, absolute_inputs(wl.func, len(wl.host_inputs))))
    params = []  # (shape, dtype, widened host array or None for an output)
    for i, buf in enumerate(param_buffers(wl.func)):
        shape, dtype = static_shape(buf), _widened_dtype(str(buf.dtype))
        arr = None
        if i not in wl.out_idx:
            arr, part = next(host_inputs)
            arr = np.asarray(arr)
            if dtype == "float64":
                arr = host.as_float64(arr, absolute and part is True)
                if absolute and part not in (True, False):
                    arr = take_absolute(arr, part)
        params.append((shape, dtype, arr))
    return _run(fn, wl, params)


def _run(fn, wl: Workload, params) -> list[np.ndarray]:
    """``fn`` on fresh device copies of ``params`` (``(shape, dtype, host array or None for an
    output)``), the GPU turn held; the outputs on the host."""
    with clock.holding(GPU_TURNS.turn(wl.dev.index), "reference: GPU"):
        args = [tvm.runtime.empty(shape, dtype, wl.dev) if arr is None else to_device(arr, dtype, wl.dev)
                for shape, dtype, arr in params]
        fn(*args)
        wl.dev.sync()
        return [to_host(args[i]) for i in wl.out_idx]


def _widened_dtype(dtype: str) -> str:
    return "float64" if dtype.startswith(("float", "bfloat")) else dtype

