"""Models as exported, through ``for_inference`` and ``prepare``: clips (ReLU6, hardtanh,
hardswish, clamp), ops without a mixed-precision policy after fp16 values, squeezes with negative
axes in convolution models, convolution biases added at a batch > 1, integer inputs with
``fp16_io`` (CPU, no torch)."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from fastdlight.relax import for_inference, prepare
from fastdlight.relax.compat import clips_as_bounds, squeeze_axes
from fastdlight.relax.pipeline import prim_funcs

H100 = "nvidia/nvidia-h100"


def run_cpu(mod, args):
    """``main``'s first output (numpy) from an LLVM build."""
    out = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


def op_names(mod) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(getattr(e.op, "name", ""))
                                    if isinstance(e, relax.Call) else None)
    return names


def conv_then(activation, batch: int = 1):
    """``activation(conv2d(x, w))``, NCHW fp32, as the torch importer writes it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 16, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((32, 16, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
            out = bb.emit_output(activation(bb, y))
        bb.emit_func_output(out)
    return bb.get()


def hardswish(bb, x):
    """torch's hardswish as the importer writes it: ``x * clip(x + 3, 0, 6) / 6``."""
    clipped = bb.emit(relax.op.clip(relax.op.add(x, relax.const(3.0, "float32")), 0, 6))
    return relax.op.multiply(x, relax.op.divide(clipped, relax.const(6.0, "float32")))


ACTIVATIONS = {
    "relu6": lambda bb, x: relax.op.nn.relu6(x),
    "hardtanh": lambda bb, x: relax.op.clip(x, -1.0, 1.0),
    "hardswish": hardswish,
    "clamp_min": lambda bb, x: relax.op.clip(x, 0.5, math.inf),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_clips_after_a_convolution_go_through_for_inference_and_prepare(name):
    mod = conv_then(ACTIVATIONS[name])
    half = for_inference(mod, fp16_io=True)
    assert "relax.clip" not in op_names(half)
    main = half["main"]
    assert [str(p.ty.dtype) for p in main.params] == ["float16", "float16"] and str(main.ret_ty.dtype) == "float16"
    prepared = prepare(H100)(half)
    assert any("conv2d" in n for n in prim_funcs(prepared))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 16, 8, 8)).astype("float16"), rng.standard_normal((32, 16, 3, 3)).astype("float16")
    want = run_cpu(mod, [x.astype("float32"), w.astype("float32")])
    got = run_cpu(half, [x, w]).astype("float32")
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_a_clip_is_bounded_by_constants_of_its_dtype_without_its_infinite_side():
    mod = conv_then(lambda bb, x: relax.op.clip(x, -math.inf, 6))
    ops = op_names(clips_as_bounds()(mod))
    assert "relax.clip" not in ops and "relax.minimum" in ops and "relax.maximum" not in ops
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((1, 16, 8, 8)).astype("float32") * 4, rng.standard_normal((32, 16, 3, 3)).astype("float32")]
    for activation in ACTIVATIONS.values():
        mod = conv_then(activation)
        np.testing.assert_array_equal(run_cpu(clips_as_bounds()(mod), args), run_cpu(mod, args))


def test_an_op_without_a_precision_policy_after_an_fp16_value_keeps_its_arguments():
    @I.ir_module
    class Masked:
        @R.function
        def main(x: R.Tensor((16, 16), "float32"), w: R.Tensor((16, 16), "float32")):
            with R.dataflow():
                y = R.triu(R.matmul(x, w), 1)  # fp16 out of the matmul; triu's k is a PrimValue
                R.output(y)
            return y

    half = for_inference(Masked, fp16_io=True)
    assert "relax.triu" in op_names(half)
    prepare(H100)(half)
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((16, 16)).astype("float16") for _ in range(2))
    want = run_cpu(Masked, [x.astype("float32"), w.astype("float32")])
    np.testing.assert_allclose(run_cpu(half, [x, w]).astype("float32"), want, rtol=1e-2, atol=1e-2)
    # where nothing was narrowed, the guarding casts go again
    assert "relax.astype" not in op_names(for_inference(Masked, fp16=False))


def test_a_negative_squeeze_axis_in_a_convolution_model_is_counted_from_the_front():
    """ViT's ``unsqueeze(0).transpose(0, -2).squeeze(-2)`` of its QKV: ConvertLayout runs out of
    memory on the negative axis."""

    def squeezed(bb, y):
        return relax.op.squeeze(relax.op.permute_dims(relax.op.expand_dims(y, [0]), [2, 1, 0, 3, 4]), [-3])

    mod = conv_then(squeezed)
    axes = [[int(a) for a in c.attrs.axis] for c in _calls(squeeze_axes()(mod), "relax.squeeze")]
    assert axes == [[2]]
    half = for_inference(mod, fp16_io=True)
    prepare(H100)(half)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 16, 8, 8)).astype("float16"), rng.standard_normal((32, 16, 3, 3)).astype("float16")
    want = run_cpu(mod, [x.astype("float32"), w.astype("float32")])
    np.testing.assert_allclose(run_cpu(half, [x, w]).astype("float32"), want, rtol=2e-2, atol=2e-2)


def _calls(mod, op):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call)
                                    and getattr(e.op, "name", "") == op else None)
    return found


def test_integer_inputs_keep_their_dtype_with_fp16_io():
    @I.ir_module
    class Embed:
        @R.function
        def main(ids: R.Tensor((2, 8), "int64"), keep: R.Tensor((2, 8), "bool"), x: R.Tensor((2, 8, 16), "float32"),
                 table: R.Tensor((100, 16), "float32")):
            with R.dataflow():
                e = R.take(table, ids, axis=0)
                y = R.add(e, x)
                z = R.where(R.expand_dims(keep, [-1]), y, R.zeros_like(y))
                R.output(z)
            return z

    rng = np.random.default_rng(0)
    table = rng.standard_normal((100, 16)).astype("float32")
    half = for_inference(Embed, [tvm.runtime.tensor(table)], fp16_io=True)
    main = half["main"]
    assert [str(p.ty.dtype) for p in main.params] == ["int64", "bool", "float16"]
    assert str(main.ret_ty.dtype) == "float16"
    prepare(H100)(half)
    ids = rng.integers(0, 100, (2, 8)).astype("int64")
    keep = rng.integers(0, 2, (2, 8)).astype("bool")
    x = rng.standard_normal((2, 8, 16)).astype("float16")
    want = run_cpu(Embed, [ids, keep, x.astype("float32"), table])
    np.testing.assert_allclose(run_cpu(half, [ids, keep, x]).astype("float32"), want, rtol=2e-3, atol=2e-3)


def test_a_bool_cumsum_counts_in_int32_with_the_same_truth_values():
    @I.ir_module
    class Mask:  # Hugging Face's mask code, as TVM imports it (the bool dtype kept)
        @R.function
        def main(keep: R.Tensor((2, 64), "bool")):
            with R.dataflow():
                seen = R.cumsum(keep, axis=-1)
                R.output(seen)
            return seen

    rewritten = for_inference(Mask, [])
    calls = [str(c.op.name) for c in _op_calls(rewritten["main"])]
    assert "relax.cumsum" in calls and rewritten["main"].ret_ty.dtype == "bool"
    assert all(str(c.args[0].ty.dtype) == "int32" for c in _op_calls(rewritten["main"]) if c.op.name == "relax.cumsum")
    scans = [f for name, f in prim_funcs(prepare(H100)(rewritten)).items() if "cumsum" in name]
    assert scans and all(str(p.dtype) != "bool" for f in scans for p in f.params if hasattr(p, "shape"))
    keep = np.random.default_rng(0).random((2, 64)) < 0.1
    np.testing.assert_array_equal(run_cpu(rewritten, [keep]), np.cumsum(keep, axis=-1) > 0)


def test_an_integer_power_is_a_product_after_for_inference_so_a_negative_base_stays_finite():
    @I.ir_module
    class Gelu:  # the cube of GPT-2's tanh GELU, as TVM imports it
        @R.function
        def main(x: R.Tensor((4, 64), "float32")):
            with R.dataflow():
                cube = R.power(x, R.const(3.0, "float32"))
                half = R.power(x, R.const(0.5, "float32"))
                y = R.add(cube, half)
                R.output(y)
            return y

    rewritten = for_inference(Gelu, [], fp16=True)  # ToMixedPrecision casts the exponent
    powers = [c for c in _op_calls(rewritten["main"]) if c.op.name == "relax.power"]
    assert len(powers) == 1  # the 0.5 power; the cube is products
    x = np.random.default_rng(0).uniform(-2, 2, (4, 64)).astype("float32")
    got = run_cpu(rewritten, [x]).astype("float32")
    with np.errstate(invalid="ignore"):
        want = x**3 + np.sqrt(x)
    np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3, equal_nan=True)


def test_cast_scalar_constants_are_folded_into_the_kernels_as_immediates():
    @I.ir_module
    class Gelu:  # GPT-2's tanh GELU on a projection, as TVM imports it (fp32 constants)
        @R.function
        def main(x: R.Tensor((64, 128), "float32"), w: R.Tensor((128, 256), "float32")):
            with R.dataflow():
                h = R.matmul(x, w)
                inner = R.multiply(R.add(h, R.multiply(R.power(h, R.const(3.0, "float32")),
                                                       R.const(0.044715, "float32"))), R.const(0.7978846, "float32"))
                y = R.multiply(R.multiply(h, R.const(0.5, "float32")), R.add(R.tanh(inner), R.const(1.0, "float32")))
                R.output(y)
            return y

    half = for_inference(Gelu, [], fp16=True)
    casts = [c for c in _op_calls(half["main"]) if c.op.name == "relax.astype"
             and isinstance(c.args[0], tvm.ir.expr.Constant)]
    assert casts == []
    funcs = prim_funcs(prepare(H100)(half))
    assert not [f for f in funcs.values() for p in f.params if hasattr(p, "shape") and len(p.shape) == 0]
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (64, 128)).astype("float32"), rng.uniform(-0.2, 0.2, (128, 256)).astype("float32")
    want = run_cpu(Gelu, [x, w])
    np.testing.assert_allclose(run_cpu(half, [x, w]).astype("float32"), want, rtol=2e-2, atol=2e-2)


def _op_calls(func) -> list:
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(e) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return found


def squeeze_excitation(batch: int):
    """A squeeze-excitation block as ``torch.export`` writes it: each 1x1 convolution's bias
    ``reshape(b, [1, C, 1, 1])`` added to its ``[batch, C, 1, 1]`` output."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 32, 14, 14), "float32"))
    w1, b1 = relax.Var("w1", relax.TensorType((8, 32, 1, 1), "float32")), relax.Var("b1", relax.TensorType((8,), "float32"))
    w2, b2 = relax.Var("w2", relax.TensorType((32, 8, 1, 1), "float32")), relax.Var("b2", relax.TensorType((32,), "float32"))
    with bb.function("main", [x, w1, b1, w2, b2]):
        with bb.dataflow():
            pooled = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True))
            s = bb.emit(relax.op.nn.conv2d(pooled, w1))
            s = bb.emit(relax.op.nn.silu(relax.op.add(s, bb.emit(relax.op.reshape(b1, [1, 8, 1, 1])))))
            s = bb.emit(relax.op.nn.conv2d(s, w2))
            s = bb.emit(relax.op.sigmoid(relax.op.add(s, bb.emit(relax.op.reshape(b2, [1, 32, 1, 1])))))
            out = bb.emit_output(relax.op.multiply(x, s))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("batch", [1, 16])
def test_a_convolution_bias_reshape_stays_with_the_bias(batch):
    """At batch 16, moving the bias's reshape below the add built ``reshape([16, 8, 1, 1] ->
    [8])``; at batch 1 (where the shapes allow it) it reshaped each convolution's output to
    ``[C]`` and back, which ConvertLayout then wrapped in transposes."""
    mod = squeeze_excitation(batch)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype("float32") * 0.3 for s in ((8, 32, 1, 1), (8,), (32, 8, 1, 1), (32,))]
    for kwargs in ({"fp16": False}, {"fp16_io": True}):
        ready = for_inference(mod, [tvm.runtime.tensor(w) for w in weights], **kwargs)
        values = relax.analysis.get_var2val(ready["main"])
        reshaped = [c.args[0] for c in _calls(ready, "relax.reshape")]
        assert not any(getattr(values.get(a), "op", None) is not None and "conv2d" in values[a].op.name
                       for a in reshaped), kwargs
        prepare(H100)(ready)
    x_value = rng.standard_normal((batch, 32, 14, 14)).astype("float32")
    want = run_cpu(mod, [x_value, *weights])
    got = run_cpu(for_inference(mod, [tvm.runtime.tensor(w) for w in weights], fp16=False), [x_value])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_exported_torch_block_with_relu6_hardswish_and_squeeze_excitation():
    torch = pytest.importorskip("torch")
    # TVM's torch frontend imports torch, which is optional
    from tvm.relax.frontend.torch import from_exported_program

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.expand, self.project = torch.nn.Conv2d(16, 64, 1), torch.nn.Conv2d(64, 16, 1)
            self.squeeze, self.excite = torch.nn.Conv2d(64, 8, 1), torch.nn.Conv2d(8, 64, 1)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.expand(x))
            s = torch.nn.functional.adaptive_avg_pool2d(y, 1)
            s = torch.nn.functional.hardsigmoid(self.excite(torch.nn.functional.hardswish(self.squeeze(s))))
            return x + self.project(y * s).clamp(-4.0, 4.0)

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(4, 16, 14, 14)
    with torch.no_grad():
        program, want = torch.export.export(model, (x,)), model(x).numpy()
    mod, params = relax.frontend.detach_params(from_exported_program(program, keep_params_as_input=True))
    half = for_inference(mod, params["main"], fp16_io=True)
    prepare(H100)(half)
    got = run_cpu(half, [x.numpy().astype("float16")]).astype("float32")
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
