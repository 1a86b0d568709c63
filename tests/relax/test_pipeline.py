"""fastdlight's Relax pipeline: the tuned PrimFuncs are exactly what the build runs, weight
layout changes are folded at compile time, structurally equal functions are tuned once (CPU)."""

import contextlib
import os
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.s_tir import dlight as dl
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import fastdlight
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.relax import apply_fast_tuning, for_inference, lowering, pipeline, prepare
from fastdlight.relax.pipeline import leftovers, prim_funcs
from fastdlight.relax.rewrites import causal_masks, rms_norms, softmax_of_fp16
from fastdlight.schedules import apply_config

H100 = CUDA("nvidia/nvidia-h100")


@I.ir_module
class Linear:
    """A torch-style linear layer: weight stored [out, in], transposed in the graph."""

    @R.function
    def main(x: R.Tensor((64, 128), "float16"), w: R.Tensor((256, 128), "float16"), b: R.Tensor((256,), "float16")):
        with R.dataflow():
            wt = R.permute_dims(w)
            y = R.add(R.matmul(x, wt), b)
            z = R.nn.gelu(y)
            s = R.sum(z, axis=[1])
            R.output(s)
        return s


@pytest.fixture(scope="module")
def tuned():
    mod = prepare(H100.target)(Linear)
    tuning = fastdlight.ApplyFastTuning(topk=1, target=H100, measure=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mod, tuning(mod), tuning.report


def test_the_tuned_functions_are_what_the_build_runs(tuned):
    prepared, out, report = tuned
    names = {e.function for e in report if e.status == "tuned"}
    assert names == set(prim_funcs(prepared))  # every function tuned, none untuned
    lowered = lowering(H100.target)(out)
    for name in names:
        # the lowering adds a global symbol, nothing else: the schedule is the tuned one
        assert tvm_ffi.structural_equal(lowered[name].body, out[name].body), name
    src = cuda_source(fastdlight.build(out, H100.target))
    for name in names:
        assert f"{name}_kernel" in src


def test_a_models_build_compiles_its_kernels_on_every_cpu_it_may_use(tuned, monkeypatch):
    """The module of a model holds all its kernels; the build optimizes them at a time."""
    asked = []

    @contextlib.contextmanager
    def recorded(threads):
        asked.append(threads)
        yield

    monkeypatch.setattr(pipeline, "compile_threads", recorded)
    assert "_kernel" in cuda_source(fastdlight.build(tuned[1], H100.target))
    assert asked == [len(os.sched_getaffinity(0))]


def test_tvm_default_pipeline_would_refuse_and_reschedule(tuned):
    """Why fastdlight.build exists: TVM's legalize passes on a tuned module change its functions."""
    _, out, _ = tuned
    with H100.target:
        again = tvm.transform.Sequential(tvm.relax.backend.cuda.pipeline.legalize_passes(H100.target))(out)
    changed = [n for n, f in prim_funcs(out).items()
               if n not in prim_funcs(again) or not tvm_ffi.structural_equal(prim_funcs(again)[n], f)]
    assert changed or set(prim_funcs(again)) != set(prim_funcs(out))


def test_bound_weight_transposes_are_folded_at_compile_time():
    w = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((256, 128)).astype("float16"))
    mod = relax.transform.BindParams("main", {"w": w})(Linear)
    prepared = prepare(H100.target)(mod)
    assert not any("transpose" in name for name in prim_funcs(prepared)), list(prim_funcs(prepared))
    unbound = prepare(CUDA("nvidia/nvidia-a100").target)(Linear)
    assert any("transpose" in name for name in prim_funcs(unbound))  # a kernel at every call
    # with wgmma the matmul reads the unbound weight as it is (K-major), no copy
    assert not any("transpose" in name for name in prim_funcs(prepare(H100.target)(Linear)))


@T.prim_func(private=True, s_tir=True)
def _exp(a: T.Buffer((1024,), "float32"), b: T.Buffer((1024,), "float32")):
    for i in range(1024):
        with T.sblock("b"):
            vi = T.axis.spatial(1024, i)
            b[vi] = T.exp(a[vi])


def test_structurally_equal_functions_are_tuned_once(monkeypatch):
    mod = tvm.IRModule({"exp_a": _exp, "exp_b": _exp.with_attr("tirx.noalias", True).without_attr("tirx.noalias")})
    calls = []
    real = apply_fast_tuning.tune_function

    def counting(func, *args, **kwargs):
        calls.append(func)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(apply_fast_tuning, "tune_function", counting)
    tuning = fastdlight.ApplyFastTuning(topk=1, target=H100, measure=False)
    out = tuning(mod)
    assert len(calls) == 1
    by_name = {e.function: e for e in tuning.report}
    assert by_name["exp_b"].same_as == "exp_a" and by_name["exp_b"].config == by_name["exp_a"].config
    assert all(isinstance(f, tirx.PrimFunc) and f.attrs["tirx.is_scheduled"] for f in prim_funcs(out).values())


@I.ir_module
class Powers:
    @R.function
    def main(x: R.Tensor((64, 128), "float32")):
        with R.dataflow():
            sq = R.power(x, R.const(2.0, "float32"))
            cube = R.power(x, R.const(3.0, "float32"))
            root = R.power(x, R.const(0.5, "float32"))
            out = R.add(R.add(sq, cube), root)
            R.output(out)
        return out


def test_integer_powers_become_products_so_negative_bases_stay_finite():
    prepared = prepare(H100.target)(Powers)
    scripts = "\n".join(f.script() for f in prim_funcs(prepared).values())
    # fast-math powf(x, 2) is NaN for x < 0: only the non-integer exponent keeps pow
    assert scripts.count("T.pow(") == 1 and "T.float32(0.5)" in scripts
    assert "T.float32(2.0)" not in scripts and "T.float32(3.0)" not in scripts


def conv_model():
    @I.ir_module
    class Conv:
        @R.function
        def main(x: R.Tensor((1, 16, 8, 8), "float32"), w: R.Tensor((32, 16, 3, 3), "float32")):
            with R.dataflow():
                y = R.nn.relu(R.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
                R.output(y)
            return y

    return Conv


def conv_layouts(mod) -> list[str]:
    out = []
    relax.analysis.post_order_visit(mod["main"], lambda e: out.append(str(e.attrs.data_layout))
                                    if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d"
                                    else None)
    return out


def test_fp16_nchw_convolutions_go_nhwc_by_default_and_stay_when_asked():
    mod = conv_model()
    assert conv_layouts(for_inference(mod)) == ["NHWC"]  # "auto": tensor-core convolutions take NHWC
    assert conv_layouts(for_inference(mod, layout=None)) == ["NCHW"]
    assert conv_layouts(for_inference(mod, fp16=False)) == ["NCHW"]  # fp32 CUDA-core convs: as exported
    with pytest.raises(ValueError, match="layout must be"):
        for_inference(mod, layout="NCWH")
    # the model keeps its interface: NCHW in, NCHW out (the layout changes sit at its edges)
    main = for_inference(mod)["main"]
    assert [int(d) for d in main.params[0].ty.shape] == [1, 16, 8, 8]
    assert [int(d) for d in main.ret_ty.shape] == [1, 32, 8, 8]


def test_softmax_of_fp16_scores_reads_them_in_fp16_with_the_same_values():
    @I.ir_module
    class Attention:
        @R.function
        def main(q: R.Tensor((2, 16, 8), "float16"), k: R.Tensor((2, 8, 16), "float16"),
                 mask: R.Tensor((16, 16), "float32")):
            with R.dataflow():
                s = R.matmul(q, k, out_dtype="float16")
                p = R.nn.softmax(R.astype(s, "float32"), axis=-1)
                m = R.nn.softmax(R.add(R.astype(s, "float32"), mask), axis=-1)
                out = (p, m)
                R.output(out)
            return out

    rewritten = softmax_of_fp16()(Attention)
    calls = op_names(rewritten)
    assert "relax.nn.softmax" not in calls and "relax.astype" not in calls  # both became one fp16-in function
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(dtype) for shape, dtype in
            (((2, 16, 8), "float16"), ((2, 8, 16), "float16"), ((16, 16), "float32"))]
    outs = [run_on_cpu(mod, args) for mod in (Attention, rewritten)]
    for want, got in zip(*outs):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_decomposed_rms_norm_becomes_one_op_with_the_same_values():
    @I.ir_module
    class Norm:
        @R.function
        def main(x: R.Tensor((2, 8, 64), "float32"), w: R.Tensor((64,), "float32")):
            with R.dataflow():
                inv = R.rsqrt(R.add(R.mean(R.power(x, R.const(2.0, "float32")), axis=[-1], keepdims=True),
                                    R.const(1e-6, "float32")))
                a = R.multiply(R.multiply(x, inv), w)
                inv2 = R.rsqrt(R.add(R.mean(R.multiply(a, a), axis=[-1], keepdims=True), R.const(1e-5, "float32")))
                b = R.multiply(R.multiply(a, inv2), w)
                R.output(b)
            return b

    rewritten = rms_norms()(Norm)
    ops = op_names(rewritten)
    assert ops.count("relax.nn.rms_norm") == 2 and "relax.mean" not in ops
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 8, 64)).astype("float32"), rng.standard_normal(64).astype("float32")]
    outs = [run_on_cpu(mod, args) for mod in (Norm, rewritten)]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


def op_names(mod) -> list[str]:
    """The op of every call in ``main``."""
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(getattr(e.op, "name", ""))
                                    if isinstance(e, relax.Call) else None)
    return names


def run_on_cpu(mod, args):
    """``main``'s outputs (numpy; a tuple as a list) from an LLVM build."""
    out = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in args])
    return out.numpy() if hasattr(out, "numpy") else [t.numpy() for t in out]



def test_fp16_io_takes_and_returns_fp16_with_the_same_values():
    @I.ir_module
    class Mlp:
        @R.function
        def main(x: R.Tensor((16, 32), "float32"), w: R.Tensor((64, 32), "float32")):
            with R.dataflow():
                y = R.nn.gelu(R.matmul(x, R.permute_dims(w)))
                out = (y, R.sum(y, axis=[1]))
                R.output(out)
            return out

    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype("float16") for s in ((16, 32), (64, 32)))
    exported = for_inference(Mlp, [tvm.runtime.tensor(w.astype("float32"))])
    half = for_inference(Mlp, [tvm.runtime.tensor(w.astype("float32"))], fp16_io=True)
    main = half["main"]
    assert [str(p.ty.dtype) for p in main.params] == ["float16"]  # the bound weight is no input
    assert [str(f.dtype) for f in main.ret_ty.fields] == ["float16", "float16"]
    assert [str(f.dtype) for f in exported["main"].ret_ty.fields] == ["float32", "float32"]
    assert op_names(half).count("relax.astype") < op_names(exported).count("relax.astype")
    with pytest.raises(ValueError, match="fp16_io=True needs fp16=True"):
        for_inference(Mlp, fp16=False, fp16_io=True)
    want = run_on_cpu(exported, [x.astype("float32")])
    got = run_on_cpu(half, [x])
    assert got[0].dtype == got[1].dtype == np.float16
    np.testing.assert_array_equal(got[0].astype("float32"), want[0])  # the fp32 result was this fp16 value, widened
    np.testing.assert_array_equal(got[1], want[1].astype("float16"))  # the sum, computed in fp32, then narrowed


def test_an_rms_norm_of_an_fp16_input_is_one_op_on_the_fp16_values():
    """What ``ToMixedPrecision`` leaves when the model's input is fp16 (``fp16_io``): squared in
    fp16 under a cast exponent, widened for the mean and the scaling."""
    @I.ir_module
    class Norm:
        @R.function
        def main(x: R.Tensor((2, 8, 64), "float16"), w: R.Tensor((64,), "float32")):
            with R.dataflow():
                square = R.astype(R.power(x, R.astype(R.const(2.0, "float32"), "float16")), "float32")
                inv = R.rsqrt(R.add(R.mean(square, axis=[-1], keepdims=True), R.const(1e-6, "float32")))
                y = R.astype(R.multiply(R.multiply(R.astype(x, "float32"), inv), w), "float16")
                R.output(y)
            return y

    rewritten = rms_norms()(Norm)
    ops = op_names(rewritten)
    assert ops.count("relax.nn.rms_norm") == 1 and "relax.mean" not in ops and "relax.power" not in ops
    norm = next(e for e in _calls(rewritten) if e.op.name == "relax.nn.rms_norm")
    assert str(norm.args[0].ty.dtype) == "float16"  # no widened copy of the input to compute first
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 8, 64)).astype("float16"), rng.standard_normal(64).astype("float32")]
    args[1] = args[1].astype("float16").astype("float32")  # the rewrite narrows the weight
    outs = [run_on_cpu(mod, args).astype("float32") for mod in (Norm, rewritten)]
    np.testing.assert_allclose(outs[1], outs[0], rtol=2e-3, atol=2e-3)


def _calls(mod) -> list:
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return calls


def causal_attention(mask: np.ndarray):
    """Scores of two heads plus a bound constant mask, then softmax, as torch.export leaves them."""

    @I.ir_module
    class Scores:
        @R.function
        def main(q: R.Tensor((2, 128, 64), "float16"), kt: R.Tensor((2, 64, 128), "float16"),
                 mask: R.Tensor((128, 128), "float16")):
            with R.dataflow():
                s = R.astype(R.matmul(q, kt, out_dtype="float32"), "float16")
                p = R.nn.softmax(R.astype(R.add(s, mask), "float32"), axis=-1)
                R.output(p)
            return p

    return relax.transform.BindParams("main", {"mask": tvm.runtime.tensor(mask)})(Scores)


def test_a_causal_mask_is_computed_from_the_indices_with_the_same_values():
    causal = np.triu(np.full((128, 128), -1e4, "float16"), 1)
    mod = causal_attention(causal)
    rewritten = causal_masks()(mod)
    assert "relax.add" not in op_names(rewritten)
    assert not any(isinstance(e, tvm.ir.expr.Constant) and len(e.ty.shape) == 2 for e in _calls_args(rewritten))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 128, 64)).astype("float16"), rng.standard_normal((2, 64, 128)).astype("float16")]
    np.testing.assert_array_equal(run_on_cpu(rewritten, args), run_on_cpu(mod, args))
    # any other constant stays an add: not triangular, or zero above the diagonal
    for other in (np.tril(np.full((128, 128), -1e4, "float16"), -1), np.zeros((128, 128), "float16"),
                  causal + np.eye(128, dtype="float16")):
        assert "relax.add" in op_names(causal_masks()(causal_attention(other)))


def test_the_causal_scores_stay_on_the_wgmma_template_with_nothing_but_the_operands_to_read():
    mod = prepare(H100.target)(causal_attention(np.triu(np.full((128, 128), -1e4, "float16"), 1)))
    (name, func), = [(n, f) for n, f in prim_funcs(mod).items() if n.startswith("fused_matmul")]
    assert "causal" in name and len(func.params) == 3  # q, k^T, the scores: no mask
    config = next(c for s in candidate_sets(func, H100, 8) for c in s.configs if c.kind == "matmul_wgmma")
    with H100.target:
        kernel = apply_config(func, config)
    src = cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))
    assert "wgmma.mma_async" in src and compile_cubin(src, H100.target).spill_bytes == 0


def _calls_args(mod) -> list:
    return [a for e in _calls(mod) for a in e.args]


def test_a_stock_rule_that_raises_leaves_its_function_to_the_fallback_rule(monkeypatch):
    @I.ir_module
    class Mm:
        @R.function
        def main(a: R.Tensor((64, 32), "float32"), b: R.Tensor((32, 16), "float32")):
            with R.dataflow():
                c = R.matmul(a, b)
                R.output(c)
            return c

    target = CUDA("nvidia/nvidia-h100").target
    mod = prepare(target)(Mm)

    def broken(self, func, target, _):
        raise AssertionError  # Dlight's Matmul on a matmul reading attention's heads in place

    monkeypatch.setattr(dl.gpu.Matmul, "apply", broken)
    with target:
        scheduled = leftovers()(mod)
    (func,) = prim_funcs(scheduled).values()
    assert any(isinstance(n, tirx.For) and n.kind == tirx.ForKind.THREAD_BINDING
               for n in _walk(func.body)), "scheduled by the Fallback rule"


def _walk(stmt) -> list:
    found = []
    tvm_ffi.structural_walk(stmt, (tirx.For, found.append), order="post")
    return found
