"""The checks a ``tune`` or ``export`` run makes before it does any work, in two rounds.

Before the build workers start and TVM loads: the arguments, the operator's sizes against the
memory the table knows, the target's text and the CUDA toolkit (:func:`before_work`, no TVM: a
misspelled op used to cost 2-5 s). Once the target is resolved: the sizes against that GPU's own
memory, a --file function's sizes and index type, and the compiler for the resolved arch
(:func:`once_resolved`).
"""

from __future__ import annotations

import os

from fastdlight.arch.table import GPUS_BY_TAG
from fastdlight.cli.args import UsageError, one_line, validate_args
from fastdlight.cli.sizes import DEFAULT_TARGET, Tensor, early_memory_bound, op_tensors, too_large
from fastdlight.cli.toolkit import check_target_names_gpu, check_toolkit, target_arch
from fastdlight.compiler.pool import gpu_device_nodes


def _what(args) -> str:
    return args.file if args.file else f"{args.op} {'x'.join(args.shape)}"


def _refuse_too_large(args, tensors: list[Tensor], memory: int, holder: str) -> None:
    why = too_large(tensors, memory, holder) if tensors else None
    if why:
        raise UsageError(f"{_what(args)}: {why}")


def _shown(target: str | None, name: str) -> str:
    return f"--target {target}" if target else name


def before_work(args) -> None:
    """Everything that can be checked without TVM (UsageError: one line, exit status 2)."""
    tensors = validate_args(args)
    if getattr(args, "devices", None):
        args.devices = select_gpu(args.devices, args)
    gpu = gpu_device_nodes()
    _refuse_too_large(args, tensors, *early_memory_bound(args.target, gpu))
    check_target_names_gpu(args.target, gpu)
    if args.target is not None:
        arch = target_arch(args.target)[1]
        check_toolkit(arch, _shown(args.target, arch or ""))
    elif not gpu:  # the default model
        check_toolkit(GPUS_BY_TAG[DEFAULT_TARGET].arch, f"the default {DEFAULT_TARGET}")
    else:  # the live GPU's arch is known once TVM asks it: only the compiler now
        check_toolkit(None, "")


def select_gpu(devices: tuple[int, ...], args) -> tuple[int, ...]:
    """Make ``devices`` this process's GPUs 0, 1, ... (``CUDA_VISIBLE_DEVICES``, counted within
    one the user set), before anything starts CUDA, and return their indices here: the
    operator's first-pass timings go to whichever is free, its finalists all to one. With
    --rpc the remote GPU times, and --devices is refused."""
    if getattr(args, "rpc", None):
        raise UsageError("--devices and --rpc: time on this machine's GPUs or on a remote one, not both")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        parts = [p.strip() for p in visible.split(",") if p.strip()]
        beyond = [d for d in devices if d >= len(parts)]
        if beyond:
            raise UsageError(f"--devices {','.join(map(str, beyond))}: CUDA_VISIBLE_DEVICES={visible} makes "
                             f"{len(parts)} GPU(s) visible")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(parts[d] for d in devices)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    return tuple(range(len(devices)))


def once_resolved(args, arch, func) -> None:
    """The checks that need the resolved ``arch`` (a ``fastdlight.arch.CUDA``) or the loaded
    function: sizes against the GPU's memory, a --file function's int32 indexing, the compiler
    for the arch."""
    if args.file:
        _check_file_function(args, func, arch)
    else:
        _refuse_too_large(args, op_tensors(args.op, [int(d) for d in args.shape], args), arch.dram_bytes,
                          arch.name)
    check_toolkit(arch.arch, _shown(args.target, arch.name))


def _check_file_function(args, func, arch) -> None:
    from fastdlight.analysis.prepare import check_index_range
    from fastdlight.measure.workload import param_buffers, static_shape

    tensors = []
    try:
        check_index_range(func)  # refused here, not after every candidate failed to lower
        for buf in param_buffers(func):
            try:
                tensors.append(Tensor(str(buf.name), static_shape(buf), str(buf.dtype)))
            except ValueError:  # symbolic (--shape-var gives it a value later): not counted
                continue
    except ValueError as e:
        raise UsageError(f"{_what(args)}: {one_line(e)}") from None
    _refuse_too_large(args, tensors, arch.dram_bytes, arch.name)
