"""Programmatic dependent launch (sm_90+): a kernel launched while the one before it on the
stream is still finishing.

A kernel launched with programmatic stream serialization is placed as soon as every CTA of the
kernel before it has exited (or signalled ``griddepcontrol.launch_dependents``), instead of
after that kernel has completed, flushed its writes and the next launch has gone through the
front end; it then waits in ``griddepcontrol.wait`` until the previous kernel has completed and
its writes are visible. What overlaps is the launch and the placement of the CTAs with the
previous kernel's completion: a few hundred nanoseconds a kernel, a part of every kernel's time
in a decode step of 5-20 us kernels (H200, 2026-11-30: a LLaMA-3-8B decode layer 0.122 against
0.130 ms, `docs/benchmarks.md`).

:func:`dependent_launch` is a pass over a lowered module (after the host/device split): every
CUDA kernel for sm_90 or newer gets ``griddepcontrol.wait`` as its first statement, before any
load or store, so that it neither reads what the previous kernel has not yet written nor
overwrites what that kernel still reads, and TVM's launch tag that makes the runtime launch it
with the attribute. A kernel signals ``launch_dependents`` only where its template marks it
(:mod:`fastdlight.schedules.dependency`: where few of its CTAs still work); otherwise its CTAs
release the next kernel by exiting. After a kernel launched without the attribute (torch's,
another library's) the wait returns at once. :func:`without_dependent_launch` drops the marks.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from fastdlight.schedules import dependency

#: TVM's launch tag (its spelling) for programmatic stream serialization
PDL_TAG = "tirx.use_programtic_dependent_launch"
#: the tag that must stay last in a kernel's launch tags (TVM's runtime checks it)
DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"
LAUNCH_PARAMS = "tirx.kernel_launch_params"
#: a kernel launched cooperatively: TVM's runtime takes the dependent-launch tag before this
#: one, so a kernel with both would lose its cooperative launch; it stays as it is
COOPERATIVE_TAG = "tirx.use_cooperative_launch"
#: ``CallingConv::kDeviceKernelLaunch``: a function the split made a kernel
DEVICE_KERNEL_LAUNCH = 2
#: the first GPU generation with ``griddepcontrol``
MIN_SM = 90


@T.prim_func(s_tir=True)
def _wait():
    T.ptx.griddepcontrol.wait()


@T.prim_func(s_tir=True)
def _release():
    T.ptx.griddepcontrol.launch_dependents()


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


def _map_stmts(stmt: tirx.Stmt, fn) -> tirx.Stmt:
    """``stmt`` with ``fn`` applied bottom-up to each statement (``fn`` returns a replacement, or
    None to keep it). Statements nest only in these five kinds (declarations and bindings are
    flat in a sequence); TVM exposes no statement mutator to Python."""
    def kids(*parts):
        return [None if p is None else _map_stmts(p, fn) for p in parts]

    out = stmt
    if isinstance(stmt, tirx.SeqStmt):
        seq = kids(*stmt.seq)
        if any(not a.same_as(b) for a, b in zip(seq, stmt.seq)):
            out = tirx.SeqStmt(seq, stmt.span)
    elif isinstance(stmt, tirx.AttrStmt):
        (body,) = kids(stmt.body)
        if not body.same_as(stmt.body):
            out = tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    elif isinstance(stmt, tirx.For):
        (body,) = kids(stmt.body)
        if not body.same_as(stmt.body):
            out = tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                           stmt.annotations, stmt.step, stmt.span)
    elif isinstance(stmt, tirx.While):
        (body,) = kids(stmt.body)
        if not body.same_as(stmt.body):
            out = tirx.While(stmt.condition, body, stmt.span)
    elif isinstance(stmt, tirx.IfThenElse):
        then, other = kids(stmt.then_case, stmt.else_case)
        if not then.same_as(stmt.then_case) or (other is not None and not other.same_as(stmt.else_case)):
            out = tirx.IfThenElse(stmt.condition, then, other, stmt.span)
    replaced = fn(out)
    return out if replaced is None else replaced


def _with_releases(body: tirx.Stmt, release: bool) -> tirx.Stmt:
    """``body`` with each release mark replaced by ``launch_dependents`` (``release``) or nothing."""
    def replace(stmt):
        if isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == dependency.RELEASE:
            return _release.body if release else tirx.Evaluate(0)
        return None

    return _map_stmts(body, replace)


def with_dependent_launch(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Kernel ``func`` launched as a programmatic dependent, waiting for its predecessor first."""
    tags = [str(t) for t in func.attrs[LAUNCH_PARAMS]]
    if PDL_TAG in tags:
        return func
    if COOPERATIVE_TAG in tags:
        return without_marks(func)
    body = tirx.SeqStmt([_wait.body, _with_releases(func.body, dependency.RELEASE_EARLY)])
    return func.with_body(body).with_attr(LAUNCH_PARAMS, launch_tags(tags))


def without_marks(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Kernel ``func`` as launched plainly: its template's release marks dropped."""
    body = _with_releases(func.body, release=False)
    return func if body.same_as(func.body) else func.with_body(body)


def _launched(mod: tvm.IRModule, dependent: bool) -> tvm.IRModule:
    """A copy of lowered module ``mod`` (a pass leaves its input as it was): with ``dependent``,
    every sm_90+ kernel a programmatic dependent; every other function's release marks dropped."""
    mod = mod.clone()
    for gvar, func in list(mod.functions_items()):
        if dependent and is_kernel(func) and supports(func.attrs.get("target")):
            mod.update_func(gvar, with_dependent_launch(func))
        elif isinstance(func, tirx.PrimFunc):
            mod.update_func(gvar, without_marks(func))
    return mod


@tvm.transform.module_pass(opt_level=0, name="fastdlight.DependentLaunch")
def dependent_launch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every sm_90+ kernel of lowered module ``mod`` launched as a programmatic dependent."""
    return _launched(mod, dependent=True)


@tvm.transform.module_pass(opt_level=0, name="fastdlight.WithoutDependentLaunch")
def without_dependent_launch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Lowered module ``mod`` with its kernels launched plainly (the templates' marks dropped)."""
    return _launched(mod, dependent=False)
