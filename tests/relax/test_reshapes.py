"""sink_reshapes: the reshape back after a flattened matmul moves below the elementwise ops, norms
and softmax that follow, so FuseOps puts them into the matmul's kernel; the module computes the
same values (CPU build)."""

import pathlib
import re

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import relax as R

from fastdlight.analysis.attention import match_attention
from fastdlight.arch import CUDA
from fastdlight.relax import for_inference, prepare, reshapes
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.relax.reshapes import merge_reshapes, output_reshape_views, sink_reshapes

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
H100 = CUDA("nvidia/nvidia-h100")


@tvm.script.ir_module
class Layer:
    @R.function
    def main(x: R.Tensor((2, 8, 16), "float32"), w1: R.Tensor((16, 32), "float32"), b1: R.Tensor((32,), "float32"),
             w2: R.Tensor((32, 16), "float32"), g: R.Tensor((16,), "float32"), q: R.Tensor((2, 4, 8, 8), "float32"),
             k: R.Tensor((2, 4, 8, 8), "float32"), qkv: R.Tensor((2, 8, 24), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([16, 16]))
            h = R.matmul(a, w1)
            h3 = R.reshape(h, R.shape([2, 8, 32]))
            h3 = R.nn.gelu(R.add(h3, b1))
            h2 = R.reshape(h3, R.shape([16, 32]))
            o = R.matmul(h2, w2)
            o3 = R.reshape(o, R.shape([2, 8, 16]))
            r = R.add(x, o3)
            n = R.nn.layer_norm(r, g, g, axes=[-1])
            qf = R.reshape(q, R.shape([8, 8, 8]))
            kf = R.reshape(R.permute_dims(k, [0, 1, 3, 2]), R.shape([8, 8, 8]))
            s = R.reshape(R.matmul(qf, kf), R.shape([2, 4, 8, 8]))
            p = R.nn.softmax(R.multiply(s, R.const(0.125, "float32")), axis=-1)
            heads = R.permute_dims(R.reshape(qkv, R.shape([2, 8, 3, 2, 4])), [2, 0, 3, 1, 4])
            kk = R.squeeze(R.strided_slice(heads, [0], [1], [2]), [0])  # attention's K from a fused QKV
            out = (n, p, kk)
            R.output(out)
        return out


def run_cpu(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return [t.numpy() for t in vm["main"](*[tvm.runtime.tensor(a) for a in args])]


def ops_feeding_matmul_outputs(mod) -> list[str]:
    """The op right after each matmul."""
    func = mod["main"]
    values = relax.analysis.get_var2val(func)
    after = []
    for var, value in values.items():
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name != "relax.matmul":
            for arg in value.args:
                producer = values.get(arg)
                if isinstance(producer, relax.Call) and getattr(producer.op, "name", "") == "relax.matmul":
                    after.append(value.op.name)
    return sorted(after)


def sliced_permutes(mod) -> int:
    values = relax.analysis.get_var2val(mod["main"])

    def is_op(expr, name):
        expr = values.get(expr, expr)
        return isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == name

    return sum(is_op(v, "relax.strided_slice") and is_op(v.args[0], "relax.permute_dims") for v in values.values())


def test_the_reshapes_move_below_the_elementwise_ops_and_the_values_stay():
    sunk = sink_reshapes()(Layer)
    assert ops_feeding_matmul_outputs(Layer).count("relax.reshape") == 3
    assert "relax.reshape" not in ops_feeding_matmul_outputs(sunk)  # bias, residual, scale follow directly
    assert not sliced_permutes(sunk) and sliced_permutes(Layer) == 1  # the slice moved before the permute
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in Layer["main"].params]
    for want, got in zip(run_cpu(Layer, args), run_cpu(sunk, args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_flattening_reshape_stays_where_it_is():
    @tvm.script.ir_module
    class Flat:
        @R.function
        def main(x: R.Tensor((2, 8, 16), "float32"), y: R.Tensor((16, 16), "float32")):
            with R.dataflow():
                out = R.add(R.reshape(x, R.shape([16, 16])), y)
                R.output(out)
            return out

    sunk = sink_reshapes()(Flat)
    assert tvm_ffi.structural_equal(sunk["main"], Flat["main"])


def test_a_decoder_layer_fuses_bias_activation_residual_and_attention_scale_into_its_matmuls():
    mod = for_inference(tvm.script.from_source((FIXTURES / "decoder_ln.py").read_text()))
    funcs = prim_funcs(prepare(H100.target, fuse_attention=False)(mod))
    names = list(funcs)
    matmuls = [n for n in names if "matmul" in n]
    assert any("gelu" in n and "add" in n for n in matmuls), matmuls  # FFN up: bias + GELU
    assert any("multiply" in n for n in matmuls), matmuls  # attention's 1/sqrt(d)
    assert sum(re.sub(r"_view\d*$", "", n).endswith("_add") for n in matmuls) >= 2, matmuls  # the two residual adds
    assert not [n for n in names if "gelu" in n and "matmul" not in n]
    (softmax,) = [f for n, f in funcs.items() if "softmax" in n]  # reads fp16 scores, writes fp16
    assert [str(p.dtype) for p in softmax.params] == ["float16", "float16"]
    # with the fused template (the default on Hopper) attention is one function, scale and all
    fused = prim_funcs(prepare(H100.target)(mod))
    assert [n for n, f in fused.items() if match_attention(f) is not None] == ["attention"]
    assert not [n for n in fused if "softmax" in n]
    assert any("gelu" in n and "add" in n for n in fused if "matmul" in n)


@tvm.script.ir_module
class OutputReshape:
    @R.function
    def main(x: R.Tensor((8, 4), "float32"), y: R.Tensor((8, 4), "float32")):
        with R.dataflow():
            s = R.add(x, y)
            out = R.reshape(s, (2, 4, 4))  # a computed value, returned reshaped: a view
            back = R.reshape(x, (32,))  # a parameter, returned reshaped: stays a copy
            R.output(out, back)
        return (out, back)


def _reshape_kernels(mod) -> int:
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            if relax.analysis.has_reshape_pattern(mod[expr.args[0]]):
                calls.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return len(calls)


def test_a_reshape_the_model_returns_becomes_a_view_of_a_computed_value():
    legal = relax.transform.LegalizeOps()(OutputReshape)
    stock = relax.transform.RewriteDataflowReshape()(legal)
    ours = relax.transform.RewriteDataflowReshape()(output_reshape_views()(legal))
    assert _reshape_kernels(stock) == 2  # TVM keeps both outputs' reshapes as kernels
    assert _reshape_kernels(ours) == 1  # the parameter's reshape stays a copy

    # built and run twice (the memory planner must not hand the view's storage to a later call)
    with tvm.transform.PassContext(opt_level=3):
        ex = tvm.compile(output_reshape_views()(legal), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x, y = (np.random.default_rng(i).standard_normal((8, 4)).astype("float32") for i in range(2))
    first = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y))
    second = vm["main"](tvm.runtime.tensor(y), tvm.runtime.tensor(y))
    np.testing.assert_allclose(first[0].numpy(), (x + y).reshape(2, 4, 4))
    np.testing.assert_allclose(second[0].numpy(), (y + y).reshape(2, 4, 4))
    np.testing.assert_allclose(first[1].numpy(), x.reshape(32))


@tvm.script.ir_module
class Chains:
    @R.function
    def main(x: R.Tensor((2, 4, 16), "float32")):
        with R.dataflow():
            same = R.reshape(R.reshape(x, R.shape([8, 16])), R.shape([2, 4, 16]))  # around a replaced matmul
            other = R.reshape(R.reshape(x, R.shape([8, 16])), R.shape([4, 32]))
            out = (R.add(same, same), other)
            R.output(out)
        return out


def test_reshape_chains_become_one_reshape_or_none():
    merged = merge_reshapes()(Chains)
    values = relax.analysis.get_var2val(merged["main"])
    reshapes = [v for v in values.values() if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.reshape"]
    assert len(reshapes) == 1 and reshapes[0].args[0].same_as(merged["main"].params[0])
    x = np.random.default_rng(0).standard_normal((2, 4, 16)).astype("float32")
    for want, got in zip(run_cpu(Chains, [x]), run_cpu(merged, [x])):
        np.testing.assert_allclose(got, want)


def test_each_op_belongs_to_one_rule_so_one_pattern_can_serve_them_all():
    """A round matches every rule's pattern at once and hands each match to a rule by its op: a
    rule whose ops another rule also roots would never see its matches."""
    rules = [rule(reshapes._Bindings()) for rule in reshapes.RULES]
    ops = [set(reshapes._root_ops(pattern)) for pattern, _ in rules]
    assert all(ops)
    flat = [op for rule_ops in ops for op in rule_ops]
    assert len(flat) == len(set(flat)), flat
