"""What the command line tunes: the operator or the TVMScript file's PrimFunc, and the GPU
(or hardware model) it is tuned for."""

from __future__ import annotations

import contextlib
import io
import os

from fastdlight.cli.args import UsageError, one_line, parse_dims
from fastdlight.cli.sizes import DEFAULT_TARGET, matmul_layout
from fastdlight.cli.toolkit import check_target_names_gpu


def make_op(args):
    """The :class:`fastdlight.ops.Op` the arguments (checked by ``validate_args``) describe."""
    from fastdlight import ops

    d = parse_dims(args.op, args.shape)
    try:
        if args.op == "matmul" and args.weight_dtype:
            make = ops.matmul_int8 if args.weight_dtype == "int8" else ops.matmul_int4
            return make(*d, group_size=args.group_size, dtype=args.dtype, zero_point=args.zero_point)
        if args.op == "matmul" and args.scales:
            return ops.matmul_scaled(*d, dtype=args.dtype, out_dtype=args.out_dtype or "float16", scales=args.scales)
        if args.op == "matmul":
            return ops.matmul(*d, dtype=args.dtype, out_dtype=args.out_dtype, layout=matmul_layout(args),
                              batch=args.batch)
        if args.op == "gemv":
            return ops.gemv(d[0], d[1], m=args.m, dtype=args.dtype, out_dtype=args.out_dtype)
        if args.op in ("add", "copy", "bias_relu"):
            return ops.elementwise(d, args.dtype, args.op)
        if args.op in ("sum", "max"):
            return ops.reduce(d, args.dtype, args.op, axis=args.axis)
        if args.op == "softmax":
            return ops.softmax(*d, dtype=args.dtype)
        if args.op == "attention":
            return ops.attention(*d, kv_heads=args.kv_heads, causal=args.causal, dtype=args.dtype)
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
    check_target_names_gpu(target, gpu)  # else TVM says sm_50, which CUDA 13 cannot build
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


def make_workload(args):
    """(name, func, numpy reference or None, flops, bytes, memory_bound, opt_shapes)."""
    if args.file:
        fname, func = load_primfunc(args.file, args.func)
        return fname, func, None, None, None, True, dict(args.shape_var) or None
    op = make_op(args)
    return op.name, op.func, op.reference, op.flops, op.bytes, op.memory_bound, None


def func_bytes(func, fname: str) -> int:
    from fastdlight.measure.workload import params_bytes

    try:
        return params_bytes(func)
    except ValueError as e:
        raise UsageError(f"cannot tune {fname}: {one_line(e)}") from None


def decode_attention_steps(args, arch) -> list[tuple[str, object]]:
    """For ``tune attention`` of a decode size (one query token, or a few non-causal ones): the
    functions a model's attention of these sizes runs after ``prepare`` (the split-KV chunk step,
    merged by its last CTA of each K/V head, or the step and a merge kernel: ``fuse_attention``'s
    rule, :func:`~fastdlight.analysis.decode_attention.decode_of`, at this GPU's SM count), as
    (name, PrimFunc); empty for any other workload, which is tuned as it is."""
    if args.file or args.op != "attention":
        return []
    import dataclasses

    from fastdlight.analysis.decode_attention import TICKETS, decode_combine_func, decode_of, decode_split_func
    from fastdlight.measure.inputs import INPUT_VALUES
    from fastdlight.relax.split_kv import merge_form, merges_in_step

    batch, heads, seq_q, seq_kv, head_dim = parse_dims(args.op, args.shape)
    kv_heads = args.kv_heads or heads
    shape = decode_of(batch, kv_heads, heads // kv_heads, seq_q, head_dim, args.causal, 0.0, args.dtype,
                      arch.sm_count)
    if shape is None:
        return []
    shape = dataclasses.replace(shape, merged=merges_in_step(shape, merge_form()))
    step = decode_split_func(shape, seq_kv)
    if shape.merged:  # the tickets start at zero, as the model's constant holds them
        return [("decode_attention", step.with_attr(INPUT_VALUES, {TICKETS: 0.0}))]
    return [("decode_attention", step), ("decode_combine", decode_combine_func(shape))]
