"""The commands: ``fastdlight tune``, ``fastdlight export`` and ``fastdlight arch``."""

from __future__ import annotations

import json
import os
import re
import sys
import time

from fastdlight.cli.args import UsageError, describe_workload, one_line
from fastdlight.cli.preflight import before_work, once_resolved
from fastdlight.cli.sizes import DEFAULT_TARGET
from fastdlight.cli.toolkit import check_target_names_gpu, compiler_name
from fastdlight.cli.workload import decode_attention_steps, func_bytes, make_workload, resolve_arch


#: when the command started (set by :func:`fastdlight.cli.entry`): the wall time we report includes imports
STARTED: list[tuple[float, float]] = []


def _set_line(cset, arch, announced: list[str]) -> str:
    """A candidate set as the run announces it, with why it is not on faster units where that
    is not plain: on a wgmma GPU, why a tensor-core set has no wgmma tiles (say an operand's rows
    TMA cannot address); why a matmul's first set is on CUDA cores (fp16 on a T4: no m16n8k16)."""
    line = f"{cset.policy}: {len(cset.configs)} configs"
    if cset.policy == "TensorCorePolicy" and getattr(arch, "has_wgmma", False) \
            and not any(c.kind in ("matmul_wgmma", "matmul_wgmma_dequant") for c in cset.configs):
        from fastdlight.policies.wgmma import wgmma_eligible

        _match, why = wgmma_eligible(cset.func, arch)
        if why:
            line += f" (mma.sync only, no wgmma: {why})"
    if cset.policy == "DefaultPolicy" and "TensorCorePolicy" not in announced:
        from fastdlight.analysis.matmul_match import match_matmul
        from fastdlight.policies.tensorcore import tensorcore_tags

        if match_matmul(cset.func)[0] is not None:
            tags, why = tensorcore_tags(cset.func, arch)
            if tags is None and why:
                line += f" (CUDA cores, no tensor cores: {why})"
    announced.append(cset.policy)
    return line


def cmd_arch(args) -> int:
    from fastdlight.compiler.pool import gpu_device_nodes

    check_target_names_gpu(args.target, gpu_device_nodes())  # before TVM is loaded (it would say sm_50)
    arch, live, _notice = resolve_arch(args.target)
    if args.target is None and not live:
        print(f"No GPU was found: the {DEFAULT_TARGET} hardware model.")
    print(arch)
    return 0


def cmd_tune(args) -> int:
    before_work(args)
    t0 = STARTED[0][0] if STARTED else time.perf_counter()
    # Start the build workers and the probe process now: they import TVM while we do. The probe
    # process runs each built kernel once before this one times it; started with the first tune,
    # it was ready only after that 4096³ GEMM's builds were done (6.3 s into the process, on an
    # H100 machine), and they waited for it.
    from fastdlight.compiler.pool import gpu_device_nodes, probe_pool, shared_pool

    if not args.serial:
        shared_pool(args.workers).warm_up()
    if not args.no_measure and gpu_device_nodes():
        probe_pool().warm_up()
    # A built-in op is verified like a file's function, against itself widened to float64 and
    # built with the candidates (tune.reference), not against its numpy reference: that one runs
    # on the host after the timings (on every core it would slow the builds and the timed
    # launches), 0.85 s of a 4096³ GEMM's first tune on the H100 machine, where the widened
    # function runs on the GPU while candidates still build.
    (fname, func, _numpy_ref, flops, nbytes, memory_bound, opt_shapes), arch, can_measure = _resolved(args)
    measure = (can_measure or bool(args.rpc)) and not args.no_measure  # with --rpc the server's GPU times

    from fastdlight.search.options import TuneOptions

    opts = TuneOptions(measure=measure, parallel_build=not args.serial, max_workers=args.workers,
                       timeout=args.timeout, budget_ms=args.budget_ms, screen_ms=args.screen_ms, check=args.check,
                       progress=not args.quiet and sys.stderr.isatty(), timing=args.timing, rpc=args.rpc,
                       devices=args.devices or None)
    print(f"Tuning {describe_workload(args, fname)} for {arch.name} ({arch.arch}), top {args.topk} candidates, "
          f"built with {compiler_name()}" + ("" if measure else ", compile-only")
          + (f", timed through RPC at {args.rpc}" if args.rpc and measure else "")
          + (f", timed on GPU{'s' if len(args.devices or ()) > 1 else ''} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}"
             if args.devices and measure else ""))
    if opt_shapes and any(isinstance(v, tuple) for v in opt_shapes.values()):
        return _tune_dispatch(func, fname, arch, args, opts, opt_shapes, t0)
    steps = decode_attention_steps(args, arch)
    if steps:
        return _tune_decode(steps, arch, args, opts, (flops, nbytes), measure, can_measure, t0)
    tuned = _tune_shown(func, fname, arch, args, opts, (flops, nbytes, memory_bound), measure, can_measure, t0,
                        opt_shapes)
    if tuned is None:
        return 1
    results, best, perf = tuned
    wall = time.perf_counter() - t0
    print(f"Tuning wall time: {wall:.1f} s for {len(results)} candidates")
    if args.show_source:
        print(f"\n// CUDA source of the winner (#{best.index})\n{best.source}")
    if args.json:
        _write_json(args, fname, arch, measure, wall, results, best, perf)
    return 0


def _tune_shown(func, fname: str, arch, args, opts, perf, measure: bool, can_measure: bool, t0: float,
                opt_shapes=None):
    """``func`` tuned, its candidates' table and the winner printed: ``(results, best, perf)``
    (``perf``'s bytes those of the winner's parameters where none were given), or None where
    tuning failed (said on stderr)."""
    from fastdlight.search.candidates import tune_function
    from fastdlight.search.report import format_table
    from fastdlight.search.remote import RemoteError
    from fastdlight.search.runner import TuningError

    try:
        announced: list[str] = []
        tuned = tune_function(func, arch, args.topk, opts, opt_shapes=opt_shapes,
                              on_set=lambda c: print(_set_line(c, arch, announced)))
    except (ValueError, NotImplementedError) as e:  # the policy cannot analyze this function
        raise UsageError(f"cannot tune {fname}: {one_line(e)}") from None
    except (TuningError, RemoteError) as e:
        print(str(e), file=sys.stderr)
        print(f"fastdlight: tuning failed after {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return None
    results, best = list(tuned.results), tuned.best
    flops, nbytes, memory_bound = perf
    perf = (flops, nbytes if nbytes is not None else func_bytes(best._func, fname), memory_bound)
    print(format_table(results, flops=perf[0], nbytes=perf[1], memory_bound=memory_bound, best=best))
    print()
    _print_winner(results, best, measure, can_measure, arch, perf)
    return results, best, perf


def _tune_decode(steps, arch, args, opts, perf, measure: bool, can_measure: bool, t0: float) -> int:
    """``tune attention`` of a decode size: each split-KV function a model runs for it
    (:func:`decode_attention_steps`) tuned in turn, then their winners' total."""
    names = " and ".join(name for name, _ in steps)
    print(f"A decode size: tuned as a model runs it, the split-KV {names}")
    winners, docs = [], []
    for name, func in steps:
        print(f"\n{name}:")
        tuned = _tune_shown(func, name, arch, args, opts, (None, None, True), measure, can_measure, t0)
        if tuned is None:
            return 1
        results, best, step_perf = tuned
        winners.append(best)
        docs.append(_json_doc(name, name, arch, measure, None, results, best, step_perf))
    if measure and all(w.latency_ms is not None for w in winners):
        total = sum(w.latency_ms for w in winners)
        flops, nbytes = perf
        print(f"\nDecode attention: {total:.4f} ms in {len(winners)} kernel{'s' * (len(winners) > 1)}, "
              f"{nbytes / total / 1e9:.2f} TB/s of Q, K, V and the output, {flops / total / 1e9:.2f} TFLOPS")
    wall = time.perf_counter() - t0
    print(f"Tuning wall time: {wall:.1f} s")
    if args.show_source:
        for (name, _), best in zip(steps, winners):
            print(f"\n// CUDA source of {name}'s winner (#{best.index})\n{best.source}")
    if args.json:
        _dump_json(args, {"op": "attention", "description": describe_workload(args, "attention"),
                          "form": "split-KV decode", "wall_s": round(wall, 3), "functions": docs})
    return 0


def _tune_dispatch(func, fname: str, arch, args, opts, opt_shapes: dict, t0: float) -> int:
    from fastdlight.search.dynamic import check_dispatch, tune_dispatch
    from fastdlight.search.runner import TuningError

    try:
        dispatched = tune_dispatch(func, arch, args.topk, opts, opt_shapes)
        checks = check_dispatch(dispatched, func, arch, opts)
    except ValueError as e:
        raise UsageError(f"cannot tune {fname}: {one_line(e)}") from None
    except TuningError as e:
        print(str(e), file=sys.stderr)
        return 1
    if dispatched.defaulted:
        print(f"Default values (from the hardware model) for {', '.join(dispatched.defaulted)}")
    print("Dispatcher: the kernel tuned at each value serves the values above the previous one up to it")
    print(dispatched.describe())
    for c in checks:
        at = ", ".join(f"{n}={v}" for n, v in c.point)
        timing = f"  {c.latency_ms:.4f} ms (static winner {c.static_ms:.4f} ms)" if c.latency_ms and c.static_ms else ""
        print(f"  check {at}: {'ok' if c.passed else 'WRONG'} ({c.message}){timing}")
    print(f"Tuning wall time: {time.perf_counter() - t0:.1f} s")
    return 0 if all(c.passed for c in checks) else 1


def _resolved(args):
    """(the workload, the arch it is tuned for, whether this machine can time it): both checked
    against each other (sizes, toolkit), and the arch's notice printed."""
    workload = make_workload(args)
    arch, can_measure, notice = resolve_arch(args.target)
    once_resolved(args, arch, workload[1])
    if notice:
        print(notice)
    return workload, arch, can_measure


def _print_winner(results, best, measure: bool, can_measure: bool, arch, perf) -> None:
    from fastdlight.search.report import perf_text

    if measure and best.latency_ms is not None:
        check = "NOT checked (--check none)" if best.verdict is None else \
            f"verified against the {best.verdict.reference} ({best.check_message})"
        print(f"Winner: #{best.index} {best.config!r}: {best.latency_ms:.4f} ms ({perf_text(best, *perf)}), {check}")
        return
    n_ok = sum(r.compiled for r in results)
    why = ("the RPC server timed nothing (see its warning)" if measure else "no GPU was found" if not can_measure
           else "--no-measure was given")
    print(f"Nothing was timed because {why}: {n_ok} of {len(results)} candidates compiled to cubin "
          f"for {arch.arch}; ranked by the policy's predicted cost.")
    print(f"Top-ranked: #{best.index} {best.config!r} ({best.registers} registers/thread)")


def _write_json(args, fname, arch, measure, wall, results, best, perf) -> None:
    _dump_json(args, _json_doc(fname, describe_workload(args, fname), arch, measure, wall, results, best, perf))


def _json_doc(fname, description, arch, measure, wall, results, best, perf) -> dict:
    from fastdlight.search.report import perf_text

    flops, nbytes, _ = perf
    return {
        "op": fname, "description": description, "target": str(arch.target), "arch": arch.name,
        "measured": measure, "wall_s": None if wall is None else round(wall, 3), "best": best.index, "flops": flops,
        "bytes": nbytes, "reference": best.verdict.reference if best.verdict is not None else None,
        "results": [dict(rank=i, perf=perf_text(r, *perf), **r.to_dict()) for i, r in enumerate(results, 1)],
    }  # fmt: skip


def _dump_json(args, doc: dict) -> None:
    try:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    except OSError as e:
        raise UsageError(f"cannot write --json {args.json}: {e.strerror}") from None


def cmd_export(args) -> int:
    """The ``fastdlight export`` command: bad input exits 2 with one line (nothing written);
    a tuning run where no candidate works exits 1."""
    try:
        return _export(args)
    except UsageError as e:  # printed here: under ``python -m fastdlight.cli`` the caller's class differs
        print(f"fastdlight: error: {e}", file=sys.stderr)
        return 2


def _export(args) -> int:
    from fastdlight.export import ExportError, check_out_dir, export  # no TVM yet

    if args.name is not None and not re.fullmatch(r"[A-Za-z_]\w*", args.name):
        raise UsageError(f"bad --name {args.name!r}: use a C identifier")
    out = os.path.abspath(args.out)
    try:
        check_out_dir(out, args.force)
    except ExportError as e:
        raise UsageError(str(e)) from None
    before_work(args)
    if not args.serial:  # start the build workers now: they import TVM while we do
        from fastdlight.compiler.pool import shared_pool

        shared_pool(args.workers).warm_up()
    from fastdlight.search.runner import TuningError

    (fname, func, ref, _flops, _nbytes, _mb, opt_shapes), arch, can_measure = _resolved(args)
    measure = can_measure and not args.no_measure
    print(f"Exporting {describe_workload(args, fname)} for {arch.name} ({arch.arch}), top {args.topk} candidates"
          + ("" if measure else ", compile-only"))
    if decode_attention_steps(args, arch):
        print("Note: a decode size; a model runs it as the split-KV step (what `fastdlight tune attention` "
              "tunes), export writes the fused attention kernel")
    try:
        result = export(func, out, name=args.name or re.sub(r"\W", "_", fname), target=arch, topk=args.topk,
                        ref=ref, opt_shapes=opt_shapes, seed=args.seed, force=args.force, measure=measure,
                        parallel_build=not args.serial, max_workers=args.workers, timeout=args.timeout,
                        budget_ms=args.budget_ms, screen_ms=args.screen_ms,
                        progress=not args.quiet and sys.stderr.isatty())
    except ExportError as e:
        raise UsageError(str(e)) from None
    except (ValueError, NotImplementedError) as e:  # the policy cannot analyze this function
        raise UsageError(f"cannot export {fname}: {one_line(e)}") from None
    except TuningError as e:
        print(str(e), file=sys.stderr)
        print("fastdlight: export failed: no candidate could be used", file=sys.stderr)
        return 1
    timed = f"{result.latency_ms:.4f} ms (tuner)" if result.latency_ms is not None else "not timed"
    print(f"Exported {result.config!r}, {timed}, to {result.out_dir}:")
    for ln in result.launches:
        print(f"  {ln.kernel}<<<{ln.grid}, {ln.block}, {ln.dynamic_smem}>>>")
    print(f"Build and run: cd {result.out_dir} && {result.build_command} && ./{result.name}_example")
    return 0
