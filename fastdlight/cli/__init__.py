"""``fastdlight``: tune one operator from the command line, or show the hardware model.

    fastdlight tune matmul 4096 4096 4096 --dtype float32
    fastdlight tune add 1024 1024 --no-measure --topk 3
    fastdlight tune --file kernel.py [--func NAME]
    fastdlight export softmax 4096 4096 --out softmax_export/
    fastdlight arch [--target nvidia/nvidia-a100]

Bad input (unknown op, bad shape or dtype, sizes the GPU cannot hold, a CUDA toolkit that cannot
build for the target, a missing or unparsable file) exits with status 2 and one line on stderr,
checked before any work starts (:mod:`.preflight`); a tuning run where no candidate works exits
with status 1.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

from fastdlight.cli.args import UsageError, build_parser
from fastdlight.cli.commands import STARTED, cmd_arch, cmd_export, cmd_tune
from fastdlight.cli.workload import load_primfunc

__all__ = ["UsageError", "entry", "load_primfunc", "main"]


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
    STARTED.append((time.perf_counter(), time.time()))
    if os.environ.get("FASTDLIGHT_ALLOW_TORCH") != "1":
        sys.modules.setdefault("torch", None)
    return main()
