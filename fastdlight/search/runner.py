"""Build every candidate config in parallel, time them on the GPU, verify, and pick the best.

    cpresults, best = apply_and_build(func, configs, arch)

A run reads as its phases, each a function returning a value (:mod:`.candidate` has the types):

    plan     configs -> BuildRequests (longest compile first; the reference build too)
    build    BuildRequest -> BuildArtifact | Failure        (worker processes, :mod:`.build_task`)
    probe    BuildArtifact -> Failure | None                (a separate process, real inputs)
    measure  BuildArtifact -> Timing | Failure              (this process, as builds finish)
    retime   the fastest few -> a second, independent Timing
    verify   the fastest first -> Verdict, until one passes (:mod:`.verify`)
    pick     -> (ranked results, best)

A candidate that fails anywhere (schedule, lowering, nvcc, crash, timeout, probe, launch, wrong
result) is kept with its reason; only when no candidate is usable does :class:`TuningError` say
why, reason by reason. Without a GPU (or ``measure=False``) every candidate is still compiled to
a cubin (that is what "it compiles" means) and ranked by the policy's predicted cost.
"""

from __future__ import annotations

import math
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import tvm

from fastdlight.arch import CUDA, auto_arch, has_gpu
from fastdlight.arch.stacklevel import caller_stacklevel
from fastdlight.analysis.prepare import as_prim_func, check_index_range
from fastdlight.config import Config
from fastdlight.compiler import build_task
from fastdlight.measure import clock
from fastdlight.compiler.artifacts import BuildRequest
from fastdlight.search import remote
from fastdlight.search.results import CompileResult, Failure
from fastdlight.measure.timing import function_name
from fastdlight.measure.workload import Workload, params_bytes
from fastdlight.search.options import RpcSpec, TuneOptions
from fastdlight.search.report import failure_summary, format_table
from fastdlight.measure.gpu_turns import GPU_TURNS, check_devices
from fastdlight.search.stages import Built, Prober, Timer, build_stream
from fastdlight.search.reference import ReferenceRun
from fastdlight.measure.verify import Expected, Verdict, check_outputs
from fastdlight.compiler.workers import one_line

NO_GPU_WARNING = ("fastdlight: no GPU was found: nothing was timed; candidates were compiled to cubin "
                  "and are ranked by the policy's predicted cost")
#: the reference build's key (candidates are keyed by their config's index)
REF_KEY = "ref"


class TuningError(RuntimeError):
    """No candidate could be used; the message lists why, reason by reason."""


@dataclass(frozen=True)
class BuildPlan:
    """What one run will build: the function (with a global symbol), its configs, the target,
    whether kernels are timed, and the build requests in the order they are submitted."""

    func: tvm.tirx.PrimFunc
    func_json: str
    configs: tuple[Config, ...]
    arch: CUDA
    measure: bool
    requests: tuple[BuildRequest, ...]

    @property
    def verifies_with_naive_reference(self) -> bool:
        return any(r.key == REF_KEY for r in self.requests)


def compile_cost_estimate(config: Config) -> int:
    """Relative nvcc time of a candidate: the unrolled body grows with the per-thread (or
    per-warp) tile, the reduction step and the pipeline depth. Measured on H200: 4096 → ~10 s,
    2048 → ~4 s, 1024 → ~1 s for fp32 matmul tiles."""
    if not isinstance(config, Config):
        return 1  # stock Dlight or a MetaSchedule record: no tile of ours to unroll
    tile = math.prod(config.warp if config.kind == "matmul_tc" else config.thread or (1,))
    return tile * math.prod(config.rstep or (1,)) * max(1, config.pipeline_stages)


def _wants_measure(opts: TuneOptions) -> bool:
    if opts.measure is False:
        return False
    if opts.rpc:  # the GPU is a server's: build its libraries (and the reference's) here, if we can
        if not build_task.runtime_has_cuda():
            warnings.warn("fastdlight: this TVM's runtime has no CUDA: the RPC server gets no libraries to time "
                          "(compile-only)", stacklevel=caller_stacklevel())
            return False
        return True
    gpu = has_gpu()
    if not gpu:
        warnings.warn(NO_GPU_WARNING, stacklevel=caller_stacklevel())
    return gpu


def plan(func, configs: Sequence[Config], arch, opts: TuneOptions, out_dir: str) -> BuildPlan:
    configs = tuple(configs)
    if not configs:
        raise TuningError("no candidate configs to build (the policy emitted none)")
    check_index_range(func)  # refused here, not deep inside TVM's lowering
    if func.attrs is None or "global_symbol" not in func.attrs:
        # a private PrimFunc (as in a Relax module) cannot be compiled on its own
        func = func.with_attr("global_symbol", "main")
    arch = arch if isinstance(arch, CUDA) else auto_arch(arch)
    measure = _wants_measure(opts)
    func_json, target = tvm.ir.save_json(func), str(arch.target)
    requests = [BuildRequest(i, func_json, target, cfg, out_dir, measure, opts.template, opts.hook)
                for i, cfg in enumerate(configs)]
    # longest first, so the slowest builds do not start last: those that tensorize (mma.sync,
    # stock Dlight at sm_90; their own estimate does not cover Dlight's), then by estimate
    requests.sort(key=lambda r: (not build_task.needs_tensor_intrinsics(r.config),
                                 -compile_cost_estimate(r.config)))
    # a numpy ``ref`` cannot travel to an RPC server: there the float64 twin verifies
    if measure and opts.check != "none" and (opts.ref is None or opts.rpc):
        requests.insert(0, BuildRequest(REF_KEY, func_json, target, None, out_dir, True))
    return BuildPlan(func, func_json, configs, arch, measure, tuple(requests))


# -- pick ------------------------------------------------------------------------------------
#: where the fastest was timed only in the first pass (no hot retime: a single candidate, no
#: finalists), candidates of its kind timed within this fraction of it are a tie, ordered by the
#: policy's estimate: one kernel's first-pass timings differ more than that between runs (2-5% on
#: the H100 machines), and a 128x128 wgmma tile that won a short cold timing by 0.5% ran 9-14%
#: slower in the GEMM benchmark's longer one (2026-11-26). Hot-retimed finalists go by their hot
#: times alone: there an estimate that counted L2 loads as binding preferred 2-CTA clusters,
#: which after 2 s alone ran 5-9% slower than the fastest hot finalist on LLaMA's o and down
#: projections (H100 80GB HBM3, 2026-11-26)
TIE_FRACTION = 0.02
#: where the fastest hot finalist is a 2-CTA cluster tile, the finalists without
#: clusters within this fraction of it go first. A cluster tile spends more energy a GEMM
#: (multicast loads, arrivals on the peer CTA's barriers), which costs time only once the GPU
#: sits at its power limit, about a second into a run: on an H100's 4096³ GEMM the cluster
#: tiles spent 1.1-6.9% more energy than the plain 128x256 one and ran 1.5-3.5% slower at the
#: limit (bench_energy, H100 80GB HBM3, 2026-11-27); on LLaMA's o and down projections cluster
#: tiles ran 5-9% slower than the fastest hot finalist after 2 s alone (2026-11-26). The
#: finalists' hot turns (100 ms of heat, 33 ms timed) end before the limit, and there cluster tiles timed up
#: to 4% ahead of plain ones: the GEMM benchmark's 4096³ cluster winners ran 0.98-0.99x of
#: cuBLAS in four runs (2.5% and 4% ahead hot in two of them), its plain winners 1.00-1.01x.
#: Where cluster tiles ran ahead at the limit (8192³, LLaMA's down projection at 4096 tokens)
#: it was by 0.5-1.3%, the most this gives up. NVML's energy counter moves every ~100 ms (one
#: read 4 ms), too coarse to measure a turn (H100 80GB HBM3, 2026-11-27). The plain finalists
#: in that window go first by the policy's estimate, not by their hot times, which cannot rank them there: on 8192³
#: NT a 192x192 tile timed 2% ahead of 128x192 hot (behind a cluster tile), then ran 4.5% behind
#: it at the limit and 6% behind at one clock (its 1849 tiles leave one for a fifteenth wave;
#: H100 80GB HBM3, 2026-11-27)
CLUSTER_TIE_FRACTION = 0.05
#: where the fastest hot finalist is a plain wgmma tile, the plain ones of its kind within this
#: fraction of it are a tie, ordered by the policy's estimate. The hot retime cannot rank tiles
#: that close: on an H100 (2026-11-27) the turns timed 0.9-1.05 s into it ran 10-20% slow
#: whatever the tile (the power cap settling), and a tile's other turns varied by up to 7%.
#: 128x256 and 256x128 on 4096³ NN swapped places in one of three tunes (256x128 1.6% ahead hot),
#: while at the power limit 128x256 ran 0.5-0.9% ahead in every run (NN and NT). Where the
#: estimate was checked against the power limit (4096³, 8192³, LLaMA's projections, H100,
#: 2026-11-27) it put the faster of such tiles first
HOT_TIE_FRACTION, HOT_TIE_KINDS = 0.02, ("matmul_wgmma",)


def pick_order(timed: Sequence[CompileResult]) -> list[CompileResult]:
    """``timed`` (by ``speed_key``) with the fastest one's ties (same kind and timing pass, an
    estimate, within ``TIE_FRACTION``) ordered by predicted cost where the fastest has only a
    first-pass timing; the rest as they were. Hot-retimed finalists keep their order, but for a
    cluster tile's tie with plain ones (``CLUSTER_TIE_FRACTION``: those go first, by estimate)
    and a plain wgmma tile's tie with others (``HOT_TIE_FRACTION``: by estimate)."""
    timed = list(timed)
    if timed and timed[0].timing.hot:
        return _hot_ties(timed)
    if len(timed) < 2 or timed[0].predicted_cost <= 0:
        return timed
    first = timed[0]
    return _estimate_order_first(timed, [r for r in timed if r.config.kind == first.config.kind and r.predicted_cost > 0
                                         and r.timing.hot == first.timing.hot
                                         and r.latency_ms <= first.latency_ms * (1 + TIE_FRACTION)])


def _hot_ties(timed: list[CompileResult]) -> list[CompileResult]:
    """Hot finalists with the plain tiles of the fastest one's tie first, in the policy's order."""
    first = timed[0]
    if _cluster(first.config) > 1:
        window = CLUSTER_TIE_FRACTION
    elif first.config.kind in HOT_TIE_KINDS:
        window = HOT_TIE_FRACTION
    else:
        return timed
    return _estimate_order_first(timed, [r for r in timed if r.timing.hot and r.config.kind == first.config.kind
                                         and _cluster(r.config) <= 1 and r.latency_ms <= first.latency_ms * (1 + window)])


def _cluster(config) -> int:
    """CTAs of a config's thread-block cluster (1 for schedules without tiles of ours)."""
    return config.cluster if isinstance(config, Config) else 1


def _estimate_order_first(timed: list[CompileResult], tied: list[CompileResult]) -> list[CompileResult]:
    """``tied`` first, by the policy's estimate (none last, then by time), then the rest of ``timed``."""
    tied = sorted(tied, key=lambda r: (r.predicted_cost if r.predicted_cost > 0 else math.inf, r.latency_ms))
    chosen = {r.index for r in tied}
    return tied + [r for r in timed if r.index not in chosen]


def _rank_key(r: CompileResult):
    if r.latency_ms is not None:
        return (1 if r.verified is False else 0, *r.speed_key, r.index)
    if r.compiled and r.error is None:
        return (2, r.predicted_cost, r.index)
    if r.compiled:
        return (3, r.predicted_cost, r.index)
    return (4, 0.0, r.index)


def rank(results: Sequence[CompileResult]) -> list[CompileResult]:
    """Timed candidates by ``speed_key`` (wrong ones after), then untimed compiled ones by
    predicted cost, then failures."""
    return sorted(results, key=_rank_key)


def verify_and_pick(results: Sequence[CompileResult], wl: Workload, expected: Expected | None, check: str,
                    error: str | None = None) -> tuple[list[CompileResult], CompileResult | None]:
    """Check the fastest candidates (in :func:`pick_order`) until one passes (``check="all"``:
    every timed one); return the results with their verdicts and the first verified one.
    ``check="none"``: the first, unverified."""
    by_index = {r.index: r for r in results}
    timed = pick_order(sorted((r for r in results if r.latency_ms is not None), key=lambda r: r.speed_key))
    if check == "none":
        return rank(results), (timed[0] if timed else None)
    if expected is None:
        raise TuningError(f"cannot verify any candidate: {error or 'no reference'} "
                          "(check='none' skips verification)")
    best = None
    for r in timed:
        if best is not None and check != "all":
            break
        checked = r.replace(verdict=verify_module(r.module, wl, expected))
        by_index[r.index] = checked
        if best is None and checked.verified:
            best = checked
    return rank(by_index.values()), best


def verify_module(module, wl: Workload, expected: Expected) -> Verdict:
    """Poison the outputs, run once on the workload's inputs, check every element."""
    try:
        # its copies and launch, never inside another function's timing
        with clock.holding(GPU_TURNS.turn(wl.dev.index), "verify: GPU"):
            outputs = wl.run_outputs(module[function_name(module, wl.func)])
    except Exception as e:  # noqa: BLE001 - a launch that fails now is as wrong as a wrong result
        return Verdict.failed(f"check run failed: {one_line(e)}", expected.reference)
    return check_outputs(outputs, expected, [str(wl.buffers[i].dtype) for i in wl.out_idx])


# -- the run ---------------------------------------------------------------------------------
def apply_and_build(func: tvm.tirx.PrimFunc, configs: Sequence[Config], arch: CUDA | str | None = None,
                    parallel_build: bool | None = None, options: TuneOptions | None = None,
                    **overrides) -> tuple[list[CompileResult], CompileResult]:
    """Build, time, verify ``configs`` for ``func`` (a PrimFunc, or an IRModule holding one) on
    ``arch``; return ``(ranked results, best)``.

    ``options`` (a :class:`TuneOptions`) says how; keyword arguments override its fields
    (``measure``, ``check``, ``budget_ms``, ``max_workers``, ``timeout``, ``ref``, ...); an
    unknown keyword is a TypeError. ``best`` is the fastest verified candidate (with
    ``check="none"``: the fastest; without a GPU: the top-ranked one that compiled). Raises
    :class:`TuningError` when no candidate is usable."""
    func = as_prim_func(func)
    if parallel_build is not None:  # given: it wins over options.parallel_build (default: True)
        overrides["parallel_build"] = parallel_build
    opts = TuneOptions.of(options, **overrides)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastdlight_build_") as out_dir:
        p = plan(func, configs, arch, opts, out_dir)
        if p.measure and opts.devices and opts.workload is None:
            check_devices(opts.devices)
        if opts.rpc and opts.measure is not False:
            return _remote_run(p, opts, t_start)
        if not p.measure:
            results = [_result(p, built) for built in build_stream(p.requests, opts, None)]
            ranked = rank(results)
            return _finish(ranked, ranked[0] if ranked[0].compiled else None, opts, t_start, "compiled")
        return _measured_run(p, opts, t_start)


def _result(p: BuildPlan, built: Built, opts: TuneOptions | None = None) -> CompileResult:
    template = opts.template if opts is not None else None
    return CompileResult(p.configs[built.key], built.key, built.artifact, built.failure,
                         build_seconds=built.seconds, _func=p.func, _template=template)


def _measured_run(p: BuildPlan, opts: TuneOptions, t_start: float):
    """Built, probed and timed on one GPU of ``opts.devices`` (the one timing the fewest
    functions; default GPU 0), or on the given workload's."""
    devices = (opts.workload.dev.index,) if opts.workload is not None else (opts.devices or (0,))
    with GPU_TURNS.function_device(devices) as device:
        prober = Prober(opts.seed, device) if opts.probe else None
        if prober is not None:
            prober.prepare(p.func_json)
        ranked, best, nbytes = measure_built(p, build_stream(p.requests, opts, prober), opts, device,
                                             spare_devices(p.func, devices, device))
    return _finish(ranked, best, opts, t_start, "verified" if opts.check != "none" else "measured", nbytes)


def spare_devices(func: tvm.tirx.PrimFunc, devices: Sequence[int], home: int) -> tuple[int, ...]:
    """The GPUs besides ``home`` that ``func``'s first-pass timings may go to: the others of
    ``devices``, unless its buffers take more than ``SPREAD_MAX_BYTES``."""
    others = tuple(d for d in devices if d != home)
    if not others:
        return ()
    return others if params_bytes(func) <= SPREAD_MAX_BYTES else ()


#: a function whose buffers take more than this is timed on its home GPU only: its inputs are not
#: copied to the others (each copy holds them again, with their rotation copies)
SPREAD_MAX_BYTES = 2 << 30


def measure_built(p: BuildPlan, builts, opts: TuneOptions, device: int = 0,
                  spare: Sequence[int] = ()) -> tuple[list[CompileResult], CompileResult | None, int]:
    """Time, retime and verify the candidates ``builts`` yields (as their builds finish; the
    reference's among them) on GPU ``device`` of this machine (``opts.workload``'s, when given)
    and the ``spare`` ones (first-pass timings on whichever is free first, the finalists and
    the checks all on one): ``(ranked, best, bytes of the buffers)``. A local run and the RPC
    server (``fastdlight.rpc_server``) both measure this way."""
    wl_maker = Workload.background(p.func, opts.workload, opts.seed, tvm.cuda(device), GPU_TURNS.turn(device))
    spares = {d: Workload.background(p.func, None, opts.seed, tvm.cuda(d), GPU_TURNS.turn(d), wl_maker.get).get
              for d in spare}
    timer = Timer(p.arch, wl_maker.get, opts, device, spares)
    reference = ReferenceRun(p.func, opts.ref) if opts.check != "none" else None
    results: dict[int, CompileResult] = {i: CompileResult(c, i, failure=Failure.of("build", "build: not built"))
                                         for i, c in enumerate(p.configs)}
    for built in builts:
        if built.key == REF_KEY:
            if reference is not None:
                reference.built(built)
                reference.start_early(wl_maker.get, p.arch)
            continue
        r = _result(p, built, opts)
        results[r.index] = timer.measure(r) if r.compiled and r.failure is None else r
    wl = wl_maker.get()
    if wl is None:
        raise TuningError(f"cannot set up the GPU inputs: {wl_maker.error}")
    timed = timer.retime_fastest([results[i] for i in range(len(p.configs))])
    wl = timer.workload() or wl  # the finalists' GPU: the winner is checked where it was timed
    expected, why = reference.expected(wl, p.arch) if reference is not None else (None, None)
    with clock.stage("verify"):
        ranked, best = verify_and_pick(timed, wl, expected, opts.check, why)
    return ranked, best, wl.bytes


def _remote_run(p: BuildPlan, opts: TuneOptions, t_start: float):
    """Build here, measure on the RPC server (:mod:`fastdlight.search.remote`). A server
    without a GPU measures nothing: the candidates are then ranked by the policy's estimate,
    as a run without a GPU ranks them, with a warning that says so."""
    builts = list(build_stream(p.requests, opts, None))
    ref = next((b for b in builts if b.key == REF_KEY and b.failure is None and b.artifact is not None), None)
    candidates = [b for b in builts if b.key != REF_KEY]
    results = {b.key: _result(p, b, opts) for b in candidates}
    options = {"screen_ms": opts.screen_ms, "budget_ms": opts.budget_ms, "check": opts.check, "seed": opts.seed,
               "timing": opts.timing}
    outcome = remote.measure_remotely(RpcSpec.parse(opts.rpc), p.func_json, p.configs, candidates,
                                      ref.artifact.so_path if ref else None, options)
    if outcome.error:
        warnings.warn(f"fastdlight: {outcome.error}; nothing was timed: candidates ranked by the policy's estimate",
                      stacklevel=caller_stacklevel())
        ranked = rank(list(results.values()))
        return _finish(ranked, ranked[0] if ranked[0].compiled else None, opts, t_start, "compiled")
    ranked = rank([remote.merged(results[i], outcome.results[i]) if i in outcome.results else results[i]
                   for i in sorted(results)])
    best = next((r for r in ranked if r.index == outcome.best), None)
    return _finish(ranked, best, opts, t_start, "verified" if opts.check != "none" else "measured", outcome.nbytes)


def _finish(ranked, best, opts: TuneOptions, t_start, what, nbytes=None):
    if best is None:
        raise TuningError(
            f"no candidate could be used ({len(ranked)} tried, none {what}):\n{failure_summary(ranked)}"
        )
    if opts.verbose:
        print(format_table(ranked, nbytes=nbytes, best=best))
        print(f"{len(ranked)} candidates in {time.perf_counter() - t_start:.1f} s")
    return ranked, best
