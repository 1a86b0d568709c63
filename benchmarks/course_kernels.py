"""The kernels of ``bench_course.py``: one side's kernel of one workload (:class:`Kernel`), how
each is built and put through nvcc, fastdlight's tuned one, and the GPU check and timing of a
workload's kernels against torch (:class:`Bench`)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm

from course_schedules import TOL


# -- building ----------------------------------------------------------------------------------
@dataclass
class Kernel:
    workload: str
    side: str  # hand | fastdlight | dlight | metaschedule | torch
    variant: str
    mod: object = None  # IRModule to build (not for torch)
    built: object = None  # runtime Executable
    launch: Callable | None = None
    error: str | None = None
    notes: str = ""
    tune_s: float | None = None
    cubin: dict | None = None
    result: dict = field(default_factory=dict)


def build_kernel(k: Kernel, target, log) -> None:
    from fastdlight.compiler.compile import build

    if k.mod is None or k.error:
        return
    try:
        t0 = time.perf_counter()
        k.built = build(k.mod, target)
        k.result["build_s"] = round(time.perf_counter() - t0, 2)
    except Exception as e:  # noqa: BLE001 - report and go on
        k.error = f"build: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
        log(f"  {k.workload} {k.side} {k.variant}: {k.error}")


def cubin_report(kernels: list[Kernel], target, log, fatal: bool = True) -> None:
    """nvcc on every built kernel's CUDA source (threads: nvcc is a subprocess): registers,
    shared memory, spills; on a CPU-only machine this is the "it compiles" check (``fatal``: a
    failure marks the kernel failed; on a GPU it is only noted, the kernel runs anyway)."""
    from fastdlight.compiler.compile import compile_cubin, cuda_source

    def one(k: Kernel):
        try:
            cub = compile_cubin(cuda_source(k.built), target)
            return {"registers": cub.registers, "shared_bytes": cub.shared_bytes, "spill_bytes": cub.spill_bytes}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {str(e).strip()[-300:]}"}

    todo = [k for k in kernels if k.built is not None]
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 2))) as pool:
        for k, rep in zip(todo, pool.map(one, todo)):
            k.cubin = rep
            if "error" in rep:
                if fatal:
                    k.error = f"nvcc: {rep['error']}"
                log(f"  {k.workload} {k.side} {k.variant}: nvcc: {rep['error']}")


def fastdlight_kernel(workload: str, func, target_or_arch, topk: int, log) -> Kernel:
    import warnings

    import fastdlight
    from fastdlight.measure.timing import function_name

    k = Kernel(workload, "fastdlight", f"fastdlight.tune(topk={topk})")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results, best = fastdlight.tune(func, target_or_arch, topk=topk, progress=False)
        k.tune_s = round(time.perf_counter() - t0, 1)
        k.notes = f"{best.config!r}"
        k.result.update(tuner_ms=best.latency_ms, tuner_verified=best.verified, candidates=len(results),
                        compiled=sum(r.compiled for r in results),
                        timed=sum(r.latency_ms is not None for r in results))
        if best.registers is not None:  # the winner's ptxas numbers (the tuner compiled it with nvcc)
            k.cubin = {"registers": best.registers, "shared_bytes": best.shared_bytes, "spill_bytes": best.spill_bytes}
        if best.module is not None:
            k.built = best.module
            k.launch = best.module[function_name(best.module, best._func)]
        else:  # compile-only: the policy's first choice, nothing timed
            k.notes += f"; compile-only: {k.result['compiled']}/{len(results)} candidates compiled"
    except Exception as e:  # noqa: BLE001
        k.tune_s = round(time.perf_counter() - t0, 1)
        k.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
    log(f"  fastdlight {workload}: {k.tune_s} s, {k.notes or k.error}")
    return k


# -- timing on the GPU -------------------------------------------------------------------------
class Bench:
    """Inputs, references and the timing of one workload (GPU + torch)."""

    def __init__(self, workload: str, n: int, arch, budget_ms: float):
        import torch

        from fastdlight.measure.timing import rotation_copies

        self.workload, self.n, self.budget_ms = workload, n, budget_ms
        self.dev = tvm.cuda(0)
        rng = np.random.default_rng(0)
        if workload == "gemm":
            host = [(rng.random((n, n), dtype=np.float32) * 2 - 1) for _ in range(2)]
            self.ref = host[0].astype(np.float64) @ host[1].astype(np.float64)
            out_shape = (n, n)
            self.work, self.unit = 2.0 * n**3, "TFLOPS"
        else:
            host = [rng.random(n + 2, dtype=np.float32) * 2 - 1]
            a = host[0].astype(np.float64)
            self.ref = a[:-2] + a[1:-1] + a[2:]
            out_shape = (n,)
            self.work, self.unit = (2 * n + 2) * 4.0, "GB/s"
        in_bytes = sum(h.nbytes for h in host)
        copies = rotation_copies(in_bytes, arch.l2_bytes)
        self.torch_sets = [[torch.from_numpy(h).cuda() for h in host] for _ in range(copies)]
        self.out = torch.empty(out_shape, dtype=torch.float32, device="cuda")
        self.tvm_out = tvm.runtime.from_dlpack(self.out)
        self.arg_sets = [[tvm.runtime.from_dlpack(t) for t in s] + [self.tvm_out] for s in self.torch_sets]
        self.torch_out = torch.empty(out_shape, dtype=torch.float32, device="cuda")
        if workload == "gemm":
            self.torch_fns = [lambda a=s[0], b=s[1]: torch.matmul(a, b, out=self.torch_out) for s in self.torch_sets]
        else:
            self.torch_fns = [lambda a=s[0]: a[:-2] + a[1:-1] + a[2:] for s in self.torch_sets]
        self.method = "queued launches"

    def perf(self, ms: float) -> float:
        return self.work / (ms * 1e-3) / (1e12 if self.unit == "TFLOPS" else 1e9)

    def _error(self, out: np.ndarray) -> float:
        out = out.astype(np.float64)
        if not np.all(np.isfinite(out)):
            return float("inf")
        return float(np.linalg.norm(out - self.ref) / np.linalg.norm(self.ref))

    def check(self, k: Kernel) -> None:
        if k.side == "torch":
            out = self.torch_fns[0]()
            out = (self.torch_out if out is None else out).cpu().numpy()
        else:
            self.out.fill_(float("nan"))
            k.launch(*self.arg_sets[0])
            self.dev.sync()
            out = self.out.cpu().numpy()
        err = self._error(out)
        k.result["rel_err"] = err
        k.result["verified"] = bool(err <= TOL[self.workload])

    def time(self, k: Kernel, graphs: bool) -> float:
        from fastdlight.measure.graph_timing import time_graph, time_torch_graph
        from fastdlight.measure.timing import time_launches, time_torch

        if not graphs:
            if k.side == "torch":
                return time_torch(self.torch_fns, self.budget_ms).median_ms
            return time_launches(k.launch, self.arg_sets, self.dev, self.budget_ms).median_ms
        estimate = k.result.get("queued_ms") or 0.05
        if k.side == "torch":
            return time_torch_graph(self.torch_fns, self.budget_ms, estimate).median_ms
        return time_graph(k.launch, self.arg_sets, self.dev, self.budget_ms, estimate).median_ms

    def measure(self, k: Kernel, log, graphs: bool | None = None) -> None:
        """Check, then time (queued; in graphs too when ``graphs`` or this workload's method)."""
        try:
            if k.side != "torch" and k.launch is None and k.built is not None and not k.error:
                k.launch = k.built["main"]
        except Exception as e:  # noqa: BLE001
            k.error = f"load: {type(e).__name__}: {e}"[:400]
        if k.error or (k.side != "torch" and k.launch is None):
            return
        if graphs is None:
            graphs = self.method == "CUDA graphs"
        try:
            self.check(k)
            k.result["queued_ms"] = self.time(k, False)
            k.result["ms"], k.result["method"] = k.result["queued_ms"], "queued launches"
            if graphs:
                self.retime_in_graph(k)
        except Exception as e:  # noqa: BLE001
            k.error = f"run: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
        log(f"  {k.workload:6s} {k.side:12s} {k.variant[:60]:60s} "
            + (f"{k.result['ms']:.4f} ms  err {k.result['rel_err']:.1e}" if "ms" in k.result else f"FAILED {k.error}"))

    def retime_in_graph(self, k: Kernel) -> None:
        try:
            k.result["ms"], k.result["method"] = self.time(k, True), "CUDA graphs"
        except Exception as e:  # noqa: BLE001 - keep the queued number, say why
            k.result["graph_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
