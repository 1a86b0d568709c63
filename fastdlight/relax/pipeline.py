"""One Relax pipeline in which the tuned PrimFuncs are exactly what runs.

    mod = relax.transform.BindParams("main", params)(mod)   # weights as constants (optional)
    ex, report = fastdlight.relax.compile_model(mod, target, topk=20, meta_database_dir="tuned/")

or, step by step (what ``compile_model`` does):

    mod = prepare(target)(mod)                    # legalize, fold constants, fuse: once
    mod = ApplyFastTuning(target=target, ...)(mod)
    ex = build(mod, target)                       # leftovers on stock Dlight, then lower; no re-fusion

``tvm.compile`` with its default pipeline legalizes and fuses *again*: on an already fused
module FuseOps merges the tuned functions into new ones (ResNet's ``fused_fused_conv2d...``), which
Dlight then schedules, and the tuned kernels never run. :func:`build` runs only what comes after
fusion. :func:`prepare` computes weight layout changes (``permute_dims`` of a bound weight,
reshapes, casts) once at compile time instead of at every call: with numpy where it can
(``constants.fold_weight_layouts``), the rest with TVM's ``FoldConstant``.
"""

from __future__ import annotations

import os

import tvm
from tvm import relax, s_tir, tirx
from tvm.ir import IRModule
from tvm.relax.backend.cuda import pipeline as cuda_pipeline

from fastdlight.compiler.build_task import compile_threads, install_compile_callback
from fastdlight.compiler.compile import PASS_CONFIG, as_target, tir_pipeline
from fastdlight.compiler.compile import build as build_prim_funcs
from fastdlight.relax.aligned import tma_aligned_matmuls
from fastdlight.relax.apply_fast_tuning import ApplyFastTuning
from fastdlight.relax.attention import unguarded_softmax
from fastdlight.relax.compat import (
    bool_cumsums,
    float_inputs,
    for_mixed_precision,
    identity_casts,
    scalar_constant_casts,
    squeeze_axes,
)
from fastdlight.relax.constants import fold_weight_layouts, input_independent_values
from fastdlight.relax.convs import im2col_convs, pointwise_convs
from fastdlight.relax.decode import decode_weight_layout
from fastdlight.relax.decode_attention import decode_attention
from fastdlight.relax.fuse_attention import fused_attention
from fastdlight.relax.gated import gated_projections
from fastdlight.relax.reshapes import merge_reshapes, output_reshape_views, sink_reshapes
from fastdlight.relax.rewrites import (
    causal_masks,
    exact_integer_powers,
    fp16_outputs,
    rms_norms,
    softmax_of_fp16,
)
from fastdlight.relax.views import fold_views


def for_inference(mod: IRModule, params=None, *, fp16: bool = True, layout: str | None = "auto",
                  fp16_io: bool = False) -> IRModule:
    """An exported model made ready for inference: ``params`` (values of ``main``'s trailing
    parameters, e.g. from ``relax.frontend.detach_params``) bound as constants, so
    :func:`prepare` folds their layout changes once; BatchNorm decomposed into elementwise ops
    (which fuse into the convolution); ``fp16``: fp16 compute with fp32 accumulation in matmuls
    and convolutions (``ToMixedPrecision``), as torch's fp16 GEMMs do; the reshapes around
    matmuls moved out of the way of fusion (:func:`.reshapes.sink_reshapes`).

    ``layout``: ``"NHWC"`` puts convolutions in NHWC with OHWI weights (layout changes only at
    the model's edges; the weights' are folded), which the tensor-core convolution template
    takes; ``None`` keeps them as exported; ``"auto"`` (default) is ``"NHWC"`` for fp16 models
    with NCHW convolutions, else ``None``.

    ``fp16_io`` (with ``fp16``): ``main`` takes its fp32 inputs (the parameters not bound) and
    returns its fp32 results in fp16, as a ``.half()`` torch model does, instead of the exported
    fp32 (which costs a cast kernel per input and fp32 writes of the results). Integer and
    boolean inputs (token ids, masks) keep their dtype."""
    if layout not in ("auto", "NHWC", None):
        raise ValueError(f"layout must be 'auto', 'NHWC' or None, got {layout!r}")
    if fp16_io and not fp16:
        raise ValueError("fp16_io=True needs fp16=True: an fp32 model has no fp16 values to take or return")
    if layout == "auto":
        layout = "NHWC" if fp16 and _has_nchw_conv(mod) else None
    passes = []
    if params:
        main_params = mod["main"].params
        params = [_on_host(p) for p in params]  # the graph rewrites hash constants: host copies only
        passes.append(relax.transform.BindParams("main", dict(zip(main_params[len(main_params) - len(params):],
                                                                  params))))
    passes.append(relax.transform.DecomposeOpsForInference())
    passes.append(bool_cumsums())  # TVM's GPU cumsum misaligns bool vectors
    # before ToMixedPrecision, whose cast of the exponent hides the constant from prepare's
    passes.append(exact_integer_powers())
    passes.append(input_independent_values())  # attention masks from positions: constants
    passes.append(unguarded_softmax())  # SDPA's guard against rows masked whole, where none is
    if fp16:
        inputs = float_inputs(mod["main"], len(mod["main"].params) - len(params or []))
        passes.append(for_mixed_precision())  # clip's bounds and the like, which ToMixedPrecision rejects
        passes.append(relax.transform.ToMixedPrecision(out_dtype="float32", fp16_input_names=inputs if fp16_io else None))
        passes.append(identity_casts())
        passes.append(scalar_constant_casts())  # immediates in the kernels, not 0-d inputs
        if fp16_io:
            passes.append(fp16_outputs())
    passes.append(rms_norms())  # after ToMixedPrecision, which leaves the decomposed norm in fp32
    passes.append(sink_reshapes())  # after the casts ToMixedPrecision adds: they fuse too
    if layout == "NHWC":
        passes.append(squeeze_axes())  # ConvertLayout fails on negative ones
        passes.append(relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]}))
    passes.append(im2col_convs())  # NHWC convolutions of 3-channel images, as GEMMs
    passes.append(pointwise_convs())  # 1x1 convolutions, as GEMMs
    passes.append(sink_reshapes())  # the im2col GEMM's reshape below its epilogue
    return tvm.transform.Sequential(passes)(mod)


def _on_host(param):
    """``param`` as a host tensor (a copy where it lives on a GPU)."""
    if isinstance(param, tvm.runtime.Tensor) and param.device.dlpack_device_type() != tvm.cpu().dlpack_device_type():
        return tvm.runtime.tensor(param.numpy())
    return param


def _has_nchw_conv(mod: IRModule) -> bool:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d":
            found.append(str(expr.attrs.data_layout) == "NCHW")

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return any(found)


def prepare(target, *, fuse_attention: bool = True) -> tvm.transform.Pass:
    """Library dispatch, LegalizeOps, FoldConstant, FuseOps, FuseTIR: the module ApplyFastTuning
    should see (what TVM's CUDA pipeline does before it schedules). ``fuse_attention=False``
    leaves attention as matmuls and a softmax (as on GPUs without the fused template)."""
    target = as_target(target)
    return _scoped(target, [
        *cuda_pipeline.library_dispatch_passes(target),
        exact_integer_powers(),
        # before the matmul rewrites, which would pad P @ V where TKV is no multiple of 8
        *([fused_attention(target)] if fuse_attention else []),  # where the fused template takes it
        *([decode_attention(target)] if fuse_attention else []),  # a symbolic cache length: split-KV
        *([merge_reshapes()] if fuse_attention else []),  # the replaced matmuls' reshapes, undone
        tma_aligned_matmuls(target),  # where the target has wgmma: K padded to whole 16-byte rows
        gated_projections(target),  # where the target has wgmma: gate and up as one GEMM
        decode_weight_layout(),  # decode steps' projections read their weights [N, K]: GEMVs
        causal_masks(),  # before softmax_of_fp16, which then finds the widened scores
        softmax_of_fp16(),
        fold_weight_layouts(),  # what FoldConstant would compile for the host, one by one
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        fold_views(target),  # where the target has wgmma: matmuls read attention's heads in place
        relax.transform.DeadCodeElimination(),
    ], "fastdlight.prepare")  # fmt: skip


def leftovers() -> tvm.transform.Pass:
    """Stock Dlight for every PrimFunc not yet scheduled (``tirx.is_scheduled`` ones are kept),
    one function at a time: a rule that raises on a function (Dlight's Matmul asserts on a
    matmul reading attention's heads in place, which ``prepare`` makes on Hopper) leaves it to
    the Fallback rule instead of failing the build."""
    from tvm.s_tir import dlight as dl

    rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
             dl.gpu.Fallback())

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.Leftovers")
    def run(mod: IRModule, _ctx) -> IRModule:
        updated = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and "tirx.is_scheduled" in func.attrs):
                continue
            one = IRModule({gv: func})
            try:
                updated[gv] = dl.ApplyDefaultSchedule(*rules)(one)[gv]
            except Exception:  # noqa: BLE001 - a rule's failure: the last rule alone
                updated[gv] = dl.ApplyDefaultSchedule(rules[-1])(one)[gv]
        if not updated:
            return mod
        mod = mod.clone()
        for gv, func in updated.items():
            mod[gv] = func
        return mod

    return run


def reshape_views_past_kernels(rewrite: tvm.transform.Pass) -> tvm.transform.Pass:
    """TVM's RewriteDataflowReshape (``rewrite``), safe for hand-written kernels: it asks every
    PrimFunc that reads one tensor whether it is a reshape, and TVM 0.27 then requires a root
    block, which a kernel written in TIRx (fused attention on a packed QKV input) has not. Such
    functions are shown to the pass wrapped in a root block (no reshape, so no call changes) and
    put back after it."""

    @tvm.transform.module_pass(opt_level=0, name="fastdlight.ReshapeViewsPastKernels")
    def run(mod: IRModule, _ctx) -> IRModule:
        kernels = {gv: f for gv, f in mod.functions_items()
                   if isinstance(f, tirx.PrimFunc) and not isinstance(f.body, s_tir.SBlockRealize)}
        if not kernels:
            return rewrite(mod)
        shown = mod.clone()
        for gv, func in kernels.items():
            root = s_tir.SBlock([], [], [], "root", func.body)
            shown[gv] = func.with_body(s_tir.SBlockRealize([], True, root))
        out = rewrite(shown)
        for gv, func in kernels.items():
            if gv in out.functions:
                out[gv] = func
        return out

    return run


def lowering(target) -> tvm.transform.Pass:
    """After tuning: leftovers on stock Dlight, then TVM's dataflow lowering and finalization
    (memory planning, CUDA graph rewriting, VM lowering); nothing that fuses or reschedules."""
    target = as_target(target)
    return _scoped(target, [
        relax.transform.LegalizeOps(),  # a no-op on a prepared module: ops added after prepare
        leftovers(),
        output_reshape_views(),  # then RewriteDataflowReshape makes the outputs' reshapes views too
        *[reshape_views_past_kernels(p) if p.info.name == "RewriteDataflowReshape" else p
          for p in cuda_pipeline.dataflow_lower_passes(target)],
        *cuda_pipeline.finalize_passes(target),
    ], "fastdlight.lowering")  # fmt: skip


def tuning_pipeline(target, tuning: ApplyFastTuning) -> tvm.transform.Pass:
    """prepare → tuning → lowering, as one ``relax_pipeline`` for ``tvm.compile``."""
    return tvm.transform.Sequential([prepare(target), tuning, lowering(target)], name="fastdlight.pipeline")


def build(mod: IRModule, target) -> tvm.runtime.Module:
    """Compile a tuned module: Relax functions go through :func:`lowering` (no re-fusion), every
    PrimFunc keeps the schedule it has; a module of PrimFuncs only is built as it is."""
    target = as_target(target)
    install_compile_callback()  # the kernels that run are compiled as the tuner compiled them
    # one module holds every kernel: optimized on all the CPUs this process may use
    with compile_threads(len(os.sched_getaffinity(0))):
        if not has_relax_functions(mod):
            return build_prim_funcs(mod, target)
        with target, tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
            return tvm.compile(mod, target=target, relax_pipeline=lowering(target), tir_pipeline=tir_pipeline(mod))


def compile_model(mod: IRModule, target=None, *, tuning: ApplyFastTuning | None = None, **tune_kwargs):
    """prepare → ApplyFastTuning → build. Returns ``(executable, tuned module, report)``.
    ``tuning`` (or the keywords of :class:`ApplyFastTuning`) says how to tune."""
    if tuning is None:
        tuning = ApplyFastTuning(target=target, **tune_kwargs)
    elif tune_kwargs:
        raise TypeError("give either tuning= or ApplyFastTuning keywords, not both")
    arch = tuning.arch()
    prepared = prepare(arch.target)(mod)
    tuned = tuning(prepared)
    return build(tuned, arch.target), tuned, tuning.report


def has_relax_functions(mod: IRModule) -> bool:
    return any(isinstance(f, relax.Function) for _, f in mod.functions_items())


def prim_funcs(mod: IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def _scoped(target, passes, name: str) -> tvm.transform.Pass:
    seq = tvm.transform.Sequential(passes, name=name)

    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod: IRModule, _ctx) -> IRModule:
        with target:
            return seq(mod)

    return run
