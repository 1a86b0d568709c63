"""Programmatic dependent launch (sm_90+): each kernel may start while the one before it on the
stream is still finishing.

A kernel launched with programmatic stream serialization is scheduled as soon as every CTA of
the kernel before it has signalled ``griddepcontrol.launch_dependents`` (or exited), instead of
after that kernel has finished and the launch has gone through the front end. It then waits in
``griddepcontrol.wait`` until the previous kernel has completed and its writes are visible. So
the launch, the CTAs' placement and whatever a kernel does before its first access to global
memory overlap the previous kernel's last CTAs: for a decode step of kernels of 5-20 us each,
the gap between two kernels is a part of every kernel's time.

:func:`dependent_launch` is a device-module pass run after the host/device split: every CUDA
kernel for sm_90 or newer gets ``griddepcontrol.wait`` as its first statement (before any load
or store, so it neither reads what the previous kernel has not yet written nor overwrites what
that kernel still reads), then ``griddepcontrol.launch_dependents`` (the next kernel may be placed
now; it waits in its turn), and TVM's launch tag that makes the runtime launch it with the
attribute. A kernel after a kernel launched without it (torch's, another library's) still starts
only when that kernel has exited; both instructions are no-ops without the attribute.
"""

from __future__ import annotations

import functools

import tvm
from tvm import tirx
from tvm.script import tirx as T

#: TVM's launch tag (its spelling) for programmatic stream serialization
PDL_TAG = "tirx.use_programtic_dependent_launch"
#: the tag that must stay last in a kernel's launch tags (TVM's runtime checks it)
DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"
LAUNCH_PARAMS = "tirx.kernel_launch_params"
#: ``CallingConv::kDeviceKernelLaunch``: a function the split made a kernel
DEVICE_KERNEL_LAUNCH = 2
#: the first GPU generation with ``griddepcontrol``
MIN_SM = 90


@T.prim_func(s_tir=True)
def _wait_then_release():
    T.ptx.griddepcontrol.wait()
    T.ptx.griddepcontrol.launch_dependents()


@T.prim_func(s_tir=True)
def _wait():
    T.ptx.griddepcontrol.wait()


#: the kernel's first statements: wait for the predecessor, then either let the successor be
#: placed at once ("early") or leave it to be placed as the kernel's CTAs exit ("wait")
PROLOGUES = {"early": _wait_then_release, "wait": _wait}


def supports(target) -> bool:
    """Does ``target`` (a CUDA target) have ``griddepcontrol``?"""
    if target is None or target.kind.name != "cuda":
        return False
    arch = str(target.attrs.get("arch", ""))
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return bool(digits) and int(digits) >= MIN_SM


def is_kernel(func) -> bool:
    attrs = func.attrs
    return (isinstance(func, tirx.PrimFunc) and attrs is not None and LAUNCH_PARAMS in attrs
            and int(attrs.get("calling_conv", 0)) == DEVICE_KERNEL_LAUNCH)


def launch_tags(tags) -> list[str]:
    """``tags`` with the dependent-launch tag added before the dynamic-shared-memory one."""
    tags = [str(t) for t in tags]
    if PDL_TAG in tags:
        return tags
    at = tags.index(DYN_SMEM_TAG) if DYN_SMEM_TAG in tags else len(tags)
    return tags[:at] + [PDL_TAG] + tags[at:]


def with_dependent_launch(func: tirx.PrimFunc, mode: str = "wait") -> tirx.PrimFunc:
    """Kernel ``func`` waiting for its predecessor first (:data:`PROLOGUES`)."""
    tags = [str(t) for t in func.attrs[LAUNCH_PARAMS]]
    if PDL_TAG in tags:
        return func
    body = tirx.SeqStmt([PROLOGUES[mode].body, func.body])
    return func.with_body(body).with_attr(LAUNCH_PARAMS, launch_tags(tags))


def dependent_launch(mode: str = "wait") -> tvm.transform.Pass:
    """Every sm_90+ kernel of a lowered module launched as a programmatic dependent."""

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.DependentLaunch")
    def run(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()  # a pass leaves its input as it was
        for gvar, func in list(mod.functions_items()):
            if is_kernel(func) and supports(func.attrs.get("target")):
                mod.update_func(gvar, with_dependent_launch(func, mode))
        return mod

    return run
