"""The command line's arguments: the parser, the operator spec and the checks made before any
work starts (this module imports neither TVM nor the tuner)."""

from __future__ import annotations

import argparse
import os
import re

from fastdlight import __version__
from fastdlight.analysis.dtypes import FP8_DTYPES
from fastdlight.cli.sizes import DTYPES, LAYOUTS, MAX_DIM, OP_DTYPES, Tensor, conv_output, matmul_layout, op_tensors
from fastdlight.search.options import DEFAULT_BUDGET_MS, DEFAULT_SCREEN_MS, DEFAULT_TIMEOUT, RpcSpec, parse_devices


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
    "attention": (5, "B H TQ TKV D"),
}


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


def _positive(kind, zero_ok=False):
    """An option's parser: a positive (``zero_ok``: or zero) finite number; an int within int64."""
    words = "zero or more" if zero_ok else "positive"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 or (zero_ok and value == 0)) or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be {words} and finite, got {text}")
        if kind is int and value > MAX_DIM:
            raise argparse.ArgumentTypeError(f"{text} is too large (at most 2^63 - 1)")
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


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown once: not where the help already says it, nor for None and flags."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or action.default == []:
            return text
        return super()._get_help_string(action)


class _Version(argparse.Action):
    """``--version``: TVM's version read from its package metadata (importing TVM takes seconds)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata

        try:
            tvm = f"apache-tvm {metadata.version('apache-tvm')}"
        except metadata.PackageNotFoundError:
            tvm = "apache-tvm not installed"
        print(f"fastdlight {__version__} ({tvm})")
        parser.exit()


#: what TVM prints after "but got:" (the whole statement), told in a few words
_GIST = (
    (re.compile(r"^while\b"), "a while loop"),
    (re.compile(r'T\.call_extern\("\w+", "([^"]+)"'), "an opaque T.call_extern({!r})"),
    (re.compile(r'T\.call_packed\("([^"]+)"'), "an opaque T.call_packed({!r})"),
)
_DECLARATION = re.compile(r"^\w+ = T\.(Buffer|alloc_\w+|decl_buffer)\(")


def _gist(lines: list[str]) -> str:
    """What the lines after a message's closing colon show: a construct we can name, else their
    first statement (buffer declarations aside), cut to 80 characters."""
    for ln in lines:
        for pattern, words in _GIST:
            found = pattern.search(ln)
            if found:
                return words.format(*found.groups())
    body = [ln for ln in lines if not _DECLARATION.match(ln)]
    return "" if not body else body[0] if len(body[0]) <= 80 else body[0][:77] + "..."


def one_line(e: BaseException) -> str:
    """An error as one line: its first, with what a closing colon introduces summarized (TVM's
    "...expected to be the root block, but got:" is followed by the statement it got)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    first = lines[0].removeprefix("error: ")
    where = next((ln.removeprefix("--> ") for ln in lines[1:] if ln.startswith("-->")), "")
    if where:
        return f"{first} (at {where})"
    gist = _gist(lines[1:]) if first.endswith(":") else ""
    if "root block" in first and gist:
        gist += " (fastdlight tunes functions made of T.sblock blocks)"
    return f"{first} {gist}" if gist else first


def add_workload_arguments(p: argparse.ArgumentParser, verb: str, example: str) -> None:
    """The operator (OP SHAPE... or --file) and its options, shared by ``tune`` and ``export``."""
    p.add_argument("op", nargs="?", help=f"operator: {', '.join(OPS)}")
    p.add_argument("shape", nargs="*", help=f"dimensions, {example}")
    p.add_argument("--file", help=f"{verb} the TVMScript PrimFunc in this Python file instead of OP")
    p.add_argument("--func", help=f"with --file: the PrimFunc (or IRModule function) to {verb}")
    p.add_argument("--shape-var", action="append", type=_shape_var, default=[], metavar="NAME=VALUE",
                   help="give a symbolic dimension of the --file function a value (repeatable); "
                        "NAME=V1,V2,... tunes a kernel at each value behind one dispatcher")
    p.add_argument("--dtype", default="float16", help=f"input dtype: {', '.join(DTYPES)} (as the op takes)")
    p.add_argument("--out-dtype", help="output/accumulator dtype (default: from --dtype)")
    p.add_argument("--layout", help=f"matmul layout: {', '.join(LAYOUTS)} (T: stored transposed; default NN, "
                                    "NT for float8 inputs)")
    p.add_argument("--batch", type=_positive(int), help="matmul: batch size (batched matmul)")
    p.add_argument("--weight-dtype", choices=("int4", "int8"),
                   help="matmul: weights quantized to this (packed, dequantized in the kernel; A is M×K, B is N×K)")
    p.add_argument("--group-size", type=_positive(int), default=128, help="--weight-dtype: weights per scale along K")
    p.add_argument("--zero-point", action="store_true",
                   help="--weight-dtype: a zero per group (default: the middle of the range, 8 or 128)")
    p.add_argument("--scales", choices=("tensor", "row"),
                   help="float8 matmul: scale the result by float32 scales of A and B, one each or one per row")
    p.add_argument("--m", type=_positive(int), default=1, help="gemv: rows of X (<= 16 is the low-batch case)")
    p.add_argument("--axis", type=int, default=-1, choices=(-1, 0), help="sum/max: reduced axis")
    p.add_argument("--kernel", type=_positive(int), default=3, help="conv2d: kernel size R=S")
    p.add_argument("--stride", type=_positive(int), default=1, help="conv2d: stride")
    p.add_argument("--pad", type=_positive(int, zero_ok=True), default=1, help="conv2d: padding")
    p.add_argument("--causal", action="store_true", help="attention: causal mask (aligned to the bottom right)")
    p.add_argument("--kv-heads", type=_positive(int), help="attention: K/V heads G dividing H (GQA; default H)")


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    """How candidates are built and timed, shared by ``tune`` and ``export``."""
    p.add_argument("--topk", type=_positive(int), default=20, help="candidates to build and time")
    p.add_argument("--target", help="TVM target or tag (default: the live GPU, else nvidia/nvidia-h100)")
    p.add_argument("--workers", type=_positive(int), help="build processes (default: one per CPU)")
    p.add_argument("--serial", action="store_true", help="build in this process (no worker pool)")
    p.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT,
                   help="seconds one candidate may take to build")
    p.add_argument("--budget-ms", type=_positive(float), default=DEFAULT_BUDGET_MS,
                   help="timing budget of each finalist (the fastest few, timed again)")
    p.add_argument("--rpc", type=_rpc_address, metavar="HOST:PORT[:KEY]",
                   help="time and verify on another machine's GPU: a 'python -m fastdlight.rpc_server' at HOST:PORT, "
                        "or one a TVM tracker at HOST:PORT has under KEY (builds stay here)")
    p.add_argument("--screen-ms", type=_positive(float), default=DEFAULT_SCREEN_MS,
                   help="timing budget of the first pass over every candidate")
    p.add_argument("--devices", type=_devices, metavar="I[,J...]",
                   help="GPUs of this machine to time on: the first-pass timings go to whichever is free, "
                        "the finalists all to one of them")


def add_export_parser(sub) -> argparse.ArgumentParser:
    """``fastdlight export``: the operator spec of ``fastdlight tune`` plus ``--out``."""
    p = sub.add_parser(
        "export", help="tune one operator (or a TVMScript PrimFunc) and export it for C++ hosts",
        description="Tune like 'fastdlight tune', then write OUT/NAME.cuh (the kernels and NAME_launch), "
        "OUT/NAME_example.cu (checks the result against a float64 reference and times it), its data, a Makefile "
        "and a README with the nvcc command. Operators: " + "; ".join(f"{k} {d}" for k, (_, d) in OPS.items()) + ".",
        formatter_class=_Help,
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fastdlight",
        description="Hardware-aware, seconds-fast GPU kernel tuning for Apache TVM (Roller-style).",
        epilog="Run 'fastdlight tune --help' for the operators and tuning options.",
    )
    parser.add_argument("--version", action=_Version, help="print fastdlight's and TVM's versions and exit")
    sub = parser.add_subparsers(dest="command", metavar="{tune,export,arch}", parser_class=_Parser)

    ops_help = "; ".join(f"{name} {dims}" for name, (_, dims) in OPS.items())
    tune = sub.add_parser(
        "tune", help="tune one operator (or a TVMScript PrimFunc) and print the ranked candidates",
        description=f"Emit configs with the Roller-style policy, compile them in parallel, time them on the "
        f"GPU (inputs out of L2, CUDA events, median), check the winner, print the ranking. Operators: {ops_help}. "
        "Without a GPU every candidate is still compiled to a cubin and ranked by predicted cost.",
        formatter_class=_Help,
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

    arch = sub.add_parser("arch", help="print the hardware model of a target or of this machine's GPU",
                          description="Print the hardware model (SMs, registers, shared memory, L2, bandwidth, "
                          "tensor-core shapes) for a target, the live GPU, or the H100 model.",
                          formatter_class=_Help)
    arch.add_argument("--target", help="TVM target or tag (default: the live GPU, else nvidia/nvidia-h100)")
    add_export_parser(sub)
    return parser


def parse_dims(op: str, shape: list[str]) -> list[int]:
    rank, names = OPS[op]
    dims = []
    for s in shape:
        try:
            d = int(s)
        except ValueError:
            raise UsageError(f"bad shape for {op}: {s!r} is not an integer (expected {op} {names})") from None
        if d <= 0:
            raise UsageError(f"bad shape for {op}: dimensions must be positive, got {d}")
        if d > MAX_DIM:
            raise UsageError(f"bad shape for {op}: {d} does not fit in int64 (dimensions are below 2^63)")
        dims.append(d)
    if (rank is None and not dims) or (rank is not None and len(dims) != rank):
        raise UsageError(f"bad shape for {op}: expected {op} {names}, got {len(dims)} dimension(s)")
    return dims


def _devices(text: str) -> tuple[int, ...]:
    try:
        return parse_devices(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("devices ")) from None


def _rpc_address(text: str) -> str:
    try:
        return str(RpcSpec.parse(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--rpc ")) from None


def describe_workload(args, fname) -> str:
    if args.file:
        return f"{fname} from {args.file}"
    extra = ""
    if args.op == "matmul" and args.weight_dtype:
        zeros = ", zero points" if args.zero_point else ""
        extra = f" {args.weight_dtype} weights (groups of {args.group_size}{zeros})"
    elif args.op == "matmul":
        extra = f" {matmul_layout(args)}" + (f" batch {args.batch}" if args.batch else "")
        extra += f", {args.scales} scales" if args.scales else ""
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


def validate_args(args) -> list[Tensor] | None:
    """Refuse bad arguments (UsageError) before anything is started or imported; the tensors of
    a built-in operator, None for a --file function."""
    if args.file and args.op:
        raise UsageError("give either OP SHAPE... or --file, not both")
    if not args.file and not args.op:
        raise UsageError(f"missing OP: one of {', '.join(OPS)} (or --file kernel.py)")
    for given, option in ((args.shape_var, "--shape-var"), (args.func, "--func")):
        if given and not args.file:
            raise UsageError(f"{option} applies to a --file function")
    if args.json:
        _check_json_path(args.json)
    return None if args.file else _op_tensors(args)


def _check_weight_quantization(args, op: str, dims: list[int]) -> None:
    if args.weight_dtype is None:
        if args.zero_point:
            raise UsageError("--zero-point applies to a matmul with --weight-dtype int4 or int8")
        return
    if op != "matmul":
        raise UsageError(f"--weight-dtype applies to matmul, not {op}")
    if args.dtype not in ("float16", "bfloat16"):
        raise UsageError(f"matmul --weight-dtype {args.weight_dtype}: activations must be float16 or bfloat16, "
                         f"not {args.dtype}")
    if args.batch or args.out_dtype or matmul_layout(args) != "NN":
        raise UsageError(f"matmul --weight-dtype {args.weight_dtype} takes no --batch, --out-dtype or --layout "
                         "(A is M×K, the weights N×K, the result in --dtype)")
    k, per_word = dims[2], 32 // int(args.weight_dtype[3:])
    if args.group_size % per_word or k % args.group_size:
        raise UsageError(f"matmul --weight-dtype {args.weight_dtype}: --group-size {args.group_size} must be a "
                         f"multiple of {per_word} dividing K ({k})")


def _op_tensors(args) -> list[Tensor]:
    op = args.op
    if op not in OPS:
        raise UsageError(f"unknown op {op!r}; choose one of: {', '.join(OPS)} (or --file kernel.py)")
    dims = parse_dims(op, args.shape)
    if args.dtype not in OP_DTYPES[op]:
        raise UsageError(f"{op}: unsupported dtype {args.dtype!r}; supported: {', '.join(OP_DTYPES[op])}")
    if args.out_dtype is not None and args.out_dtype not in DTYPES:
        raise UsageError(f"{op}: unsupported --out-dtype {args.out_dtype!r}; supported: {', '.join(DTYPES)}")
    if op == "matmul" and matmul_layout(args) not in LAYOUTS:
        raise UsageError(f"unsupported matmul --layout {args.layout!r}; use {', '.join(LAYOUTS[:-1])} or {LAYOUTS[-1]}")
    if op == "matmul" and args.dtype in FP8_DTYPES and matmul_layout(args) != "NT":
        raise UsageError(f"matmul {args.dtype}: Hopper's tensor cores read 8-bit operands K-major only: "
                         f"--layout NT (A is M×K, B is N×K), not {matmul_layout(args)}")
    _check_weight_quantization(args, op, dims)
    if args.scales and not (op == "matmul" and args.dtype in FP8_DTYPES):
        raise UsageError("--scales applies to a float8 matmul (--dtype float8_e4m3fn or float8_e5m2)")
    if op == "conv2d" and min(conv_output(*dims[1:3], args.kernel, args.stride, args.pad)) <= 0:
        raise UsageError(f"conv2d: the {args.kernel}x{args.kernel} kernel is larger than the padded input "
                         f"({dims[1]}x{dims[2]}, --pad {args.pad})")
    if op == "attention":
        heads, seq_q, seq_kv = dims[1:4]
        if heads % (args.kv_heads or heads):
            raise UsageError(f"attention: --kv-heads {args.kv_heads} must divide H ({heads})")
        if args.causal and seq_q > seq_kv:
            raise UsageError(f"attention: --causal needs TQ <= TKV (got {seq_q} > {seq_kv})")
    for option, value, applies in (("--causal", args.causal, "attention"), ("--kv-heads", args.kv_heads, "attention")):
        if value and op != applies:
            raise UsageError(f"{option} applies to {applies}, not {op}")
    return op_tensors(op, dims, args)
