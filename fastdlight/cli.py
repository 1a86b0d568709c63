"""``fastdlight``: tune one operator from the command line, or show the hardware model.

    fastdlight tune matmul 4096 4096 4096 --dtype float32
    fastdlight tune add 1024 1024 --no-measure --topk 3
    fastdlight tune --file kernel.py [--func NAME]
    fastdlight export softmax 4096 4096 --out softmax_export/
    fastdlight arch [--target nvidia/nvidia-a100]

Bad input (unknown op, bad shape or dtype, missing or unparsable file) exits with status 2
and one line on stderr; a tuning run where no candidate works exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import sys
import time
import warnings

from fastdlight.search.options import DEFAULT_BUDGET_MS, DEFAULT_SCREEN_MS, DEFAULT_TIMEOUT

DEFAULT_TARGET = "nvidia/nvidia-h100"
#: when the command started (set by :func:`entry`): the wall time we report includes imports
_STARTED: list[tuple[float, float]] = []

#: op name -> (number of shape dims or None for "any rank >= 1", the dims' names for help/errors)
OPS = {
    "matmul": (3, "M N K"),
    "gemv": (2, "N K"),
    "add": (None, "D0 [D1 ...]"),
    "copy": (None, "D0 [D1 ...]"),
    "bias_relu": (None, "D0 [D1 ...]"),
    "sum": (2, "R C"),
    "max": (2, "R C"),
    "softmax": (2, "R C"),
    "conv2d": (5, "N H W C K"),
}


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


def _compiler() -> str:
    """The CUDA compiler the builds use (``FASTDLIGHT_CUDA_COMPILER``, else NVRTC where installed)."""
    from fastdlight.compiler.compile import CompileError, cuda_compiler

    try:
        return {"nvrtc": "NVRTC", "nvcc": "nvcc"}[cuda_compiler()]
    except CompileError as e:
        raise UsageError(str(e)) from None


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be positive and finite, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _shape_var(text: str) -> tuple[str, int | tuple[int, ...]]:
    """NAME=VALUE (specialize to one value) or NAME=V1,V2,... (a kernel per value, dispatched)."""
    name, sep, value = text.partition("=")
    parts = [v.strip() for v in value.split(",")]
    if not sep or not name.strip() or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE or NAME=V1,V2,... with positive integers, got {text!r}")
    values = tuple(int(p) for p in parts)
    return name.strip(), values[0] if len(values) == 1 else values


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _set_line(cset, arch) -> str:
    """A candidate set as the run announces it; on a wgmma GPU, why a tensor-core set has no
    wgmma tiles (say an operand's rows TMA cannot address) rather than mma.sync silently."""
    line = f"{cset.policy}: {len(cset.configs)} configs"
    if cset.policy == "TensorCorePolicy" and getattr(arch, "has_wgmma", False) \
            and not any(c.kind == "matmul_wgmma" for c in cset.configs):
        from fastdlight.policies.wgmma import wgmma_eligible

        _match, why = wgmma_eligible(cset.func, arch)
        if why:
            line += f" (mma.sync only, no wgmma: {why})"
    return line


def one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    first = lines[0].removeprefix("error: ")
    where = next((ln.removeprefix("--> ") for ln in lines[1:] if ln.startswith("-->")), "")
    return f"{first} (at {where})" if where else first


def add_workload_arguments(p: argparse.ArgumentParser, verb: str, example: str) -> None:
    """The operator (OP SHAPE... or --file) and its options, shared by ``tune`` and ``export``."""
    p.add_argument("op", nargs="?", help=f"operator: {', '.join(OPS)}")
    p.add_argument("shape", nargs="*", help=f"dimensions, {example}")
    p.add_argument("--file", help=f"{verb} the TVMScript PrimFunc in this Python file instead of OP")
    p.add_argument("--func", help=f"with --file: the PrimFunc (or IRModule function) to {verb}")
    p.add_argument("--shape-var", action="append", type=_shape_var, default=[], metavar="NAME=VALUE",
                   help="give a symbolic dimension of the --file function a value (repeatable); "
                        "NAME=V1,V2,... tunes a kernel at each value behind one dispatcher")
    p.add_argument("--dtype", default="float16", help="input dtype")
    p.add_argument("--out-dtype", help="output/accumulator dtype (default: from --dtype)")
    p.add_argument("--layout", default="NN", help="matmul layout: NN, NT, TN (T: stored transposed)")
    p.add_argument("--batch", type=int, help="matmul: batch size (batched matmul)")
    p.add_argument("--m", type=int, default=1, help="gemv: rows of X (<= 16 is the low-batch case)")
    p.add_argument("--axis", type=int, default=-1, choices=(-1, 0), help="sum/max: reduced axis")
    p.add_argument("--kernel", type=int, default=3, help="conv2d: kernel size R=S")
    p.add_argument("--stride", type=int, default=1, help="conv2d: stride")
    p.add_argument("--pad", type=int, default=1, help="conv2d: padding")


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    """How candidates are built and timed, shared by ``tune`` and ``export``."""
    p.add_argument("--topk", type=_positive(int), default=20, help="candidates to build and time")
    p.add_argument("--target", help="TVM target or tag (default: the live GPU, else nvidia/nvidia-h100)")
    p.add_argument("--workers", type=_positive(int), help="build processes (default: one per CPU)")
    p.add_argument("--serial", action="store_true", help="build in this process (no worker pool)")
    p.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT, help="seconds one candidate may take to build")
    p.add_argument("--budget-ms", type=_positive(float), default=DEFAULT_BUDGET_MS,
                   help="timing budget of each finalist (the fastest few, timed again)")
    p.add_argument("--screen-ms", type=_positive(float), default=DEFAULT_SCREEN_MS,
                   help="timing budget of the first pass over every candidate")


# -- argument parsing ---------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fastdlight",
        description="Hardware-aware, seconds-fast GPU kernel tuning for Apache TVM (Roller-style).",
        epilog="Run 'fastdlight tune --help' for the operators and tuning options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{tune,export,arch}", parser_class=_Parser)

    ops_help = "; ".join(f"{name} {dims}" for name, (_, dims) in OPS.items())
    tune = sub.add_parser(
        "tune", help="tune one operator (or a TVMScript PrimFunc) and print the ranked candidates",
        description=f"Emit configs with the Roller-style policy, compile them in parallel, time them on the "
        f"GPU (inputs out of L2, CUDA events, median), check the winner, print the ranking. Operators: {ops_help}. "
        "Without a GPU every candidate is still compiled to a cubin and ranked by predicted cost.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    add_workload_arguments(tune, "tune", "e.g. 'matmul 4096 4096 4096'")
    tune.add_argument("--no-measure", action="store_true", help="compile to cubin only; rank by predicted cost")
    add_build_arguments(tune)
    tune.add_argument("--timing", default="rotate", choices=("rotate", "flush"),
                      help="rotate: cycle inputs through copies so none is in L2 (default); "
                           "flush: flush L2 and synchronize before each launch")
    tune.add_argument("--check", default="winner", choices=("winner", "all", "none"),
                      help="check the winner (then the next fastest until one is right), every candidate, or none")
    tune.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    tune.add_argument("--show-source", action="store_true", help="print the winner's CUDA source")
    tune.add_argument("--quiet", action="store_true", help="no progress bars")

    arch = sub.add_parser("arch", help="print the hardware model fastdlight tunes for",
                          description="Print the hardware model (SMs, registers, shared memory, L2, bandwidth, "
                          "tensor-core shapes) for a target, the live GPU, or the H100 model.")
    arch.add_argument("--target", help="TVM target or tag (default: the live GPU, else nvidia/nvidia-h100)")
    add_export_parser(sub)
    return parser


def _parse_dims(op: str, shape: list[str]) -> list[int]:
    rank, names = OPS[op]
    dims = []
    for s in shape:
        try:
            d = int(s)
        except ValueError:
            raise UsageError(f"bad shape for {op}: {s!r} is not an integer (expected {op} {names})") from None
        if d <= 0:
            raise UsageError(f"bad shape for {op}: dimensions must be positive, got {d}")
        dims.append(d)
    if (rank is None and not dims) or (rank is not None and len(dims) != rank):
        raise UsageError(f"bad shape for {op}: expected {op} {names}, got {len(dims)} dimension(s)")
    return dims


def make_op(args):
    """The :class:`fastdlight.ops.Op` the arguments describe (UsageError on bad input)."""
    from fastdlight import ops

    if args.op not in OPS:
        raise UsageError(f"unknown op {args.op!r}; choose one of: {', '.join(OPS)} (or --file kernel.py)")
    d = _parse_dims(args.op, args.shape)
    try:
        if args.op == "matmul":
            return ops.matmul(*d, dtype=args.dtype, out_dtype=args.out_dtype, layout=args.layout, batch=args.batch)
        if args.op == "gemv":
            return ops.gemv(d[0], d[1], m=args.m, dtype=args.dtype, out_dtype=args.out_dtype)
        if args.op in ("add", "copy", "bias_relu"):
            return ops.elementwise(d, args.dtype, args.op)
        if args.op in ("sum", "max"):
            return ops.reduce(d, args.dtype, args.op, axis=args.axis)
        if args.op == "softmax":
            return ops.softmax(*d, dtype=args.dtype)
        if args.dtype in ("float16", "bfloat16") and args.out_dtype is None:
            # as models hold it (ConvertLayout to NHWC/OHWI, fp32 sums): the Hopper wgmma path takes it
            return ops.conv2d_nhwc_ohwi(*d, r=args.kernel, stride=args.stride, pad=args.pad, dtype=args.dtype)
        return ops.conv2d_nhwc(*d, r=args.kernel, s=args.kernel, stride=args.stride, pad=args.pad,
                               dtype=args.dtype, out_dtype=args.out_dtype)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{args.op}: {one_line(e)}") from None


def load_primfunc(path: str, name: str | None = None):
    """The TVMScript PrimFunc defined in ``path`` (the one called ``name`` when there are several)."""
    import runpy

    import tvm
    from tvm.script import ir as I
    from tvm.script import tirx as T

    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            # T and I predefined: TVM's .script() prints its imports as comments
            namespace = runpy.run_path(path, init_globals={"T": T, "I": I}, run_name="__fastdlight_kernel__")
    except SyntaxError as e:
        raise UsageError(f"cannot parse {path}: {e.msg} (line {e.lineno})") from None
    except BaseException as e:  # noqa: BLE001 - TVMScript DiagnosticError, NameError, ... in the user's file
        raise UsageError(f"cannot parse {path}: {one_line(e)}") from None
    found = []
    for key, value in namespace.items():
        if isinstance(value, tvm.tirx.PrimFunc):
            found.append((key, value))
        elif isinstance(value, tvm.IRModule):
            found += [(gv.name_hint, f) for gv, f in value.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    if not found:
        raise UsageError(f"no TVMScript PrimFunc found in {path} (decorate one with @T.prim_func(s_tir=True))")
    if name is None:
        if len(found) > 1:
            raise UsageError(f"{path} defines {len(found)} PrimFuncs ({', '.join(k for k, _ in found)}); "
                             "choose one with --func NAME")
        return found[0]
    for key, func in found:
        if key == name:
            return key, func
    raise UsageError(f"no PrimFunc named {name!r} in {path}; found: {', '.join(k for k, _ in found)}")


def resolve_arch(target: str | None):
    """(arch, can_measure, notice) for --target / the live GPU / the H100 model."""
    from fastdlight.arch import CUDA, auto_arch, has_gpu

    gpu = has_gpu()
    if target is None:
        if gpu:
            return auto_arch(), True, None
        return CUDA(DEFAULT_TARGET), False, (
            f"No GPU was found: tuning for the {DEFAULT_TARGET} hardware model; nothing will be timed.")
    try:
        arch = CUDA(target)
    except Exception as e:  # noqa: BLE001 - unknown tag, not CUDA, unparsable
        raise UsageError(f"bad --target {target!r}: {one_line(e)}") from None
    if not gpu:
        return arch, False, f"No GPU was found: nothing will be timed (target {target})."
    live = auto_arch()
    if tuple(live.compute_capability) != tuple(arch.compute_capability):
        return arch, False, (f"--target {target} ({arch.arch}) is not the GPU in this machine ({live.name}, "
                             f"{live.arch}): kernels are compiled for it but not timed.")
    return arch, True, None


# -- commands -------------------------------------------------------------------------------
def cmd_arch(args) -> int:
    arch, _, notice = resolve_arch(args.target)
    if notice:
        print(notice.replace("; nothing will be timed", "").replace(": nothing will be timed", ""))
    print(arch)
    return 0


def describe_workload(args, fname) -> str:
    if args.file:
        return f"{fname} from {args.file}"
    extra = ""
    if args.op == "matmul":
        extra = f" {args.layout.upper()}" + (f" batch {args.batch}" if args.batch else "")
    return f"{args.op} {'x'.join(args.shape)}{extra} {args.dtype}" + (f"->{args.out_dtype}" if args.out_dtype else "")


def _check_json_path(path: str) -> None:
    """Refuse an unwritable --json path before tuning, writing nothing."""
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"cannot write --json {path}: it is a directory")
    if not os.path.isdir(where):
        raise UsageError(f"cannot write --json {path}: no such directory {where}")
    if not os.access(path if os.path.exists(path) else where, os.W_OK):
        raise UsageError(f"cannot write --json {path}: permission denied")


def validate_args(args) -> None:
    if args.file and args.op:
        raise UsageError("give either OP SHAPE... or --file, not both")
    if not args.file and not args.op:
        raise UsageError(f"missing OP: one of {', '.join(OPS)} (or --file kernel.py)")
    if args.shape_var and not args.file:
        raise UsageError("--shape-var applies to a --file function")
    if args.json:
        _check_json_path(args.json)


def make_workload(args):
    """(name, func, numpy reference or None, flops, bytes, memory_bound, opt_shapes)."""
    if args.file:
        fname, func = load_primfunc(args.file, args.func)
        return fname, func, None, None, None, True, dict(args.shape_var) or None
    op = make_op(args)
    return op.name, op.func, op.reference, op.flops, op.bytes, op.memory_bound, None


def _func_bytes(func, fname: str) -> int:
    import tvm

    from fastdlight.measure.timing import param_buffers, static_shape

    try:
        return sum(math.prod(static_shape(b)) * tvm.DataType(str(b.dtype)).bits // 8 for b in param_buffers(func))
    except ValueError as e:
        raise UsageError(f"cannot tune {fname}: {one_line(e)}") from None


def cmd_tune(args) -> int:
    validate_args(args)
    t0 = _STARTED[0][0] if _STARTED else time.perf_counter()
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
    fname, func, _numpy_ref, flops, nbytes, memory_bound, opt_shapes = make_workload(args)
    arch, can_measure, notice = resolve_arch(args.target)
    measure = can_measure and not args.no_measure
    if notice:
        print(notice)

    from fastdlight.search.candidates import tune_function
    from fastdlight.search.options import TuneOptions
    from fastdlight.search.report import format_table
    from fastdlight.search.runner import TuningError

    opts = TuneOptions(measure=measure, parallel_build=not args.serial, max_workers=args.workers,
                       timeout=args.timeout, budget_ms=args.budget_ms, screen_ms=args.screen_ms, check=args.check,
                       progress=not args.quiet and sys.stderr.isatty(), timing=args.timing)
    print(f"Tuning {describe_workload(args, fname)} for {arch.name} ({arch.arch}), top {args.topk} candidates, "
          f"built with {_compiler()}" + ("" if measure else ", compile-only"))
    if opt_shapes and any(isinstance(v, tuple) for v in opt_shapes.values()):
        return _tune_dispatch(func, fname, arch, args, opts, opt_shapes, t0)
    try:
        tuned = tune_function(func, arch, args.topk, opts, opt_shapes=opt_shapes,
                              on_set=lambda c: print(_set_line(c, arch)))
    except (ValueError, NotImplementedError) as e:  # the policy cannot analyze this function
        raise UsageError(f"cannot tune {fname}: {one_line(e)}") from None
    except TuningError as e:
        print(str(e), file=sys.stderr)
        print(f"fastdlight: tuning failed after {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return 1
    results, best = list(tuned.results), tuned.best
    nbytes = nbytes if nbytes is not None else _func_bytes(best._func, fname)
    print(format_table(results, flops=flops, nbytes=nbytes, memory_bound=memory_bound, best=best))
    print()
    _print_winner(results, best, measure, can_measure, arch, (flops, nbytes, memory_bound))
    wall = time.perf_counter() - t0
    print(f"Tuning wall time: {wall:.1f} s for {len(results)} candidates")
    if args.show_source:
        print(f"\n// CUDA source of the winner (#{best.index})\n{best.source}")
    if args.json:
        _write_json(args, fname, arch, measure, wall, results, best, (flops, nbytes, memory_bound))
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


def _print_winner(results, best, measure: bool, can_measure: bool, arch, perf) -> None:
    from fastdlight.search.report import perf_text

    if measure:
        check = "NOT checked (--check none)" if best.verdict is None else \
            f"verified against the {best.verdict.reference} ({best.check_message})"
        print(f"Winner: #{best.index} {best.config!r}: {best.latency_ms:.4f} ms ({perf_text(best, *perf)}), {check}")
        return
    n_ok = sum(r.compiled for r in results)
    why = "no GPU was found" if not can_measure else "--no-measure was given"
    print(f"Nothing was timed because {why}: {n_ok} of {len(results)} candidates compiled to cubin "
          f"for {arch.arch}; ranked by the policy's predicted cost.")
    print(f"Top-ranked: #{best.index} {best.config!r} ({best.registers} registers/thread)")


def _write_json(args, fname, arch, measure, wall, results, best, perf) -> None:
    from fastdlight.search.report import perf_text

    flops, nbytes, _ = perf
    doc = {
        "op": fname, "description": describe_workload(args, fname), "target": str(arch.target), "arch": arch.name,
        "measured": measure, "wall_s": round(wall, 3), "best": best.index, "flops": flops, "bytes": nbytes,
        "reference": best.verdict.reference if best.verdict is not None else None,
        "results": [dict(rank=i, perf=perf_text(r, *perf), **r.to_dict()) for i, r in enumerate(results, 1)],
    }  # fmt: skip
    try:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    except OSError as e:
        raise UsageError(f"cannot write --json {args.json}: {e.strerror}") from None


# -- fastdlight export ---------------------------------------------------------------------
def add_export_parser(sub) -> argparse.ArgumentParser:
    """``fastdlight export``: the operator spec of ``fastdlight tune`` plus ``--out``."""
    p = sub.add_parser(
        "export", help="tune one operator (or a TVMScript PrimFunc) and export it for C++ hosts",
        description="Tune like 'fastdlight tune', then write OUT/NAME.cuh (the kernels and NAME_launch), "
        "OUT/NAME_example.cu (checks the result against a float64 reference and times it), its data, a Makefile "
        "and a README with the nvcc command. Operators: " + "; ".join(f"{k} {d}" for k, (_, d) in OPS.items()) + ".",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    add_workload_arguments(p, "export", "e.g. 'softmax 4096 4096'")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (must not exist, or be empty)")
    p.add_argument("--name", help="C name of the export (default: the function's)")
    p.add_argument("--force", action="store_true", help="replace DIR when it is not empty")
    p.add_argument("--no-measure", action="store_true", help="compile only; export the top-ranked candidate")
    add_build_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the example's random inputs")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(json=None)
    return p


def cmd_export(args) -> int:
    """The ``fastdlight export`` command: bad input exits 2 with one line (nothing written);
    a tuning run where no candidate works exits 1."""
    try:
        return _export(args)
    except UsageError as e:  # printed here: under ``python -m fastdlight.cli`` the caller's class differs
        print(f"fastdlight: error: {e}", file=sys.stderr)
        return 2


def _export(args) -> int:
    from fastdlight.export import ExportError, check_out_dir, export
    from fastdlight.search.runner import TuningError

    validate_args(args)
    if args.name is not None and not re.fullmatch(r"[A-Za-z_]\w*", args.name):
        raise UsageError(f"bad --name {args.name!r}: use a C identifier")
    out = os.path.abspath(args.out)
    try:
        check_out_dir(out, args.force)
    except ExportError as e:
        raise UsageError(str(e)) from None
    if not args.serial:  # start the build workers now: they import TVM while we do
        from fastdlight.compiler.pool import shared_pool

        shared_pool(args.workers).warm_up()
    fname, func, ref, _flops, _nbytes, _mb, opt_shapes = make_workload(args)
    arch, can_measure, notice = resolve_arch(args.target)
    measure = can_measure and not args.no_measure
    if notice:
        print(notice)
    print(f"Exporting {describe_workload(args, fname)} for {arch.name} ({arch.arch}), top {args.topk} candidates"
          + ("" if measure else ", compile-only"))
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    warnings.formatwarning = lambda msg, *a, **k: f"{msg}\n"
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command == "export":
            return cmd_export(args)
        return cmd_tune(args) if args.command == "tune" else cmd_arch(args)
    except UsageError as e:
        print(f"fastdlight: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fastdlight: interrupted", file=sys.stderr)
        return 130


def entry() -> int:
    """The ``fastdlight`` console command: :func:`main` in a process of its own.

    tvm_ffi imports torch whenever torch is installed, which costs seconds and which nothing
    here needs (kernels are timed through the CUDA driver): the command blocks that import
    (FASTDLIGHT_ALLOW_TORCH=1 keeps it)."""
    _STARTED.append((time.perf_counter(), time.time()))
    if os.environ.get("FASTDLIGHT_ALLOW_TORCH") != "1":
        sys.modules.setdefault("torch", None)
    return main()


if __name__ == "__main__":
    sys.exit(entry())
